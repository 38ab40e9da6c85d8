"""Shape inference over the whole graph, op by op, from the registry's definitions."""
from __future__ import annotations

import numpy as np

from .graph import Graph
from .ops import REGISTRY, Val, values


def infer_shapes(g: Graph) -> dict[str, Val]:
    """Fill g.tensors[*].shape/dtype; unknown shapes stay None. Returns every tensor's Val."""
    vals: dict[str, Val] = {}
    for name in g.inputs:
        t = g.info(name)
        vals[name] = Val(t.shape, t.dtype)
    for name, value in g.constants.items():
        vals[name] = Val(tuple(value.shape), str(value.dtype), value)
    for node in g.nodes:
        ins = [vals.get(i, Val(None)) for i in node.inputs]
        outs = [Val(None)] * len(node.outputs)
        opdef = REGISTRY.get(node.op)
        if opdef is not None and all(v.shape is not None for v in ins):
            try:
                outs = opdef.infer(node, ins)
            except (ValueError, KeyError, IndexError, TypeError, ZeroDivisionError):
                outs = [Val(None)] * len(node.outputs)
        if outs and outs[0].value is None and ins and all(v.value is not None and np.size(v.value) <= 64 for v in ins):
            try:
                out = values.value(node, [np.asarray(v.value) for v in ins])
            except (ValueError, IndexError, TypeError):
                out = None
            if out is not None:
                out = np.asarray(out)
                outs = [Val(tuple(out.shape), str(out.dtype), out)] + list(outs[1:])
        for name, v in zip(node.outputs, outs):
            vals[name] = v
            t = g.info(name)
            t.shape = tuple(v.shape) if v.shape is not None else None
            t.dtype = v.dtype
    return vals


def flops(g: Graph, vals: dict[str, Val] | None = None) -> int:
    vals = vals or infer_shapes(g)
    total = 0
    for node in g.nodes:
        opdef = REGISTRY.get(node.op)
        if opdef is None or opdef.flops is None:
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
