"""An int8 convolution whose output (stored on its int8 grid) is read only by a table op (SiLU, sigmoid,
hard-swish, GELU: kernels.ops.mnn_math.ON_GRID) as one node: the convolution's epilogue writes the op's
value at each output byte (kernels.ops.int8_tables), so neither the convolution's map nor a lookup pass
over it remains. The outputs are those of the two steps unfused, bit for bit (the op's own kernel looks
up the same table). EfficientNet-B0 in int8 spent 5.1 ms of 12.8 a run in those lookup passes (one
Zen 4 core); the float file applies its SiLUs in the convolutions' epilogues (fuse_activations, which
leaves int8 convolutions alone). Not optional: an int8 file's speed against its float file depends
on it, and it changes no value."""
from __future__ import annotations

from ...ir.graph import Node
from ..kernels.micro.epilogue import POST, grid_of
from ..kernels.ops.conv import int8_scales
from ..kernels.ops.int8_tables import TABLE
from ..kernels.ops.mnn_math import ON_GRID
from .match import rewriting, rewritten, users_of
from .state import Planning

OPTIONAL = False


def table_key(n: Node) -> str | None:
    """The ON_GRID key of the table `n` computes on an int8 input, or None."""
    key = {"Sigmoid": "SIGMOID", "FusedSiLU": "FusedSiLU"}.get(n.op)
    if n.op == "UnaryOp":
        key = n.param.get("opType")
    return key if key in ON_GRID else None


def fuse(p: Planning) -> list[Node]:
    nodes, vals = p.nodes, p.vals
    if not p.stored:        # a float file: no convolution's output is stored on a grid (the test below), nothing
        return nodes        # to fuse (planned at every new input shape: its walk cost ~0.1 ms on EfficientNet-B0)
    users = users_of(p)
    outputs = set(p.graph.outputs)
    fused, drop = {}, set()
    for conv in nodes:
        if conv.op not in ("Convolution", "ConvolutionDepthwise") or len(conv.inputs) != 1 or \
                len(conv.outputs) != 1 or TABLE in conv.param or POST in conv.param:
            continue
        q = int8_scales(conv)
        y = conv.outputs[0]
        readers = users.get(y, [])
        if q is None or q.output is None or y in outputs or len(readers) != 1:
            continue
        act = readers[0]
        key = table_key(act)
        if key is None or act.inputs != [y] or len(act.outputs) != 1 or (act.name, y) in p.raw:
            continue
        # the op reads the convolution's output on the grid the convolution rounds to
        if p.stored.get(y) != (grid_of(*q.output), float(q.zero_out)):
            continue
        v, w = vals.get(y), vals.get(act.outputs[0])
        if v is None or w is None or v.dtype != "float32" or w.dtype != "float32" or v.shape != w.shape:
            continue
        fused[id(conv)] = Node(conv.op, list(conv.inputs), list(act.outputs), f"{conv.name} (+{act.name})",
                               {**conv.param, TABLE: key}, conv.param_type, conv.fmt)
        drop.add(id(act))
    return rewritten(nodes, fused, drop)


run = rewriting(fuse)
