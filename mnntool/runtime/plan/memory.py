"""The memory plan: every tensor a kernel writes gets a view into a pool of flat buffers, reused once the
tensor (and every view of it) is dead, so steady-state runs allocate only where a kernel returns a
fresh array (small shape tensors, gathers). The slots of the plan's constants and of those views are
filled here, once.

A plan's buffers come from its session's Recycler, and go back to it when the plan is gone: a session
that sees a new input shape with every run (OCR, detection) plans into memory the dropped plans'
runs had already touched, where fresh buffers cost the first run at each shape a page fault every
4 KB (the two-convolution model of benchmarks/new_shapes.py: ~1,500 faults, 2-3x its steady run)."""
from __future__ import annotations

import math
import threading

import numpy as np

from ..kernels import aligned_empty
from .place_concats import nbytes_of
from .state import Planning

OPTIONAL = False


class Recycler:
    """Buffers of dropped plans, handed to new plans: the smallest free buffer that holds a need, if it
    is not much larger (at most SLACK times the need, or 1 MB more: a small tensor does not pin a large
    buffer). The free buffers kept are bounded by KEEP_POOLS times the largest pool a plan of the
    session has had, the oldest going first; the plans kept (Session's MAX_PLANS) bound the rest."""

    KEEP_POOLS = 2
    SLACK = 4

    def __init__(self):
        self.free: list[np.ndarray] = []
        self.largest = 0
        self.lock = threading.Lock()

    def take(self, nbytes: int) -> np.ndarray:
        """A cache-line-aligned uint8 buffer of at least `nbytes`."""
        most = max(self.SLACK * nbytes, nbytes + (1 << 20))
        with self.lock:
            fits = [b for b in self.free if nbytes <= b.size <= most]
            if fits:
                b = min(fits, key=lambda x: x.size)
                self.free = [x for x in self.free if x is not b]
                return b
        return aligned_empty(nbytes, np.uint8)

    def give_back(self, buffers: list) -> None:
        with self.lock:
            self.largest = max(self.largest, sum(b.size for b in buffers))
            self.free += buffers
            total = sum(b.size for b in self.free)
            while self.free and total > self.KEEP_POOLS * self.largest:
                total -= self.free.pop(0).size

    @property
    def free_bytes(self) -> int:
        return sum(b.size for b in self.free)


def run(p: Planning) -> None:
    steps, names = p.steps, p.names
    output_slots = [p.index[o] for o in p.graph.outputs]
    n_steps = len(steps)
    last = {}
    for k, s in enumerate(steps):
        for i in s.ins:
            last[i] = k
    for o in output_slots:
        last[o] = n_steps
    roots: dict[int, set] = {}
    buf_end: dict[int, int] = {}
    buf_size: list[int] = []
    free: list[int] = []
    views = []      # (step, out position, buffer id, shape, dtype, byte offset)
    placed = p.placed
    host_end: dict[int, int] = {}       # a Concat host's bytes live until its last part is read
    for t, (h, _) in placed.items():
        host_end[h] = max(host_end.get(h, 0), last.get(t, 0))
    host_buf: dict[int, int] = {}

    def allocate(nbytes, end):
        fits = [b for b in free if buf_size[b] >= nbytes]
        if fits:
            b = min(fits, key=lambda x: buf_size[x])
            free.remove(b)
        elif free:      # grow a free buffer: its start is still in cache, a new one is cold
            b = max(free, key=lambda x: buf_size[x])
            free.remove(b)
            buf_size[b] = nbytes
        else:
            b = len(buf_size)
            buf_size.append(nbytes)
        buf_end[b] = end
        return b
    for k, s in enumerate(steps):
        for pos, o in enumerate(s.outs):
            end = n_steps if p.keep_all else last.get(o, k)
            if s.kernel.writes_out:
                v = p.vals[names[o]]
                dtype = np.dtype(v.dtype)
                if o in placed:
                    h, offset = placed[o]
                    if h not in host_buf:
                        host_buf[h] = allocate(nbytes_of(p, h), host_end[h])
                    b = host_buf[h]
                else:
                    b, offset = allocate(nbytes_of(p, o), end), 0
                roots[o] = {b}
                views.append((k, pos, b, tuple(v.shape), dtype, offset))
            else:
                roots[o] = set().union(*(roots.get(i, set()) for i in s.ins if i >= 0)) if s.ins else set()
                for b in roots[o]:
                    buf_end[b] = max(buf_end[b], end)
        for b, end in list(buf_end.items()):
            if end <= k and b not in free:
                free.append(b)
                del buf_end[b]
    take = p.memory.take if p.memory is not None else (lambda n: aligned_empty(n, np.uint8))
    p.buffers = [take(size) for size in buf_size]
    p.pool_bytes = int(sum(buf_size))
    for s in steps:
        s.out_views = [None] * len(s.outs)
    for k, pos, b, shape, dtype, offset in views:
        count = math.prod(int(d) for d in shape)
        steps[k].out_views[pos] = p.buffers[b][offset:offset + count * dtype.itemsize].view(dtype).reshape(shape)
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
