"""Ctrl-C (SIGINT) and SIGTERM as one exception, so a command stops the way a failure stops.

Why an exception and not an exit in the handler: everything that writes an output already removes its
temporary file on any exception (format/writer.py's staged files, llm/bundle.py's temporary folder), and
`subprocess.run` kills its child on any exception; raising `Interrupted` lets those paths run. It derives
from BaseException and not from KeyboardInterrupt, so neither `except Exception` in a library nor
click's own KeyboardInterrupt handling (a blank line, then exit 130 for SIGINT only) swallows it.

The CLI (`mnntool.cli.main`) installs the handlers, then turns `Interrupted` into one line,
"interrupted", after stopping whatever children are left, and exit 128 + the signal (130, 143).
Importing mnntool installs nothing.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from contextlib import contextmanager

SIGNALS = (signal.SIGINT, signal.SIGTERM)
TEST_POINT = "MNNTOOL_TEST_POINT"       # tests only: see test_point()


class Interrupted(BaseException):
    """A signal asked the process to stop; `exit_code` is the shell's 128 + signal number."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.exit_code = 128 + signum


_pending: list[int] = []       # signals seen; only the first raises


def _raise(signum, frame):
    """The first signal raises Interrupted in the main thread; later ones are noted and ignored, so a
    second Ctrl-C cannot cut the cleanup the first one started (cleanup is bounded: children are killed,
    not waited for)."""
    _pending.append(signum)
    if len(_pending) == 1:
        raise Interrupted(signum)


def install() -> None:
    """SIGINT and SIGTERM raise Interrupted (main thread only, as Python requires)."""
    _pending.clear()
    for s in SIGNALS:
        signal.signal(s, _raise)


@contextmanager
def deferred():
    """Hold a signal that arrives inside the block until it ends (a commit that must not be cut in
    half: one output renamed into place, its companion not yet)."""
    held: list[int] = []
    old = {s: signal.getsignal(s) for s in SIGNALS}
    try:
        for s in SIGNALS:
            signal.signal(s, lambda signum, frame: held.append(signum))
    except ValueError:          # not the main thread: signals are delivered there anyway
        yield
        return
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if held and callable(old[held[0]]):
            old[held[0]](held[0], None)


def ignore_in_worker() -> None:
    """A pool worker's initializer: Ctrl-C at a terminal reaches the whole process group, and the
    parent, not each worker, decides what happens (it kills them). Without this every worker prints
    its own KeyboardInterrupt traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def stop_pool(ex) -> None:
    """Stop a concurrent.futures.ProcessPoolExecutor now: workers killed (a worker inside a long native
    call would not see a polite request), queued jobs cancelled, nothing waited for. Not joined: a
    worker killed halfway through sending its result leaves the executor's manager thread waiting for
    the rest forever, so the process must then leave by exit_now(), not through the interpreter's
    normal exit (which joins that thread)."""
    for p in list((getattr(ex, "_processes", None) or {}).values()):
        if p.is_alive():
            p.kill()
    ex.shutdown(wait=False, cancel_futures=True)


@contextmanager
def process_pool(workers: int):
    """A ProcessPoolExecutor of spawned workers (a forked child would inherit OpenMP and BLAS thread
    pools). An interrupt stops it at once (stop_pool); any other exception, a worker's error included,
    cancels the queued jobs and waits for the running ones (the process then exits normally); the end
    of the block shuts it down as `with` would."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    _quiet_resource_tracker()
    ex = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                             initializer=ignore_in_worker)
    try:
        yield ex
    except Interrupted:
        stop_pool(ex)
        raise
    except BaseException:
        ex.shutdown(wait=True, cancel_futures=True)
        raise
    ex.shutdown(wait=True)


def _quiet_resource_tracker() -> None:
    """multiprocessing's resource tracker (started with the first pool, from this environment) unlinks
    what a pool killed by an interrupt left and then warns about it on stderr ("leaked semaphore
    objects", seen about 1 run in 10): an interrupted command must end in one line, and the clean-up the
    warning reports is done. Its warnings only are filtered."""
    quiet = "ignore:::multiprocessing.resource_tracker"
    current = os.environ.get("PYTHONWARNINGS", "")
    if quiet not in current:
        os.environ["PYTHONWARNINGS"] = f"{current},{quiet}" if current else quiet


def say(fd: int, line: str) -> None:
    """One line written to a descriptor (1 or 2) after what the Python streams hold: on the way out of an
    interrupt, past any wrapper a progress display put around sys.stderr."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    try:
        os.write(fd, (line + "\n").encode())
    except OSError:
        pass


def exit_now(code: int) -> None:
    """Leave after an interrupt without the interpreter's exit, which would join threads a stopped pool
    left waiting (stop_pool). What that exit would have done that matters is done here: the output
    streams flushed, and multiprocessing's finalizers of priority >= 0 run (its semaphores unlinked, so
    its resource tracker finds nothing leaked) -- not those that join queue feeder threads."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    util = sys.modules.get("multiprocessing.util")
    if util is not None:
        try:
            util._run_finalizers(0)
        except Exception:      # noqa: BLE001 - best effort on the way out
            pass
    os._exit(code)


def children() -> list[int]:
    """Process ids whose parent is this process, from /proc (Linux); empty elsewhere."""
    me, out = os.getpid(), []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for pid in entries:
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()       # the name may hold spaces and brackets
        if int(fields[1]) == me and fields[0] != b"Z":
            out.append(int(pid))
    return out


def kill_children() -> None:
    """Kill what is left of this process's children (a pool's workers, an MNN child, multiprocessing's
    resource tracker) and reap them: an interrupted command leaves no process behind."""
    try:
        import multiprocessing
        for p in multiprocessing.active_children():
            p.kill()
    except Exception:      # noqa: BLE001 - best effort on the way out
        pass
    pids = [p for p in children() if p != _resource_tracker()]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    for pid in pids:
        try:
            os.waitpid(pid, 0)
        except OSError:         # not ours to reap (already reaped by its owner)
            pass


def _resource_tracker() -> int | None:
    """multiprocessing's resource tracker, left alone: it unlinks the pool's semaphores once this process
    has gone (it sees its pipe close), and exits then."""
    mod = sys.modules.get("multiprocessing.resource_tracker")
    return getattr(getattr(mod, "_resource_tracker", None), "_pid", None)


def test_point(name: str) -> None:
    """A named point of long work, for the interrupt tests (never set by users): when $MNNTOOL_TEST_POINT
    is `name`, print "test point: NAME" once to stderr (the test then knows work has started and
    signals); `name:stall` also waits there for a signal (a sleep loop, at most a minute), so a test
    can interrupt a step too short to catch, such as a temporary file being written."""
    want = os.environ.get(TEST_POINT)
    if not want or want.split(":")[0] != name or name in _announced:
        return
    _announced.add(name)
    print(f"test point: {name}", file=sys.stderr, flush=True)
    if want.endswith(":stall"):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(0.01)


_announced: set[str] = set()
