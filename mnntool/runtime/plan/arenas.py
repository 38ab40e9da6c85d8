"""Plan memory shared across input shapes: the plans of a session lay their buffers out in an arena, and
plans of different shapes share one arena, since a run rewrites every buffer before reading it (the
memory plan already reuses a dead tensor's buffer within a run) and nothing in it outlives a run (run()
copies the outputs out). A session that sees a new input shape with every run (OCR, detection) so
plans into memory the runs before it already touched: no page faults for it on the new shape's first
run, and the process holds about one pool of the largest shape seen, however many shapes come
(benchmarks/new_shapes.py).

An arena serves one run at a time: a run reserves its plan's arena (Session._checkout) and frees it
after; a run whose plan's arena another run holds (another thread, at another shape) plans anew into
a free arena, or a new one: so a session has as many arenas as it has had runs at once. A new plan
takes the largest free arena (every shape comes to plan into the same warm one); where that is too
small, its buffer is replaced by one GROWTH times the need (the plans before keep the old one while they
live). An arena goes when no plan uses it (plans hold it).

A plan takes its arena when its planning starts, so the plans of one arena, which never run at once, may
share kernels (plan/reuse.py keeps them in `Arena.kernels`)."""
from __future__ import annotations

import threading
import weakref

import numpy as np

from ..kernels import CACHE_LINE, aligned_empty


class Arena:
    """One flat buffer, and whether a run (or a plan being built for one) holds it."""

    __slots__ = ("buf", "busy", "kernels", "__weakref__")

    def __init__(self, nbytes: int):
        self.buf, self.busy = aligned_empty(nbytes, np.uint8), False
        self.kernels = None     # what plan/reuse.py keeps for the plans of this arena

    @property
    def size(self) -> int:
        return self.buf.size


def layout(sizes: list[int]) -> tuple[list[int], int]:
    """(each buffer's byte offset, the bytes in all): buffers one after the other, each on a cache line."""
    offsets, end = [], 0
    for n in sizes:
        offsets.append(end)
        end += -(-int(n) // CACHE_LINE) * CACHE_LINE
    return offsets, end


class Arenas:
    """The arenas of a session (held weakly: the plans hold them)."""

    GROWTH = 1.125      # a new arena's room over the need: a somewhat larger shape later fits it

    def __init__(self):
        self._refs: list = []
        self._lock = threading.Lock()

    def _live(self) -> list[Arena]:
        live = [a for a in (r() for r in self._refs) if a is not None]
        if len(live) != len(self._refs):
            self._refs = [weakref.ref(a) for a in live]
        return live

    def take(self, nbytes: int) -> Arena:
        """A free arena of at least `nbytes`, reserved for the caller (release() frees it)."""
        with self._lock:
            free = [a for a in self._live() if not a.busy]
            best = max(free, key=lambda a: a.size) if free else None
            if best is None or best.size < nbytes:
                best = Arena(max(int(self.GROWTH * nbytes), CACHE_LINE))
                self._refs.append(weakref.ref(best))
            best.busy = True
            return best

    def fit(self, arena: Arena, nbytes: int) -> None:
        """Make `arena` (reserved by the caller) hold `nbytes`: a new buffer GROWTH times that where it is
        smaller (the plans laid out in the old one keep it)."""
        if arena.size < nbytes:
            arena.buf = aligned_empty(max(int(self.GROWTH * nbytes), CACHE_LINE), np.uint8)

    def reserve(self, arena: Arena | None) -> bool:
        """Hold `arena` for a run, if no other run holds it (None: a plan without one, always)."""
        if arena is None:
            return True
        with self._lock:
            if arena.busy:
                return False
            arena.busy = True
            return True

    def release(self, arena: Arena | None) -> None:
        if arena is not None:
            with self._lock:
                arena.busy = False

    @property
    def count(self) -> int:
        with self._lock:
            return len(self._live())

    @property
    def total_bytes(self) -> int:
        with self._lock:
            return sum(a.size for a in self._live())
