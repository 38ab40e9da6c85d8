"""The memory plan: every tensor a kernel writes gets a view into a pool of flat buffers, reused once the
tensor (and every view of it) is dead, so steady-state runs allocate only where a kernel returns a
fresh array (small shape tensors, gathers). The slots of the plan's constants and of those views are
filled here, once. The buffers lie in one arena, the session's (arenas.py: shared by the plans of every
input shape) where it has them."""
from __future__ import annotations

import math

import numpy as np

from ..kernels import aligned_empty
from .arenas import layout
from .place_concats import nbytes_of
from .state import Planning

OPTIONAL = False


class _Buffers:
    """Buffer sizes handed out as tensors are born and taken back as they die: a dead tensor's buffer
    serves the next one that fits (the smallest that does), else the largest free one grows (its start
    is still in cache, a new one is cold), else a new buffer."""

    def __init__(self):
        self.size: list[int] = []
        self.end: dict[int, int] = {}       # buffer -> the last step reading what it holds
        self.free: list[int] = []
        self.next_end = math.inf        # at most the least of `end` (release_dead has nothing to do before)

    def allocate(self, nbytes: int, end: int) -> int:
        fits = [b for b in self.free if self.size[b] >= nbytes]
        if fits:
            b = min(fits, key=lambda x: self.size[x])
            self.free.remove(b)
        elif self.free:
            b = max(self.free, key=lambda x: self.size[x])
            self.free.remove(b)
            self.size[b] = nbytes
        else:
            b = len(self.size)
            self.size.append(nbytes)
        self.end[b] = end
        self.next_end = min(self.next_end, end)
        return b

    def release_dead(self, k: int) -> None:
        """Free the buffers whose contents no step after step k reads."""
        if k < self.next_end:       # (planned at every new input shape: most steps free nothing)
            return
        for b, end in list(self.end.items()):
            if end <= k and b not in self.free:
                self.free.append(b)
                del self.end[b]
        self.next_end = min(self.end.values(), default=math.inf)


def last_reads(p: Planning) -> dict[int, int]:
    """Slot -> the last step reading it (len(steps) for graph outputs: read after the run)."""
    last = {}
    for k, s in enumerate(p.steps):
        for i in s.ins:
            last[i] = k
    for o in p.graph.outputs:
        last[p.index[o]] = len(p.steps)
    return last


def assign(p: Planning) -> tuple[list[int], list]:
    """(buffer sizes, [(step, output position, buffer, shape, dtype, byte offset)]) for every output a
    kernel writes; a view's lifetime extends its source's buffer's, a Concat host's (place_concats)
    lasts until its last part is read."""
    last, bufs, views = last_reads(p), _Buffers(), []
    roots: dict[int, set] = {}
    host_end: dict[int, int] = {}
    for t, (h, _) in p.placed.items():
        host_end[h] = max(host_end.get(h, 0), last.get(t, 0))
    host_buf: dict[int, int] = {}
    for k, s in enumerate(p.steps):
        for pos, o in enumerate(s.outs):
            end = len(p.steps) if p.keep_all else last.get(o, k)
            if s.kernel.writes_out:
                v = p.vals[p.names[o]]
                if o in p.placed:
                    h, offset = p.placed[o]
                    if h not in host_buf:
                        host_buf[h] = bufs.allocate(nbytes_of(p, h), host_end[h])
                    b = host_buf[h]
                else:
                    b, offset = bufs.allocate(nbytes_of(p, o), end), 0
                roots[o] = {b}
                views.append((k, pos, b, tuple(v.shape), np.dtype(v.dtype), offset))
            else:
                roots[o] = set().union(*(roots.get(i, set()) for i in s.ins if i >= 0)) if s.ins else set()
                for b in roots[o]:
                    bufs.end[b] = max(bufs.end[b], end)
        bufs.release_dead(k)
    return bufs.size, views


def run(p: Planning) -> None:
    sizes, views = assign(p)
    offsets, total = layout(sizes)
    if p.arena is not None and total:     # (taken when planning began: plan/__init__.build)
        p.memory.fit(p.arena, total)
        base = p.arena.buf
    else:
        base = aligned_empty(total, np.uint8)
    p.buffers = [base[o:o + n] for o, n in zip(offsets, sizes)]
    p.pool_bytes = int(sum(sizes))
    for s in p.steps:
        s.out_views = [None] * len(s.outs)
    buffers, steps, ndarray = p.buffers, p.steps, np.ndarray
    for k, pos, b, shape, dtype, offset in views:
        # (the same C-contiguous view of the buffer as slicing, viewing and reshaping it, in one call: ~1.5 us
        # less a step, at every new input shape)
        steps[k].out_views[pos] = ndarray(shape, dtype, buffers[b], offset)
    _fill_slots(p)


def _fill_slots(p: Planning) -> None:
    """Slots of constants, of tensors computed at prepare and of every output a kernel writes into its
    view: the same arrays every run (p.fixed)."""
    p.slots = [None] * (len(p.names) + 1)     # the last stays None: what an absent input (-1) reads
    for name, value in list(p.graph.constants.items()) + list(p.known.items()):
        p.slots[p.index[name]] = value
    p.fixed = {p.index[n] for n in list(p.graph.constants) + list(p.known)}
    for s in p.steps:
        if s.kernel.writes_out:
            for o, v in zip(s.outs, s.out_views):
                p.slots[o] = v
            p.fixed.update(s.outs)
