"""Remove ops that do nothing at inference: Identity, Dropout, same-shape Reshape/Flatten/Squeeze,
identity Permute, Cast to the type the tensor already has."""
from __future__ import annotations

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
    return False


class RemoveNoopsPass:
    name = "remove_noops"

    def __call__(self, g: Graph) -> bool:
        changed = False
        for n in list(g.nodes):
            if _is_noop(g, n) and remove_passthrough(g, n):
                changed = True
        return changed
