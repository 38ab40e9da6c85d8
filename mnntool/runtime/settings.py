"""What a Session decides for its kernels: the thread count, given to every kernel factory at prepare
and applied to the calling thread when it runs (MNN: the Backend's numberThread). Nothing in the
runtime reads a process-wide thread count back."""
from __future__ import annotations

from dataclasses import dataclass

_blas_threads: list = [None]     # what this process's BLAS was last limited to, by any session


@dataclass(frozen=True)
class Settings:
    threads: int

    @classmethod
    def of(cls, threads: int | None = None) -> Settings:
        """`threads` capped to the cores Numba may use; None: all of them (Numba's and BLAS's default)."""
        import numba
        cap = numba.config.NUMBA_NUM_THREADS
        return cls(max(1, min(int(threads), cap)) if threads else cap)

    def apply(self) -> None:
        """Before a run: Numba's count for this thread (Numba keeps one per thread), and BLAS's (one per
        process) when another session set a different one. Costs ~1 us when nothing changes."""
        import numba
        if numba.get_num_threads() != self.threads:
            numba.set_num_threads(self.threads)
        if _blas_threads[0] != self.threads:
            from threadpoolctl import threadpool_limits
            threadpool_limits(limits=self.threads, user_api="blas")
            _blas_threads[0] = self.threads
