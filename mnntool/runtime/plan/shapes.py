"""Shape inference at the plan's input shapes; every tensor checked against the size limit. A graph
whose output shapes depend on values known only at run time (a Reshape to a computed shape, NonZero)
is planned no further: it runs op by op (Session._run_eager)."""
from __future__ import annotations

import numpy as np

from ...errors import InvalidModel
from ...ir.ops import REGISTRY, Val, same
from ...ir.ops.evaluate import infer_node
from ...ir.shape_inference import infer_values
from ..kernels.weight_cache import session_memo
from ...ir.validate import MAX_TENSOR_BYTES
from .state import Planning

OPTIONAL = False


def check_size(name: str, v: Val) -> None:
    if v.shape is None or not all(isinstance(d, int) for d in v.shape):
        return
    size = 1
    for d in v.shape:
        size *= max(d, 0)
    nbytes = size * (np.dtype(v.dtype).itemsize if v.dtype else 4)
    if nbytes > MAX_TENSOR_BYTES:
        raise InvalidModel(f"tensor '{name}' would have shape {list(v.shape)} ({nbytes / 2**30:.1f} GB): "
                           "the model's shapes are corrupt or the input shape is far too large")


_UNKNOWN = Val(None)
_ITEMSIZE: dict = {}
_KEEPS: dict = {}     # op -> whether its definition infers `same` (one output like its first input)


def _same(a: Val, b: Val) -> bool:
    """Equal facts of two value-less Vals (a Val holding an array compares by identity only)."""
    return a.value is None and b.value is None and a.shape == b.shape and a.dtype == b.dtype and \
        a.grid == b.grid and a.zero == b.zero


def infer(g, memo: dict | None) -> dict:
    """ir.ops.evaluate.infer_values(g), with `memo` (a session's, kept across its plans): an op whose
    operands are the Vals it had in the last plan keeps its outputs' Vals, and a Val equal to the last plan's
    is that Val, so an op after a global pool (a squeeze-excite branch) is inferred once, not at every
    input shape. Vals are never written after inference, so plans may share them."""
    if memo is None:
        return infer_values(g)
    vals: dict = {}
    for name in g.inputs:
        t = g.tensors.get(name)
        vals[name] = Val(t.shape, t.dtype) if t is not None else Val(None)
    for name, value in g.constants.items():
        hit = memo.get(("constant", name))
        if hit is None or hit[1] is not value:
            hit = memo[("constant", name)] = (Val(tuple(value.shape), str(value.dtype), value), value)
        vals[name] = hit[0]
    get = vals.get
    for node in g.nodes:
        ins = [get(i, _UNKNOWN) for i in node.inputs]
        ids = tuple(map(id, ins))
        last = memo.get(id(node))
        if last is not None and last[0] == ids:
            outs = last[1]
        else:
            op = node.op
            keeps = _KEEPS.get(op)
            if keeps is None:
                keeps = _KEEPS[op] = op in REGISTRY and REGISTRY[op].infer is same and op != "Input"
            if keeps and ins and any(v.value is None for v in ins) and all(v.shape is not None for v in ins):
                # infer_node's answer for an op whose definition infers `same` where no value is carried
                # (a ConvertTensor, an activation: half of EfficientNet-B0's nodes), without its generic tests
                outs = [Val(ins[0].shape, ins[0].dtype)] + [_UNKNOWN] * (len(node.outputs) - 1)
            else:
                outs = infer_node(node, ins)
            if last is not None and len(outs) == len(last[1]):
                outs = [b if _same(a, b) else a for a, b in zip(outs, last[1])]
            memo[id(node)] = (ids, outs, node, ins)     # (the node and operands held: their ids stay theirs)
        for name, v in zip(node.outputs, outs):
            vals[name] = v
    return vals


def _check(name: str, v: Val) -> bool:
    """False where the shape is not known; raises where the tensor is past the size limit."""
    shape = v.shape
    if shape is None:
        return False
    size = 1
    for d in shape:
        if type(d) is not int:
            return False
        size *= max(d, 0)
    dtype = v.dtype
    itemsize = _ITEMSIZE.get(dtype)
    if itemsize is None:
        itemsize = _ITEMSIZE[dtype] = np.dtype(dtype).itemsize if dtype else 4
    if size * itemsize > MAX_TENSOR_BYTES:
        check_size(name, v)
    return True


def run(p: Planning) -> None:
    g = p.graph
    # the Vals only: the graph's tensor facts are the session's, shared by its plans (Session._shaped)
    vals = infer(g, session_memo("shapes"))
    eager = False
    for n in g.nodes:
        for o in n.outputs:
            if o and not _check(o, vals.get(o) or _UNKNOWN):
                eager = True
    for name in g.inputs:
        check_size(name, vals[name])
    p.vals, p.nodes = vals, list(g.nodes)
    for name in list(g.inputs) + list(g.constants):
        p.slot(name)
    p.eager = eager
