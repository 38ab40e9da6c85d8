"""Shape inference over the whole graph, op by op, from the registry's definitions (ops.evaluate walks
the graph; this module writes what it finds into the graph's tensors and counts flops)."""
from __future__ import annotations

from .graph import Graph
from .ops import REGISTRY, Val
from .ops.evaluate import infer_node, infer_values  # noqa: F401  (the runtime and frontends infer node by node)


def infer_shapes(g: Graph) -> dict[str, Val]:
    """Fill g.tensors[*].shape/dtype; unknown shapes stay None. Returns every tensor's Val."""
    for name in g.inputs:
        g.info(name)
    vals = infer_values(g)
    for node in g.nodes:
        for name in node.outputs:
            v = vals[name]
            t = g.info(name)
            t.shape = tuple(v.shape) if v.shape is not None else None
            t.dtype = v.dtype
    return vals


def flops(g: Graph, vals: dict[str, Val] | None = None) -> int:
    vals = vals or infer_shapes(g)
    total = 0
    for node in g.nodes:
        opdef = REGISTRY.get(node.op)
        if opdef is None:
            continue
        ins = [vals.get(i, Val(None)) for i in node.inputs]
        outs = [vals.get(o, Val(None)) for o in node.outputs]
        if any(v.shape is None for v in ins + outs):
            continue
        try:
            total += int(opdef.flops(node, ins, outs))
        except (KeyError, TypeError, IndexError):
            pass
    return total
