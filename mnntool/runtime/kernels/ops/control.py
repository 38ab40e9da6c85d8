"""If and While: their bodies run in sessions of their own, one per distinct set of input types, each
caching a plan per set of input shapes (a loop body sees the same shapes every iteration).

The kernels sit below the planner that builds them, so they may not import runtime.session: the session
module hands its Session class over as it loads (`run_bodies_in`)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ....ir.graph import TensorInfo
from ....ir.ops import kind_of
from ....ir.ops.control import check_loop, run_if, run_while
from .. import kernel, returns


def shape_free(op: str) -> bool:
    """Control flow's kernels take operands of any shape and size their outputs themselves."""
    return kind_of(op) == "control"

_SESSION: list = []                   # the runtime's Session class, once runtime.session has loaded


def run_bodies_in(session_class) -> None:
    """Control flow's bodies run in sessions of this class (runtime.session calls it as it loads)."""
    _SESSION[:] = [session_class]


class Bodies:
    """graph, input values -> output values, on the runtime's sessions."""

    def __init__(self, settings):
        self.settings = settings
        self.sessions: dict = {}

    def __call__(self, sub, feeds: list) -> list:
        feeds = [np.asarray(v) for v in feeds]
        key = (id(sub),) + tuple(v.dtype.str for v in feeds)
        session = self.sessions.get(key)
        if session is None:
            typed = replace(sub, tensors=dict(sub.tensors))
            for name, v in zip(sub.inputs, feeds):   # the types the values have (MNN's files declare none)
                typed.tensors[name] = TensorInfo(name, "float32" if v.dtype.kind == "f" else "int32", None)
            session = self.sessions[key] = _SESSION[0](typed, self.settings.threads)
        out = session.run(dict(zip(sub.inputs, feeds)))
        return [out[o] for o in sub.outputs]


@kernel("If")
def if_(node, ins, outs, settings):
    bodies = Bodies(settings)
    return returns(lambda xs: run_if(node, xs, bodies))


@kernel("While")
def while_(node, ins, outs, settings):
    check_loop(node)
    bodies = Bodies(settings)
    return returns(lambda xs: run_while(node, xs, bodies))
