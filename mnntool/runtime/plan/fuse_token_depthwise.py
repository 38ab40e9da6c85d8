"""A float depthwise convolution between two token/plane transposes as one TokenDepthwise step
(kernels/ops/token_depthwise.py) on the tokens: t (B, N, C) -> Permute (0, 2, 1) -> Reshape (B, C, H, W)
-> ConvolutionDepthwise -> Reshape (B, C, N') -> Permute (0, 2, 1) -> (B, N', C), through any views
(ir.ops.is_view: the Reshapes, the ConvertTensors of MNN's layout; the shapes at both ends checked).
PVT-v2's MLP (its "DWConv") does this in every block: at 1 x 3136 x 256 the two transposes cost more
than the convolution (AMD EPYC Zen 4, 1 thread: ~1.7 ms the three steps in a session, ~1.1 ms the
fused step). Not where a tensor on the way is stored
on an int8 grid, is a graph output or has another reader, nor for a convolution with a fused activation
other than ReLU/ReLU6 (those become the step's clip). An activation without parameters reading the
result (PVT's GELU) is applied in the step's epilogue (a pass over the tokens less)."""
from __future__ import annotations

import numpy as np

from ...ir.graph import Node
from ...ir.ops import is_view
from ...ir.ops.nn import pads_of
from ..kernels.micro.epilogue import POST
from ..kernels.ops.token_depthwise import ACTIVATIONS
from .fuse_activations import post_of
from .match import fixed_shape, rewriting, rewritten, sole_reader, users_of
from .state import Planning

OPTIONAL = True
STARTS = frozenset({"ConvolutionDepthwise"})      # ops a match starts from: without one the stage has nothing to do


def _swap(n: Node | None) -> bool:
    """A Permute of a rank-3 tensor swapping its last two axes."""
    return n is not None and n.op == "Permute" and [int(d) for d in np.asarray(n.param.get("dims", [])).reshape(-1)] \
        == [0, 2, 1]


def _geometry(conv: Node, shape) -> dict | None:
    """The step's geometry params of a float depthwise convolution over `shape` (B, C, H, W), or None."""
    prm = conv.param
    c = prm.get("common") or {}
    w, ch = prm.get("weight"), shape[1]
    if len(conv.inputs) != 1 or w is None or prm.get("quanParameter") is not None or POST in prm or \
            c.get("padMode", "CAFFE") != "CAFFE" or (c.get("group") or 1) != ch or c.get("outputCount") != ch:
        return None
    kh, kw = int(c.get("kernelY", 1)), int(c.get("kernelX", 1))
    if np.size(w) != ch * kh * kw:
        return None
    pads = pads_of(c)      # top, left, bottom, right
    bias = np.asarray(prm.get("bias", []), np.float32).reshape(-1)
    clip = (0.0, 6.0) if c.get("relu6") else (0.0, float("inf")) if c.get("relu") else (float("-inf"), float("inf"))
    return {"taps": np.ascontiguousarray(np.asarray(w, np.float32).reshape(ch, kh * kw).T),
            "bias": bias if bias.size == ch else np.zeros(ch, np.float32),
            "hw": (int(shape[2]), int(shape[3])), "kernel": (kh, kw),
            "stride": (int(c.get("strideY", 1)), int(c.get("strideX", 1))), "pad": (pads[0], pads[1]),
            "dilation": (int(c.get("dilateY", 1)), int(c.get("dilateX", 1))), "clip": clip}


def fuse(p: Planning) -> list[Node]:
    nodes, vals, stored = p.nodes, p.vals, p.stored
    if not any(n.op == "Permute" for n in nodes):   # no transposes around (_swap): a CNN's depthwise layers, planned
        return nodes                                # at every new input shape (the walk cost ~0.1 ms)
    users = users_of(p)
    producers = {o: n for n in nodes for o in n.outputs}
    outputs = set(p.graph.outputs)

    def floats(t: str) -> bool:
        return fixed_shape(vals, t) is not None and vals[t].dtype == "float32" and t not in stored

    fused, drop = {}, set()
    for conv in nodes:
        if conv.op != "ConvolutionDepthwise" or not conv.inputs or not floats(conv.inputs[0]) or \
                not floats(conv.outputs[0]):
            continue
        shape, oshape = fixed_shape(vals, conv.inputs[0]), fixed_shape(vals, conv.outputs[0])
        if len(shape) != 4 or len(oshape) != 4:
            continue
        # back from the convolution's input through views to the first transpose
        before, t = [], conv.inputs[0]
        while (n := producers.get(t)) is not None and is_view(n.op) and \
                sole_reader(users, n.outputs[0], outputs, stored) is not None:
            before.append(n)
            t = n.inputs[0]
        first = producers.get(t)
        if not _swap(first) or sole_reader(users, t, outputs, stored) is None or not floats(first.inputs[0]):
            continue
        tokens = fixed_shape(vals, first.inputs[0])
        if len(tokens) != 3 or tokens != (shape[0], shape[2] * shape[3], shape[1]):
            continue
        # forward from its output through views to the transpose back
        after, t = [], conv.outputs[0]
        while (n := sole_reader(users, t, outputs, stored)) is not None and is_view(n.op):
            after.append(n)
            t = n.outputs[0]
        last = sole_reader(users, t, outputs, stored)
        if not _swap(last) or not floats(last.outputs[0]) or \
                fixed_shape(vals, last.outputs[0]) != (oshape[0], oshape[2] * oshape[3], oshape[1]):
            continue
        geo = _geometry(conv, shape)
        if geo is None:
            continue
        geo["out_hw"] = (int(oshape[2]), int(oshape[3]))
        out, taken = last.outputs[0], [first, last] + before + after
        act = sole_reader(users, out, outputs, stored)
        post = post_of(act) if act is not None and len(act.inputs) == 1 and len(act.outputs) == 1 else None
        if post is not None and post[0] in ACTIVATIONS and floats(act.outputs[0]) and \
                fixed_shape(vals, act.outputs[0]) == fixed_shape(vals, out):
            geo["act"], out = post[0], act.outputs[0]
            taken.append(act)
        fused[id(conv)] = Node("TokenDepthwise", [first.inputs[0]], [out],
                               f"{conv.name} (on tokens: {', '.join(n.name for n in taken[:2] + taken[-1:])})", geo)
        drop.update(id(n) for n in taken)
    return rewritten(nodes, fused, drop)


run = rewriting(fuse)
