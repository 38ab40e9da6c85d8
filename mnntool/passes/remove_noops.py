"""Remove ops that do nothing at inference: Identity, Dropout, same-shape Reshape/Flatten/Squeeze,
identity Permute, Cast to the type the tensor already has, a float x * 1, x + 0 or x - 0 by a constant
that does not change x's shape (dynamo's GroupNorm(1) decomposition writes a scalar * 1 + 0 after each
LayerNorm: MobileViTv2-0.5 had 36 such ops that MNN's converter's file does not have)."""
from __future__ import annotations

import numpy as np

from ..ir.graph import Graph
from .util import remove_passthrough


def _is_noop(g: Graph, n) -> bool:
    if n.op in ("Identity", "Dropout"):
        return len(n.inputs) >= 1 and len(n.outputs) == 1
    if n.op == "Permute":
        return list(n.param.get("dims", [])) == list(range(len(n.param.get("dims", []))))
    src, dst = g.tensors.get(n.inputs[0]) if n.inputs else None, g.tensors.get(n.outputs[0])
    if src is None or dst is None or src.shape is None or dst.shape is None:
        return False
    if n.op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze"):
        return tuple(src.shape) == tuple(dst.shape) and all(isinstance(d, int) for d in src.shape)
    if n.op == "Cast":
        return src.dtype == dst.dtype
    if n.op == "BinaryOp":
        return _identity_binary(g, n, src, dst)
    return False


def _identity_binary(g: Graph, n, src, dst) -> bool:
    """x * 1, x + 0, x - 0 with x first (an ADD/MUL with the constant first is turned round here)."""
    op = n.param.get("opType")
    if len(n.inputs) != 2 or int(n.param.get("activationType", 0)) or op not in ("MUL", "ADD", "SUB"):
        return False
    k = 1 if n.inputs[1] in g.constants else 0 if op != "SUB" and n.inputs[0] in g.constants else None
    if k is None or n.inputs[1 - k] in g.constants:
        return False
    c, x = g.constants[n.inputs[k]], g.tensors.get(n.inputs[1 - k])
    if c.dtype.kind != "f" or x is None or x.shape is None or x.dtype != "float32" or \
            tuple(x.shape) != tuple(dst.shape) or not np.all(c == (1 if op == "MUL" else 0)):
        return False
    if k == 0:
        n.inputs = n.inputs[::-1]
    return True


class RemoveNoopsPass:
    name = "remove_noops"

    def __call__(self, g: Graph) -> bool:
        changed = False
        for n in list(g.nodes):
            if _is_noop(g, n) and remove_passthrough(g, n):
                changed = True
        return changed
