"""Plan buffers recycled within a session: a session that sees a new input shape with every run (OCR,
detection) plans into memory that dropped plans' runs had already touched, where fresh buffers cost
the first run at each shape a page fault every 4 KB (benchmarks/new_shapes.py's two-convolution model:
586 faults and 2.0x its steady run at the median of 40 shapes; 98 and 1.6x recycled). A plan's
buffers come back when the plan is gone (Planning.plan sets a finalizer)."""
from __future__ import annotations

import ctypes
import mmap
import sys
import threading

import numpy as np

from ..kernels import aligned_empty


def _libc_madvise():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.madvise
        fn.argtypes, fn.restype = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int), ctypes.c_int
        return fn
    except (OSError, AttributeError):
        return None


_MADVISE = _libc_madvise() if sys.platform.startswith("linux") else None
_DONTNEED = 4       # MADV_DONTNEED: the pages go back to the system; touched again, they read as zeros
_PAGE = mmap.PAGESIZE


def release_past(buf: np.ndarray, nbytes: int) -> None:
    """Give the whole pages of `buf` past its first `nbytes` back to the system (the process's RSS counts
    them no more; a later use faults them in again). The buffer's contents there are undefined anyway."""
    if _MADVISE is None:
        return
    start = -(-(buf.ctypes.data + nbytes) // _PAGE) * _PAGE
    end = (buf.ctypes.data + buf.size) // _PAGE * _PAGE
    if end - start >= 16 * _PAGE:
        _MADVISE(start, end - start, _DONTNEED)


class Recycler:
    """Buffers of dropped plans, handed to new plans: the smallest free buffer that holds a need, if it
    is not much larger (at most SLACK times the need, or 1 MB more: a small tensor does not pin a large
    buffer), its pages past HEADROOM times the need given back to the system (release_past: a plan's
    RSS is about what it uses). The free buffers kept are bounded by KEEP_POOLS times the largest pool
    a plan of the session has had, the oldest going first; the plans kept (Session's MAX_PLANS) bound
    the rest. Measured with benchmarks/new_shapes.py (2,000 shapes of 200-400 px): without the release
    the plans kept grew to hold the largest shapes' buffers (RSS +66 MB over the run, +27 MB with it)."""

    KEEP_POOLS = 1
    SLACK = 4
    HEADROOM = 1.25     # pages kept past a need: a later, somewhat larger need faults none in

    def __init__(self):
        self.free: list[np.ndarray] = []
        self.largest = 0
        self.lock = threading.RLock()

    def take(self, nbytes: int) -> np.ndarray:
        """A cache-line-aligned uint8 buffer of at least `nbytes`."""
        most = max(self.SLACK * nbytes, nbytes + (1 << 20))
        with self.lock:
            fits = [b for b in self.free if nbytes <= b.size <= most]
            b = min(fits, key=lambda x: x.size) if fits else None
            if b is not None:
                self.free = [x for x in self.free if x is not b]
        if b is None:
            return aligned_empty(nbytes, np.uint8)
        release_past(b, int(self.HEADROOM * nbytes))
        return b

    def give_back(self, buffers: list) -> None:
        """(A plan's finalizer: it may run inside `take`, on this thread, when a collection frees a plan;
        hence a reentrant lock and a new list rather than one changed in place.)"""
        with self.lock:
            self.largest = max(self.largest, sum(b.size for b in buffers))
            free = self.free + list(buffers)
            total = sum(b.size for b in free)
            while free and total > self.KEEP_POOLS * self.largest:
                total -= free.pop(0).size
            self.free = free

    @property
    def free_bytes(self) -> int:
        return sum(b.size for b in self.free)
