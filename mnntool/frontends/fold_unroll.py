"""Conversion-time evaluation shared by the TensorFlow and TFLite frontends: ops whose operands are all
constants fold as they are emitted, and loops of a length known at conversion are unrolled.

Keras RNNs, TF2 `while_loop`s over a fixed count and TFLite WHILEs are loops whose condition depends only
on a counter; unrolling them gives a flat graph both runtimes run. The unrolled size is bounded over the
whole model (nested loops included), so a hostile file cannot make the conversion run forever."""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..errors import MnnToolError
from .shape_tracking import T

MAX_TRIPS = 4096      # loop steps unrolled in one model, nested loops included
MAX_NESTING = 16      # loops inside loop bodies, at most this deep (a body that names itself recurses)


class LoopBudget:
    """What one conversion has unrolled so far."""

    def __init__(self):
        self.nesting = 0
        self.trips = 0


def fold(ctx, start: int) -> None:
    """Nodes emitted since `start` whose operands are all constants become constants (shape arithmetic,
    loop counters), under shape inference's own rule: only small values of small operands."""
    from ..ir.shape_inference import infer_node
    g = ctx.g
    kept = g.nodes[:start]
    for node in g.nodes[start:]:
        if node.inputs and not node.graphs and all(i in g.constants for i in node.inputs):
            outs = infer_node(node, [ctx.val(i) for i in node.inputs])
            if outs and all(v.value is not None for v in outs):
                for o, v in zip(node.outputs, outs):
                    g.constants[o] = np.asarray(v.value)
                continue
        kept.append(node)
    g.nodes = kept


def folded(ctx, results: list) -> list:
    """Results that folding made constants, as the arrays themselves."""
    return [ctx.g.constants[r] if isinstance(r, str) and r in ctx.g.constants else r for r in results]


def unroll(budget: LoopBudget, what: str, cond: Callable[[list], object], body: Callable[[list], list],
           values: list) -> list:
    """Run `body` on the loop values while `cond` folds to true; `what` names the loop in errors."""
    if budget.nesting >= MAX_NESTING:
        raise MnnToolError(f"{what}: loops nested more than {MAX_NESTING} deep (a loop body that calls itself?)")
    budget.nesting += 1
    try:
        while True:
            c = cond(values)
            if isinstance(c, T) or c is None:
                raise MnnToolError(f"{what}: the loop condition depends on run-time values "
                                   "(only loops of a known length are converted)")
            if not bool(np.asarray(c).reshape(-1)[0]):
                return values
            budget.trips += 1
            if budget.trips > MAX_TRIPS:
                raise MnnToolError(f"{what}: more than {MAX_TRIPS} loop steps to unroll")
            values = body(values)
    finally:
        budget.nesting -= 1
