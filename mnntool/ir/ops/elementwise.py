"""Elementwise ops: one output shaped like the (broadcast) inputs."""
from __future__ import annotations

from . import Val, numel, register

COMPARE = {"GREATER", "GREATER_EQUAL", "LESS", "LESS_EQUAL", "EQUAL", "NOTEQUAL"}


def broadcast(*shapes):
    if any(s is None for s in shapes):
        return None
    rank = max(len(s) for s in shapes)
    out = []
    for i in range(rank):
        dims = [s[i - rank + len(s)] for s in shapes if i - rank + len(s) >= 0]
        known = [d for d in dims if d != 1]
        if not known:
            out.append(1)
            continue
        ints = {d for d in known if isinstance(d, int)}
        if len(ints) > 1:
            raise ValueError(f"shapes {shapes} do not broadcast")
        out.append(ints.pop() if ints else known[0])
    return tuple(out)


def _same(node, ins):
    return [Val(ins[0].shape, ins[0].dtype)]


def _flops_out(node, ins, outs):
    return numel(outs[0].shape)


for _name, _param in [("ReLU", "Relu"), ("ReLU6", "Relu6"), ("PReLU", "PRelu"), ("Sigmoid", None),
                      ("TanH", None), ("UnaryOp", "UnaryOp"), ("Scale", "Scale"), ("ELU", "ELU"),
                      ("Softmax", "Axis"), ("LayerNorm", "LayerNorm")]:
    register(_name, _param, flops=_flops_out)(_same)
for _name, _param in [("Dropout", None), ("Identity", None), ("ConvertTensor", "TensorConvertInfo")]:
    register(_name, _param)(_same)   # data movement: no arithmetic


@register("BinaryOp", "BinaryOp", flops=_flops_out)
def _binary(node, ins):
    dtype = "bool" if node.param.get("opType") in COMPARE else ins[0].dtype
    return [Val(broadcast(ins[0].shape, ins[1].shape), dtype)]


@register("Select", None, flops=_flops_out)
def _select(node, ins):
    return [Val(broadcast(ins[0].shape, ins[1].shape, ins[2].shape), ins[1].dtype)]


@register("Cast", "CastParam")
def _cast(node, ins):
    from ...format.dtypes import from_mnn
    return [Val(ins[0].shape, from_mnn(node.param.get("dstT", "DT_FLOAT")))]
