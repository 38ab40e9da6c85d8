"""--ray against a Ray cluster started the way its users start one: a head and a second raylet on
loopback (`ray start --head --node-ip-address 127.0.0.1 ...`, `ray start --address 127.0.0.1:PORT ...`),
each with its own temporary directory, token authentication on (a token file of the test's own, named by
RAY_AUTH_TOKEN_PATH), stopped by process group at the end, even on failure. `quant --int8 --calib --ray`,
`verify --calib --ray` and `llm eval --ray` there give the single process's file and numbers, byte for
byte; each failure to connect ends in one line naming its cause."""
from __future__ import annotations

import json
import subprocess
import sys
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pytest

from fixtures.ray_cluster import free_port
from tests.conftest import ROOT

ray = pytest.importorskip("ray")
onnx = pytest.importorskip("onnx")


@pytest.fixture(scope="module")
def cluster():
    """A head (GCS, client server) and a second raylet on 127.0.0.1, one CPU each (fixtures/ray_cluster.py);
    the driver's environment holds the token file only: it finds out itself that the cluster wants one."""
    from fixtures.ray_cluster import RAY, LoopbackCluster
    if not RAY.exists():
        pytest.skip("no `ray` command beside this Python")
    with LoopbackCluster(raylets=2, cpus=1) as c:
        yield c


def _cli(*args, env=None):
    p = subprocess.run([sys.executable, "-m", "mnntool", *map(str, args)], capture_output=True, text=True, cwd=ROOT,
                       env=env, timeout=300)
    return p.returncode, p.stdout, p.stderr


def _ok(*args, env=None) -> str:
    code, out, err = _cli(*args, env=env)
    assert code == 0, err[-3000:]
    return out


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A two-convolution ONNX model, its .mnn and a calibration folder of 12 samples."""
    from onnx import TensorProto as TP, helper as h, numpy_helper as nh
    root = tmp_path_factory.mktemp("model")
    rng = np.random.default_rng(0)
    w1 = nh.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3, "w1")
    w2 = nh.from_array(rng.standard_normal((4, 8, 3, 3)).astype(np.float32) * 0.3, "w2")
    g = h.make_graph([h.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["c"], ["r"]),
                      h.make_node("Conv", ["r", "w2"], ["y"], pads=[1, 1, 1, 1])],
                     "g", [h.make_tensor_value_info("x", TP.FLOAT, [1, 3, 16, 16])],
                     [h.make_tensor_value_info("y", TP.FLOAT, None)], initializer=[w1, w2])
    src = root / "m.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), src)
    import mnntool
    mnntool.convert(src, root / "m.mnn")
    calib = root / "calib"
    calib.mkdir()
    for k in range(12):
        np.save(calib / f"{k:02d}.npy", (rng.standard_normal((1, 3, 16, 16)) * (1 + k % 3)).astype(np.float32))
    return src, root / "m.mnn", calib


def test_quant_and_verify_on_the_cluster(cluster, model, tmp_path):
    """quant --ray HOST:PORT writes the single process's file; verify --ray auto (RAY_ADDRESS) reports
    its numbers; tasks ran on the second raylet too."""
    src, fp32, calib = model
    one, many = tmp_path / "one.mnn", tmp_path / "many.mnn"
    _ok("quant", fp32, one, "--int8", "--calib", calib)
    _ok("quant", fp32, many, "--int8", "--calib", calib, "--ray", cluster.address, env=cluster.driver_env())
    assert one.read_bytes() == many.read_bytes()
    # Ray places each task where it likes: some task of the calibration (the means' sums or a chunk's
    # statistics) ran on the second raylet
    ran = set(cluster.task_names(1))
    assert {"_collect_chunk", "_sample_sums", "_grids"} & ran, "no calibration task ran on the second raylet"
    # --outputs-only: an int8 layer may miss verify's per-layer 0.999 (exit 1); every number is still compared
    ref = _ok("verify", src, one, "--calib", calib, "--samples", 12, "--json", "--outputs-only")
    env = dict(cluster.driver_env(), RAY_ADDRESS=cluster.address)
    got = _ok("verify", src, one, "--calib", calib, "--samples", 12, "--json", "--outputs-only", "--ray", "auto",
              env=env)
    a, b = json.loads(ref), json.loads(got)
    assert a["samples"] == 12 and a == b


def test_llm_eval_on_the_cluster(cluster, tmp_path):
    """llm eval --ray ray://HOST:PORT (the head's client server) splits the windows: the same JSON as one
    process, perplexity and the KL statistics against a 16-bit bundle of the same checkpoint."""
    pytest.importorskip("MNN")
    from fixtures.llm_checkpoints import build_random
    from mnntool.llm.bundle import export
    from mnntool.llm.evaluate import evaluate
    src = build_random("qwen2", ROOT / "build" / "llm" / "checkpoints" / "qwen2")     # cached across runs
    export(src, tmp_path / "b8", bits=8, block=64)
    export(src, tmp_path / "b16", bits=16)
    text = tmp_path / "text.txt"
    text.write_text((Path(json.__file__).parent / "decoder.py").read_text()[:2500])
    one = evaluate(tmp_path / "b8", text, tmp_path / "b16", ctx=32)
    many = json.loads(_ok("llm", "eval", tmp_path / "b8", "--text", text, "--ref", tmp_path / "b16", "--ctx", 32,
                          "--json", "--ray", cluster.client_address, env=cluster.driver_env()))
    assert one["windows"] > 8 and 0 < one["kl_mean"] and json.loads(json.dumps(one)) == many
    assert "_shard" in cluster.task_names(0) + cluster.task_names(1)


def test_shared_values_resolved_once_per_worker(cluster, monkeypatch):
    """A job's shared argument reaches each worker process once and what a worker builds from it
    (shards.kept: calibration's Session) is built once for all its chunks, on local processes and on the
    cluster's raylets (through the GCS and through the client server); the merged result is exact and
    shards.timed records the parallel span."""
    import fixtures.ray_cluster as probe_module
    from fixtures.ray_cluster import Tally, kept_probe
    from mnntool.quant import shards
    from mnntool.quant.cluster import connected
    from mnntool.quant.data import ListReader
    samples = ListReader([{"x": np.array([k], np.int64)} for k in range(40)])
    big = np.arange(2 ** 18, dtype=np.float64)      # 2 MB: not a plain value, shared
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(cluster.token_path))
    from ray import cloudpickle
    cloudpickle.register_pickle_by_value(probe_module)     # the client server's workers cannot import fixtures/
    try:
        for workers, ray_address in ((2, None), (1, cluster.address), (1, cluster.client_address)):
            with connected(ray_address) if ray_address else nullcontext(), shards.pool(workers, ray_address) as on, \
                    shards.timed() as spans:
                got = shards.merge_on(on, kept_probe, samples, (big,), Tally())
            chunks = len(shards.sizes(40, on.workers))
            assert got.count == 40 and sum(v[2] for v in got.by_pid.values()) == sum(range(40))
            assert sum(v[0] for v in got.by_pid.values()) == chunks
            assert all(v[1] == 1 for v in got.by_pid.values()), got.by_pid     # one build a worker, not a chunk
            assert any(v[0] > 1 for v in got.by_pid.values())                   # some worker ran several chunks
            assert [(s["fn"], s["tasks"]) for s in spans] == [("kept_probe", chunks)]
    finally:
        cloudpickle.unregister_pickle_by_value(probe_module)


# ------------------------------------------------------------------------------------------- failures

def _one_line(code, out, err, *needles):
    lines = [ln for ln in err.strip().splitlines() if "device supports" not in ln]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in err, err[-2000:]
    for n in needles:
        assert n in lines[0], (n, lines[0])


def _connect_error(address: str) -> str:
    from mnntool.errors import MnnToolError
    from mnntool.quant.cluster import connected
    with pytest.raises(MnnToolError) as e:
        with connected(address):
            pass
    assert "\n" not in str(e.value)
    return str(e.value)


def test_wrong_or_missing_token(cluster, model, tmp_path, monkeypatch):
    """A token that is not the head's, on the GCS and on the client server; none at all (HOME without
    ~/.ray/auth_token); the CLI says it in one line and exits 2, leaving no file."""
    src, fp32, calib = model
    env = dict(cluster.driver_env(), RAY_AUTH_TOKEN="0" * 64)
    _one_line(*_cli("quant", fp32, tmp_path / "o.mnn", "--int8", "--calib", calib, "--ray", cluster.address,
                    env=env), "refused the token from RAY_AUTH_TOKEN", "token mismatch")
    assert not (tmp_path / "o.mnn").exists()
    for var in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE", "RAY_ADDRESS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RAY_AUTH_TOKEN", "0" * 64)
    assert "token mismatch" in _connect_error(cluster.client_address)
    monkeypatch.delenv("RAY_AUTH_TOKEN")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert "wants a token" in _connect_error(cluster.address)
    monkeypatch.setenv("RAY_AUTH_TOKEN", cluster.token)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert "RAY_AUTH_MODE=disabled" in _connect_error(cluster.address)


def test_version_mismatch(cluster, monkeypatch):
    """A driver of another Ray version (ray.__version__ as another release would have it) is told which
    versions differ, before Ray's own 20 s of retries."""
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(cluster.token_path))
    real = ray.__version__
    monkeypatch.setattr(ray, "__version__", "2.59.0")
    msg = _connect_error(cluster.address)
    assert f"version mismatch: the cluster runs Ray {real}" in msg and "this machine Ray 2.59.0" in msg


def test_wrong_ports():
    """Nothing listening, no client server where ray:// points, a malformed address: each one line (from the
    probes, not after Ray's own 20-30 s of retries)."""
    free = free_port()
    assert "nothing listening at 127.0.0.1" in _connect_error(f"127.0.0.1:{free}")
    assert "no Ray client server at 127.0.0.1" in _connect_error(f"ray://127.0.0.1:{free}")
    assert "expected local, auto" in _connect_error("127.0.0.1")


def test_service_on_the_wrong_port(cluster, monkeypatch):
    """A GCS port given as a client server's (ray://) and the reverse."""
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(cluster.token_path))
    assert "not as a Ray client server" in _connect_error(f"ray://{cluster.address}")
    assert "not as a Ray GCS" in _connect_error(f"127.0.0.1:{cluster.client_port}")


def test_no_raylet_on_this_machine(cluster, monkeypatch):
    """HOST:PORT joins through a raylet on the driver's machine; where Ray's own scan finds none (as on a
    laptop outside the cluster), one line says so and names ray:// instead of Ray's 30 s wait."""
    import ray._private.services as services
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(cluster.token_path))
    monkeypatch.setattr(services, "find_node_ids", set)
    msg = _connect_error(cluster.address)
    assert "needs a Ray node on this machine" in msg and "ray://127.0.0.1:10001" in msg


def test_one_line_from_the_cli_without_a_cluster(model, tmp_path):
    src, fp32, calib = model
    _one_line(*_cli("quant", fp32, tmp_path / "o.mnn", "--int8", "--calib", calib, "--ray",
                    f"ray://127.0.0.1:{free_port()}"), "no Ray client server", "--ray-client-server-port")
    assert not (tmp_path / "o.mnn").exists()


class _FlakyRay:
    """A Ray whose client server fails to start `fails` times, then connects."""

    def __init__(self, fails: int, text: str = "Initialization failure from server: Traceback ..."):
        self.fails, self.text, self.inits, self.shut = fails, text, 0, 0

    def is_initialized(self):
        return False

    def init(self, **kw):
        self.inits += 1
        if self.inits <= self.fails:
            raise ConnectionAbortedError(self.text)

    def shutdown(self):
        self.shut += 1


def test_client_server_start_failure_is_tried_again(monkeypatch):
    """A busy head's per-client server that fails to start is a transient: tried again (at most
    CLIENT_STARTS times); any other failure, or a GCS address, fails at once with one line."""
    from mnntool.errors import MnnToolError
    from mnntool.quant import cluster
    monkeypatch.setattr(cluster, "_settings", lambda a: {})
    monkeypatch.setattr(cluster.time, "sleep", lambda s: None)
    for fails, ok in ((cluster.CLIENT_STARTS - 1, True), (cluster.CLIENT_STARTS, False)):
        fake = _FlakyRay(fails)
        monkeypatch.setattr(cluster, "ray_module", lambda fake=fake: fake)
        if ok:
            with cluster.connected("ray://127.0.0.1:1") as r:
                assert r is fake
            assert (fake.inits, fake.shut) == (fails + 1, 1)
        else:
            with pytest.raises(MnnToolError, match="could not connect"), cluster.connected("ray://127.0.0.1:1"):
                pass
            assert fake.inits == cluster.CLIENT_STARTS
    other = _FlakyRay(1, "Connection refused")
    monkeypatch.setattr(cluster, "ray_module", lambda: other)
    with pytest.raises(MnnToolError), cluster.connected("ray://127.0.0.1:1"):
        pass
    assert other.inits == 1
