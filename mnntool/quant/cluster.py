"""Connecting to Ray for `--ray ADDRESS`, and saying in one line why not.

ADDRESS is what `ray.init` takes: `local` (a Ray started here for the call), `auto` (RAY_ADDRESS, else the
cluster `ray start` last started on this machine), `HOST:PORT` (a head's GCS, joined through a Ray node
running on this machine) or `ray://HOST[:PORT]` (a head's client server, port 10001 unless told).

Why a module of its own: Ray's own failures here are slow and say little. A client port with nothing
behind it waits 30 s and says "ray client connection timeout"; a GCS that wants a token (Ray 2.60 turns
token authentication on for every cluster `ray start --head` makes when ~/.ray/auth_token exists, and for
every `ray.init()`, which writes that file) retries for 20 s and says "Failed to connect to Ray cluster at"
an address the user never typed (Ray maps 127.0.0.1 to the machine's outward address in `ray start`,
`ray.init` and `_node_ip_address` alike, so the cluster's nodes are registered under it and the driver
must follow; the GCS listens on every interface). So before `ray.init` we knock on the port (TCP), ask
the service one cheap question over gRPC without a token and, if it says UNAUTHENTICATED, with the token
Ray would read (RAY_AUTH_TOKEN, else the file RAY_AUTH_TOKEN_PATH names, else ~/.ray/auth_token), and
compare the cluster's Ray and Python versions with ours (stored in the GCS). Each answer maps to one
line naming the cause and what to check. The driver's RAY_AUTH_MODE is then set to what the cluster
does (a driver in token mode refuses its workers' calls when the cluster runs without tokens; one
without, the other way round), unless the user set it, and restored when the block ends.

`local` never writes ~/.ray/auth_token: without a token anywhere, the Ray started for the call gets a
random one through RAY_AUTH_TOKEN for its lifetime (its GCS listens on every interface).
"""
from __future__ import annotations

import json
import os
import re
import secrets
import socket
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..errors import MnnToolError

PROBE_S = 3.0               # seconds per probe: a live GCS or client server answers in milliseconds
CLIENT_PORT = 10001         # ray start --head's --ray-client-server-port default
AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
FORMS = "local, auto, HOST:PORT (a head's GCS) or ray://HOST[:PORT] (its client server)"


@dataclass(frozen=True)
class Address:
    given: str              # as typed after --ray
    kind: str               # "local", "gcs" or "client"
    host: str = ""
    port: int = 0

    @property
    def hostport(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """What ray.init is given."""
        return "local" if self.kind == "local" else ("ray://" if self.kind == "client" else "") + self.hostport


def parse(address: str) -> Address:
    """`--ray ADDRESS` as an Address; `auto` resolved as ray.init resolves it."""
    text = address.strip()
    if text == "local":
        return Address(text, "local")
    if text == "auto":
        return _hostport(address, _auto())
    return _hostport(address, text)


def _auto() -> str:
    env = os.environ.get("RAY_ADDRESS", "").strip()
    if env and env != "auto":
        return env
    from ray._private.services import get_ray_address_from_environment
    try:
        found = get_ray_address_from_environment("auto", None)
    except ConnectionError:
        found = None
    if not found or found == "auto":
        raise MnnToolError("--ray auto: no Ray cluster runs on this machine and RAY_ADDRESS is not set (start "
                           "one with `ray start --head`, or give its address: --ray HOST:PORT)")
    return found


def _hostport(given: str, text: str) -> Address:
    kind = "client" if text.startswith("ray://") else "gcs"
    rest = text[len("ray://"):] if kind == "client" else text
    host, sep, port = rest.rpartition(":")
    if not sep or host.endswith(":"):               # no port, or a bare IPv6 address
        host, port = rest, str(CLIENT_PORT) if kind == "client" else ""
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536 or "/" in host:
        where = f" (from {text})" if text != given else ""
        raise MnnToolError(f"--ray {given}{where}: expected {FORMS}")
    return Address(given, kind, host, int(port))


# --------------------------------------------------------------------------------------------- tokens

def token() -> tuple[str | None, str]:
    """(the token Ray would send, where it came from), in Ray's order: RAY_AUTH_TOKEN, the file
    RAY_AUTH_TOKEN_PATH names, ~/.ray/auth_token."""
    if os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return os.environ["RAY_AUTH_TOKEN"].strip(), "RAY_AUTH_TOKEN"
    path = os.environ.get("RAY_AUTH_TOKEN_PATH", "").strip()
    if path:
        try:
            return Path(path).expanduser().read_text().strip(), f"RAY_AUTH_TOKEN_PATH ({path})"
        except OSError as e:
            raise MnnToolError(f"RAY_AUTH_TOKEN_PATH={path}: cannot read the token ({e.strerror})") from None
    default = Path.home() / ".ray" / "auth_token"
    if default.is_file():
        return default.read_text().strip(), str(default)
    return None, ""


# --------------------------------------------------------------------------------------------- probes

def _knock(a: Address) -> None:
    """Something listens on the port, or one line saying nothing does."""
    try:
        socket.create_connection((a.host, a.port), timeout=PROBE_S).close()
    except OSError as e:
        why = e.strerror or type(e).__name__
        if a.kind == "client":
            raise MnnToolError(f"--ray {a.given}: no Ray client server at {a.hostport} ({why}): `ray start --head` "
                               f"starts one on its --ray-client-server-port (default {CLIENT_PORT}); check the "
                               "head runs, the port and the firewall") from None
        raise MnnToolError(f"--ray {a.given}: nothing listening at {a.hostport} ({why}): start the head there "
                           f"(`ray start --head --port {a.port}`), or check the host, the port and the firewall") from None


def _ask(a: Address, tok: str | None) -> tuple[str, bytes]:
    """One cheap gRPC call: the GCS's cluster metadata, or the client server's ping. (status name, reply)."""
    import grpc
    metadata = [("authorization", f"Bearer {tok}")] if tok else None
    channel = grpc.insecure_channel(a.hostport)
    try:
        if a.kind == "gcs":
            from ray.core.generated import gcs_service_pb2 as pb, gcs_service_pb2_grpc as rpc
            reply = rpc.InternalKVGcsServiceStub(channel).InternalKVGet(
                pb.InternalKVGetRequest(key=b"CLUSTER_METADATA", namespace=b"cluster"),
                timeout=PROBE_S, metadata=metadata)
            return "OK", reply.value
        from ray.core.generated import ray_client_pb2 as pb, ray_client_pb2_grpc as rpc
        rpc.RayletDriverStub(channel).ClusterInfo(pb.ClusterInfoRequest(type=pb.ClusterInfoType.PING),
                                                  timeout=PROBE_S, metadata=metadata)
        return "OK", b""
    except grpc.RpcError as e:
        return e.code().name, b""
    finally:
        channel.close()


def _service(a: Address) -> str:
    return "Ray client server" if a.kind == "client" else "Ray GCS"


def _not_ray(a: Address, status: str) -> MnnToolError:
    if a.kind == "client":
        hint = f"the head's GCS port? give it without ray://: --ray {a.hostport}"
    else:
        hint = f"a client server's port? give it as --ray ray://{a.hostport}"
    return MnnToolError(f"--ray {a.given}: {a.hostport} answers but not as a {_service(a)} ({status}): {hint}")


def auth_mode(a: Address) -> str | None:
    """The RAY_AUTH_MODE the driver needs for this cluster ("token" or "disabled"), checking the token on
    the way; None where it cannot be asked (TLS)."""
    if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
        return None
    mode = os.environ.get("RAY_AUTH_MODE", "").strip().lower()
    status, reply = _ask(a, None)
    if status == "OK":             # no token asked: a token set here goes unused, as Ray itself would leave it
        if mode == "token":
            raise MnnToolError(f"--ray {a.given}: the cluster at {a.hostport} runs without token authentication "
                               "but RAY_AUTH_MODE=token here: unset it, or restart the cluster with RAY_AUTH_MODE=token")
        _versions(a, reply)
        return "disabled"
    if status != "UNAUTHENTICATED":
        raise _not_ray(a, status)
    tok, where = token()
    if mode == "disabled":
        raise MnnToolError(f"--ray {a.given}: the cluster at {a.hostport} wants a token (Ray token authentication) "
                           "but RAY_AUTH_MODE=disabled here: unset it and set RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH")
    if tok is None:
        raise MnnToolError(f"--ray {a.given}: the cluster at {a.hostport} wants a token (Ray token authentication) "
                           "and none is set: set RAY_AUTH_TOKEN, or RAY_AUTH_TOKEN_PATH to a file holding it (the "
                           "head's: `ray get-auth-token` there)")
    status, reply = _ask(a, tok)
    if status == "UNAUTHENTICATED":
        raise MnnToolError(f"--ray {a.given}: the cluster at {a.hostport} refused the token from {where} (token "
                           "mismatch): use the head's (`ray get-auth-token` there) in RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH")
    if status != "OK":
        raise _not_ray(a, status)
    _versions(a, reply)
    return "token"


def _versions(a: Address, reply: bytes) -> None:
    """The cluster's Ray and Python against ours, by Ray's own rule (ray.init would refuse them later)."""
    if not reply:
        return
    from ray._private.utils import check_version_info
    try:
        check_version_info(json.loads(reply), "this machine")
    except RuntimeError as e:
        raise MnnToolError(_version_line(a, str(e))) from None


def _version_line(a: Address, text: str) -> str:
    found = re.findall(r"Ray: (\S+)\s+Python: (\S+)", text)
    if len(found) == 2:
        (cr, cp), (mr, mp) = found
        return (f"--ray {a.given}: version mismatch: the cluster runs Ray {cr} on Python {cp}, this machine "
                f"Ray {mr} on Python {mp}: install the cluster's versions here (or the other way round)")
    return f"--ray {a.given}: version mismatch between this machine and the cluster ({' '.join(text.split())[:200]})"


def _local_node(a: Address) -> None:
    """HOST:PORT joins through a raylet on this machine (ray.init looks for one for 30 s otherwise)."""
    from ray._private.services import find_node_ids
    if not find_node_ids():
        raise MnnToolError(f"--ray {a.given}: joining a cluster by its GCS address needs a Ray node on this machine, "
                           f"and none runs here: `ray start --address {a.hostport}` here first, or connect through "
                           f"the head's client server: --ray ray://{a.host}:{CLIENT_PORT}")


# ------------------------------------------------------------------------------------------- session

def ray_module():
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")      # Ray reports usage to its makers unless told not to
    try:
        import ray
    except ImportError:
        raise MnnToolError("--ray needs Ray: pip install 'mnntool[ray]'") from None
    return ray


def _refresh_auth() -> None:
    """Ray caches the auth mode and token at import; reread them after the environment changed."""
    from ray._raylet import AuthenticationTokenLoader, Config
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


@contextmanager
def _auth_env(values: dict):
    """The auth variables set for the block (None: left as they are), restored after."""
    saved = {k: os.environ.get(k) for k in AUTH_VARS}
    changed = {k: v for k, v in values.items() if v is not None}
    os.environ.update(changed)
    if changed:
        _refresh_auth()
    try:
        yield
    finally:
        if {k: os.environ.get(k) for k in AUTH_VARS} != saved:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            _refresh_auth()


def _settings(a: Address) -> dict:
    """The auth variables the driver needs for `a` (checked against the cluster where it runs)."""
    user_mode = os.environ.get("RAY_AUTH_MODE", "").strip()
    if a.kind == "local":       # token mode (what ray.init picks, said here so Ray does not warn about it), with
        if user_mode:           # a random key when none is set: nothing written to ~/.ray
            return {}
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": None if token()[0] else secrets.token_hex(32)}
    _knock(a)
    mode = auth_mode(a)
    if a.kind == "gcs":
        _local_node(a)
    return {"RAY_AUTH_MODE": None if user_mode else mode}


def _failure(a: Address, e: BaseException) -> MnnToolError:
    """One line for what ray.init raised after the probes passed."""
    texts, seen = [], e
    while seen is not None and len(texts) < 8:
        texts.append(f"{type(seen).__name__}: {seen}")
        seen = seen.__cause__ or seen.__context__
    whole = "\n".join(texts)
    if "Version mismatch" in whole:
        return MnnToolError(_version_line(a, whole))
    if "InvalidAuthToken" in whole or "UNAUTHENTICATED" in whole.upper():
        return MnnToolError(f"--ray {a.given}: the cluster refused this driver's token (token mismatch): use the "
                            "head's (`ray get-auth-token` there) in RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH")
    where = "a new local instance" if a.kind == "local" else a.hostport
    return MnnToolError(f"--ray {a.given}: Ray could not connect to {where} ({' '.join(texts[0].split())[:200]})")


CLIENT_STARTS = 3       # tries of a ray:// connection whose per-client server failed to start


def _server_start_failed(a: Address, e: BaseException) -> bool:
    """The head's client proxier could not start this driver's own server in time ("Initialization failure
    from server"): a busy head's transient, which a second try a moment later gets past (seen once in a
    CI run of the loopback cluster test; a wrong address, token or version fails the same way every time)."""
    return a.kind == "client" and "Initialization failure from server" in str(e)


@contextmanager
def connected(address: str):
    """Ray connected to `address` for the block (the ray module is yielded); shut down after if this call
    connected it. A Ray already initialised in this process is used as it is."""
    ray = ray_module()
    if ray.is_initialized():
        yield ray
        return
    a = parse(address)
    with _auth_env(_settings(a)):
        for attempt in range(CLIENT_STARTS):
            try:
                ray.init(address=a.url, include_dashboard=False, log_to_driver=False, configure_logging=False)
                break
            except MnnToolError:
                raise
            except Exception as e:      # noqa: BLE001 - Ray's own errors are many; one line names the cause
                if not (_server_start_failed(a, e) and attempt + 1 < CLIENT_STARTS):
                    raise _failure(a, e) from None
                time.sleep(1.0 + attempt)
        try:
            yield ray
        finally:
            ray.shutdown()


def cpus(ray) -> int:
    """The cluster's CPUs (tasks that can run at once)."""
    return max(1, int(ray.cluster_resources().get("CPU", 1)))
