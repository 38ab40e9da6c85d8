"""A MatMul whose right-hand side is a constant read through a Permute that swaps its last two axes
reads the constant itself with transposeB flipped: its kernel packs the constant once at prepare, where
the Permute copied it on every run. A tied language-model head is the case (GPT-2: logits = h @ wte.T,
wte 50257 x 768 also read by the embedding's Gather, so the converter keeps one copy and a Transpose):
the transpose of 154 MB took 241 of 565 ms of a 128-token prefill here."""
from __future__ import annotations

import numpy as np

from ...ir.graph import Node
from ...ir.ops import kind_of, params
from .match import rewriting, rewritten, users_of
from .state import Planning

OPTIONAL = True
STARTS = frozenset({"Permute"})      # ops a match starts from: without one the stage has nothing to do


def _swaps_last_two(node: Node, rank: int) -> bool:
    dims = node.param.get("dims")
    if dims is None or rank < 2:
        return False
    dims = [int(d) for d in np.asarray(dims).reshape(-1)]
    return dims == list(range(rank - 2)) + [rank - 1, rank - 2]


def _reads_as_right(mm: Node, t: str) -> bool:
    """A matmul reading t as its right operand only."""
    return kind_of(mm.op) == "matmul" and _right_flag(mm) is not None and len(mm.inputs) >= 2 and \
        mm.inputs.count(t) == 1 and mm.inputs[1] == t


def _right_flag(mm: Node) -> str | None:
    """The parameter that transposes the right operand (MatMul's transposeB, BatchMatMul's adjY)."""
    return next((k for k in ("transposeB", "adjY") if k in params(mm)), None)


def _flipped(mm: Node, weight: str) -> Node:
    param = dict(mm.param)
    key = _right_flag(mm)
    param[key] = not bool(params(mm)[key])
    return Node(mm.op, [mm.inputs[0], weight] + list(mm.inputs[2:]), list(mm.outputs), mm.name, param,
                mm.param_type, mm.fmt)


def fuse(p: Planning) -> list[Node]:
    nodes, constants, stored = p.nodes, p.graph.constants, p.stored
    users = users_of(p)
    outputs = set(p.graph.outputs)
    fused, drop = {}, set()
    for perm in nodes:
        if perm.op != "Permute" or len(perm.inputs) != 1 or len(perm.outputs) != 1:
            continue
        w, t = perm.inputs[0], perm.outputs[0]
        if w not in constants or constants[w].dtype != np.float32 or t in outputs or t in stored:
            continue
        if not _swaps_last_two(perm, constants[w].ndim):
            continue
        readers = users.get(t, [])
        if not readers or not all(_reads_as_right(r, t) for r in readers):
            continue
        for r in readers:
            fused[id(r)] = _flipped(r, w)
        drop.add(id(perm))
    return rewritten(nodes, fused, drop)


run = rewriting(fuse)
