"""Concat without copies (runtime/concat_in_place.py): the tensors a Concat joins are written by their
producers straight into its output, and the Concat step is dropped. Not under keep_all: every tensor
then has bytes of its own."""
from __future__ import annotations

import math

import numpy as np

from ..concat_in_place import placements
from .state import Planning

OPTIONAL = True


_ITEMSIZE: dict = {}


def nbytes_of(p: Planning, slot: int) -> int:
    v = p.vals[p.names[slot]]
    size = _ITEMSIZE.get(v.dtype)
    if size is None:
        size = _ITEMSIZE[v.dtype] = np.dtype(v.dtype).itemsize
    return max(math.prod(v.shape) * size, 1)


def run(p: Planning) -> None:
    if p.keep_all:
        return
    output_slots = [p.index[o] for o in p.graph.outputs]
    p.placed, elided = placements(p.steps, output_slots, lambda s: nbytes_of(p, s))
    for k in elided:
        p.steps[k].elided = True
