"""Thread thresholds measured on the host, not constants measured on one machine (issue 46: "choose kernels
by measurement on the host"). MNN picks among its kernels at run time; here the decision that varies most
from host to host is when a parallel kernel pays for waking its threads: the fixed cost of an OpenMP
region (wake, split, join) against the host's single-core speed. Both differ by CPU, by core count and by
thread count (a 4-thread region costs more than a 2-thread one; a Xeon's cores run the same kernel at
another speed than an EPYC's).

`parallel_min_work(threads)` is the work (in the kernels' element-operation units, kernels.sized) from
which a parallel kernel runs in parallel; below it, its serial twin. It is measured once per host and
thread count by timing one parallel kernel (the logistic function in blocks, ~4 operations an element)
against its serial twin at sizes from 2K to 1M elements, back to back as a run calls them (threads
spinning between calls): the smallest size at which the parallel kernel takes at most 0.8x the serial
time, times 4 (its work per element). `one_thread_below_flops(threads)`, below which a whole plan runs on
one thread (plan/threads.py), keeps its ratio to it (64x, as the defaults: 16 MFLOP to 250K).

The figures are kept in `host_tuning.json` beside the kernel library (aot.cache_dir(), keyed by CPU model,
core count and Numba version), measured at `mnntool compile-kernels` or at the first plan of a session at
that thread count (~0.1-0.5 s once; a host whose load average is above its core count is not measured:
the defaults serve until it is quiet). Overrides: MNNTOOL_PARALLEL_MIN_WORK and MNNTOOL_ONE_THREAD_BELOW_FLOPS
(numbers), MNNTOOL_HOST_TUNING=defaults (the constants below, no measuring; the test suite uses it, for
plans that do not depend on how loaded the machine is). `bench --json` reports what a run used.

The threshold is one number for every kernel; near it each step times its two forms where it runs and
keeps the faster (kernels/step_timing.py), so a kernel family that scales worse than the probe's falls
back per step."""
from __future__ import annotations

import json
import os
import threading

PARALLEL_MIN_WORK = 250_000         # the defaults: element operations (kernels.PARALLEL_MIN_WORK's value)
ONE_THREAD_BELOW_FLOPS = 16_000_000
FLOPS_PER_WORK = ONE_THREAD_BELOW_FLOPS / PARALLEL_MIN_WORK
SIZES = (2_048, 4_096, 8_192, 16_384, 32_768, 65_536, 131_072, 262_144, 524_288, 1_048_576)
WORK_PER_ELEMENT = 4                # sigmoid_blocks' work in sized() units (elementwise.py: size * 4)
GAIN = 0.8                          # parallel must take at most this share of the serial time
REPEATS = 9
BOUNDS = (16_384, 4_194_304)        # a measured threshold outside these is clamped (a very noisy host)

_lock = threading.Lock()
_known: dict[int, dict] = {}        # threads -> {"parallel_min_work", "source", ...}


def _mode() -> str:
    return os.environ.get("MNNTOOL_HOST_TUNING", "measure").strip().lower()


def env_number(name: str) -> int | None:
    """A non-negative number a tuning variable sets (None: unset); one clear error for anything else."""
    v = os.environ.get(name, "").strip()
    if not v:
        return None
    try:
        return max(0, int(float(v)))
    except ValueError:
        from ..errors import MnnToolError
        raise MnnToolError(f"{name}={v!r}: expected a number") from None


def _host_key() -> str:
    from .kernels.compile.host import _cpuinfo
    from .settings import cores
    info = _cpuinfo()
    try:
        import numba
        nb = numba.__version__
    except ImportError:
        nb = "none"
    return f"{info[0] if info else 'unknown cpu'}|{os.cpu_count()} cpus|{cores()} threads|numba {nb}"


def _path():
    from .kernels.compile.aot import cache_dir
    return cache_dir() / "host_tuning.json"


def _read_file() -> dict:
    try:
        return json.loads(_path().read_text()).get(_host_key(), {})
    except (OSError, ValueError, AttributeError):
        return {}


def _write_file(threads: int, entry: dict) -> None:
    """Adds the entry to the file whole (a temporary then a rename); a read-only install keeps it in memory."""
    path = _path()
    try:
        data = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        data = {}
    data.setdefault(_host_key(), {})[str(threads)] = entry
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError:
        pass


def _busy() -> bool:
    """Other work holds the cores (the load average, or the tasks running right now, above the core count):
    figures taken now say more about the neighbours than the host, so they serve this process only. The
    running count matters because the one-minute average lags: 15 jobs started a few seconds ago leave it
    near 0 while they hold every core (a threshold measured then made every later 4-thread session of the
    16-core Xeon run its convolutions on one thread)."""
    cpus = os.cpu_count() or 1
    try:
        if os.getloadavg()[0] > cpus:
            return True
    except OSError:
        pass
    try:
        with open("/proc/loadavg") as f:
            running = int(f.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return False
    return running - 1 > cpus // 2      # besides this process's own thread


_probe = None       # threads -> measured entry: kernels/thread_probe.measure, set when the kernels load


def use_probe(fn) -> None:
    """The measurement (runtime/kernels registers theirs: the kernels depend on these figures, so this
    module cannot import them)."""
    global _probe
    _probe = fn


def measure(threads: int) -> dict:
    """The probe's measurement at `threads`."""
    if _probe is None:
        return {"parallel_min_work": PARALLEL_MIN_WORK, "source": "defaults (no kernels loaded)"}
    return _probe(threads)


def _entry(threads: int) -> dict:
    if threads <= 1:
        return {"parallel_min_work": PARALLEL_MIN_WORK, "source": "one thread"}
    hit = _known.get(threads)
    if hit is not None:
        return hit
    with _lock:
        hit = _known.get(threads)
        if hit is None:
            if _mode() in ("defaults", "default", "off", "0"):
                hit = {"parallel_min_work": PARALLEL_MIN_WORK, "source": "defaults"}
            else:
                hit = _read_file().get(str(threads))
                if not hit or "parallel_min_work" not in hit:
                    if _busy():     # timings now would be the neighbours'; every process would pay them again
                        hit = {"parallel_min_work": PARALLEL_MIN_WORK, "source": "defaults (busy host: not measured)"}
                    else:
                        hit = measure(threads)
                        if hit.get("parallel_min_work", 0) < BOUNDS[1]:
                            _write_file(threads, hit)     # a clamped figure (a noisy host) serves this process only
            _known[threads] = hit
    return hit


def parallel_min_work(threads: int) -> int:
    """Work from which a parallel kernel runs in parallel at `threads`."""
    v = env_number("MNNTOOL_PARALLEL_MIN_WORK")
    return v if v is not None else int(_entry(threads)["parallel_min_work"])


def one_thread_below_flops(threads: int) -> int:
    """FLOPs below which a whole plan runs on one thread."""
    v = env_number("MNNTOOL_ONE_THREAD_BELOW_FLOPS")
    return v if v is not None else int(parallel_min_work(threads) * FLOPS_PER_WORK)


def report(threads: int) -> dict:
    """What a session at `threads` uses, and where it came from (bench --json: "host_tuning")."""
    from .kernels.step_timing import enabled
    src = "override" if os.environ.get("MNNTOOL_PARALLEL_MIN_WORK", "").strip() else _entry(threads)["source"]
    return {"threads": threads, "parallel_min_work": parallel_min_work(threads),
            "one_thread_below_flops": one_thread_below_flops(threads), "source": src,
            "file": str(_path()) if src == "measured" else None,
            # steps near the threshold time both forms and keep the faster (kernels/step_timing.py)
            "step_timing": threads > 1 and enabled()}


def forget(measured: bool = False) -> None:
    """Drops what this process measured or read (tests); with `measured`, this host's entries in the file
    too, so the next use measures again (compile-kernels --force)."""
    with _lock:
        _known.clear()
        if measured:
            path = _path()
            try:
                data = json.loads(path.read_text())
                data.pop(_host_key(), None)
                tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
                tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
                os.replace(tmp, path)
            except (OSError, ValueError, AttributeError):
                pass
