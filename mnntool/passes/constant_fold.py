"""Evaluate, at conversion time, every op whose inputs are all constants, and every shape computation
whose answer is known once the tensor shapes are (Shape, Rank and the arithmetic on them)."""
from __future__ import annotations

import numpy as np

from ..ir.graph import Graph
from ..ir.ops import REGISTRY, Val, grows, numel
from ..ir.shape_inference import infer_shapes

MAX_FOLDED = 1 << 22     # elements; larger results stay computed at run time (file size)
KEEP = {"Input"}


def _evaluate(node, ins: list[Val], outs: list[Val]):
    """The outputs from the op's own definition (ir/ops), or None when it has none or they would be
    larger than MAX_FOLDED."""
    opdef = REGISTRY.get(node.op)
    if opdef is None or any(numel(v.shape) > MAX_FOLDED if v.shape is not None else grows(node.op)
                            for v in outs):
        return None
    with np.errstate(all="ignore"):
        return opdef.evaluate(node, [np.asarray(v.value) for v in ins])


class ConstantFoldPass:
    name = "constant_fold"

    def __call__(self, g: Graph) -> bool:
        changed = False
        vals = infer_shapes(g)
        for node in list(g.nodes):
            if node.op in KEEP or not node.outputs:
                continue
            outs = [vals.get(o, Val(None)) for o in node.outputs]
            if all(v.value is not None for v in outs):
                values = [np.asarray(v.value) for v in outs]
            elif node.inputs and all(i in g.constants for i in node.inputs if i):
                ins = [Val(tuple(g.constants[i].shape), str(g.constants[i].dtype), g.constants[i]) for i in node.inputs]
                try:
                    values = _evaluate(node, ins, outs)
                except Exception:
                    values = None
                if values is None:
                    continue
            else:
                continue
            if any(v.size > MAX_FOLDED for v in values):
                continue
            for name, v in zip(node.outputs, values):
                v = v.astype(np.int32) if v.dtype == np.int64 else v
                v = v.astype(np.int32) if v.dtype == np.bool_ else v
                v = v.astype(np.float32) if v.dtype == np.float64 else v
                g.constants[name] = v
                info = g.info(name)
                info.shape, info.dtype = tuple(v.shape), str(v.dtype)
                vals[name] = Val(tuple(v.shape), str(v.dtype), v)
            g.nodes.remove(node)
            changed = True
        return changed
