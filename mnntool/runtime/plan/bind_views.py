"""A view step whose inputs are in the same arrays every run (constants, outputs written into the pool,
views bound before it) gets its outputs once, here: a step costs ~1.5 us of Python, and half of a
small transformer's ~110 steps are reshapes and splits. Not where the view would be a copy (a reshape
of a strided input), nor under keep_all."""
from __future__ import annotations

import numpy as np

from .state import Planning, Step

OPTIONAL = True


def bind_view(step: Step, ins: tuple, slots: list, fixed: set) -> bool:
    if not all(i in fixed for i in ins):
        return False
    args = [slots[i] for i in ins]
    try:
        outs = step.kernel.fn(args)
    except Exception:       # noqa: BLE001 - a file whose shapes contradict: the step fails at run, named
        return False
    if not all(isinstance(o, np.ndarray) and o.size and np.may_share_memory(o, args[0]) for o in outs):
        return False
    for o, v in zip(step.outs, outs):
        slots[o] = v
    fixed.update(step.outs)
    return True


def run(p: Planning) -> None:
    if p.keep_all:
        return
    absent = len(p.names)
    for s in p.steps:
        if s.kernel.view and not s.kernel.writes_out:
            s.bound = bind_view(s, tuple(i if i >= 0 else absent for i in s.ins), p.slots, p.fixed)
