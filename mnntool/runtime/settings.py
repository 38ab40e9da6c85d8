"""What a Session decides for its kernels: the thread count, given to every kernel factory at prepare
and applied to the calling thread when it runs (MNN: the Backend's numberThread), and the optional
planning stages it skips (runtime/plan). Nothing in the runtime reads a process-wide thread count back."""
from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass

_blas_limited: list = [False]    # whether this process's BLAS was limited to one thread yet
_applied = threading.local()     # the thread count the calling thread last ran at


def cores() -> int:
    """The threads Numba may use (its NUMBA_NUM_THREADS), read without importing Numba."""
    if "numba" in sys.modules:
        import numba
        return numba.config.NUMBA_NUM_THREADS
    env = os.environ.get("NUMBA_NUM_THREADS")
    if env and env.strip().isdigit() and int(env) > 0:
        return int(env)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def applied_threads() -> int | None:
    """The thread count the calling thread last ran a session at (None: it has run none)."""
    return getattr(_applied, "threads", None)


def numba_loaded() -> None:
    """Numba was just imported mid-run (a kernel the ahead-of-time library lacks): its count for this
    thread is the run's, not Numba's default of every core."""
    threads = applied_threads()
    if threads:
        import numba
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))


def stages_off_from_env() -> frozenset:
    """Planning stages MNNTOOL_PLAN_OFF switches off for every session (comma-separated names)."""
    return frozenset(n.strip() for n in os.environ.get("MNNTOOL_PLAN_OFF", "").split(",") if n.strip())


@dataclass(frozen=True)
class Settings:
    threads: int
    off: frozenset = frozenset()    # optional planning stages switched off (runtime/plan: STAGES)

    @classmethod
    def of(cls, threads: int | None = None, off=None) -> Settings:
        """`threads` capped to the cores Numba may use; None: all of them (Numba's and BLAS's default).
        `off`: planning stages to skip (None: those MNNTOOL_PLAN_OFF names)."""
        cap = cores()
        return cls(max(1, min(int(threads), cap)) if threads else cap,
                   stages_off_from_env() if off is None else frozenset(off))

    def apply(self) -> None:
        """Before a run: Numba's count for this thread (Numba keeps one per thread; set when Numba is loaded
        or the run wants more than one thread), and BLAS at one thread: the few BLAS calls left (activation x activation products) are small, and BLAS's own workers would
        fight the OpenMP workers that spin between the kernels of a run (threadpool.py). At 2 threads, BLAS
        at 2 took ViT-tiny to 18.3 ms and MobileViT-xxs to 13.6 ms (slower than at 1 thread), at 1 to
        14.3 and 10.8 ms. Costs ~1 us when nothing changes."""
        _applied.threads = self.threads
        if self.threads > 1 or "numba" in sys.modules:     # at one thread the library's kernels need none
            import numba
            if numba.get_num_threads() != self.threads:
                numba.set_num_threads(self.threads)
        if not _blas_limited[0]:
            from ..threadpool import BLAS_AT_ONE
            _blas_limited[0] = BLAS_AT_ONE[0]
        if not _blas_limited[0]:
            from threadpoolctl import threadpool_limits
            threadpool_limits(limits=1, user_api="blas")
            _blas_limited[0] = True
