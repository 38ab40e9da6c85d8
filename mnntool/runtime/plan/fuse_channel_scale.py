"""A squeeze-excite's channel scale x * s (s of shape (1, C, 1, 1)) whose only reader is a 1x1
convolution as one ScaledPointwise node: the convolution's packed weights are scaled by s on each run
(Cout x C products) instead of x (C x H x W). Only where the map has at least Cout pixels, so scaling
the weights costs less than the pass over x it saves (EfficientNet-B0's 112x112 and 56x56 blocks; its
7x7 blocks, 1152 channels into 320, keep the multiply). An int8 convolution takes x * s in the pass that
quantizes its input, at every size."""
from __future__ import annotations

import numpy as np

from ...ir.graph import Node
from .match import past_moves, rewriting, rewritten, users_of
from .state import Planning

OPTIONAL = True
SCALED_POINTWISE = "ScaledPointwise"


def _pointwise_reading(conv: Node, y: str, channels: int) -> bool:
    """A group-1 1x1 convolution (float or int8), stride 1, unpadded, reading y (of `channels` channels)."""
    if conv.op != "Convolution" or conv.inputs != [y]:
        return False
    c = conv.param.get("common", {})
    pads = c.get("pads")
    pads = [] if pads is None else [int(v) for v in np.asarray(pads).reshape(-1)]
    return (c.get("kernelX", 1) == c.get("kernelY", 1) == 1 and c.get("strideX", 1) == c.get("strideY", 1) == 1
            and (c.get("group", 1) or 1) == 1 and not c.get("padX", 0) and not c.get("padY", 0) and not any(pads)
            and c.get("padMode", "CAFFE") != "SAME" and c.get("inputCount", channels) in (0, channels))


def _quantized_by(conv: Node, path: list, stored: dict) -> bool:
    """Whether the tensors from the product to conv are stored on no grid, or only on the one an int8 conv
    casts its input to (as int8_store.quantized_by_readers): its packing pass then rounds the product once,
    as the file does."""
    on = [stored[t] for t in path if t in stored]
    if not on:
        return True
    from ..kernels.micro.epilogue import grid_of
    from ..kernels.ops.conv import int8_scales
    q = int8_scales(conv)
    return q is not None and all(grid_of(*q.input) == grid and float(q.zero_in) == float(zero) for grid, zero in on)


def fuse(p: Planning) -> list[Node]:
    nodes, vals, stored = p.nodes, p.vals, p.stored
    users = users_of(p)
    outputs = set(p.graph.outputs)
    fused, drop = {}, set()
    for m in nodes:
        if m.op != "BinaryOp" or m.param.get("opType") != "MUL" or len(m.inputs) != 2 or len(m.outputs) != 1 or \
                int(m.param.get("activationType", 0) or 0):
            continue
        # layout tags between them (NCHW -> NC4HW4): the same array here
        # (a product the file stores on the int8 grid its convolution reads: see _quantized_by)
        chain, y, conv = past_moves(users, m.outputs[0], outputs, {}, lambda op: op == "ConvertTensor")
        if conv is None or not _quantized_by(conv, [m.outputs[0]] + [n.outputs[0] for n in chain], stored):
            continue
        a, b = (vals.get(i) for i in m.inputs)
        if a is None or b is None or a.shape is None or b.shape is None or a.dtype != "float32" or b.dtype != "float32":
            continue
        x, s = (m.inputs[0], m.inputs[1]) if len(b.shape) == 4 and b.shape[2:] == (1, 1) else (m.inputs[1], m.inputs[0])
        xs, ss = vals[x].shape, vals[s].shape
        if len(xs) != 4 or not all(isinstance(d, int) for d in xs) or xs[0] != 1 or ss != (1, xs[1], 1, 1) or \
                x in stored or s in stored:
            continue
        # an int8 convolution quantizes x * s in its packing pass (ops.conv.scaled_pointwise): always a gain
        int8 = bool((conv.param.get("quanParameter") or {}).get("scaleIn"))
        if not _pointwise_reading(conv, y, xs[1]) or (xs[2] * xs[3] < conv.param["common"]["outputCount"]
                                                       and not int8):
            continue
        fused[id(conv)] = Node(SCALED_POINTWISE, [x, s], list(conv.outputs), f"{conv.name} (+{m.name})",
                               conv.param, conv.param_type, conv.fmt)
        drop.update([id(m)] + [id(n) for n in chain])
    return rewritten(nodes, fused, drop)


run = rewriting(fuse)
