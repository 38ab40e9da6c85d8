"""A squeeze-excite's channel scale x * s (s of shape (1, C, 1, 1)) whose only reader is a 1x1
convolution as one ScaledPointwise node: the convolution's packed weights are scaled by s on each run
(Cout x C products) instead of x (C x H x W). Only where the map has at least Cout pixels, so scaling
the weights costs less than the pass over x it saves (EfficientNet-B0's 112x112 and 56x56 blocks; its
7x7 blocks, 1152 channels into 320, keep the multiply). An int8 convolution takes x * s in the pass that
quantizes its input, at every size; and a Scale (an unfolded BatchNorm, its ReLU fused) read only by an
int8 1x1 convolution goes into that pass too (AffinePointwise: DenseNet's pre-activations)."""
from __future__ import annotations

import numpy as np

from ...ir.graph import Node
from .match import by_nodes, made_node, past_moves, rewriting, rewritten, users_of
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


def _products(p: Planning) -> list[tuple]:
    """(the multiply, the layout tags after it, their last tensor, the convolution reading it) of every product the
    nodes alone allow, and (the Scale, None, None, None) for each Scale, in the nodes' order (match.by_nodes: the
    Vals are tested at each shape)."""
    users = users_of(p)
    outputs = set(p.graph.outputs)
    found = []
    for m in p.nodes:
        if m.op == "Scale":
            found.append((m, None, None, None))
            continue
        if m.op != "BinaryOp" or m.param.get("opType") != "MUL" or len(m.inputs) != 2 or len(m.outputs) != 1 or \
                int(m.param.get("activationType", 0) or 0):
            continue
        # layout tags between them (NCHW -> NC4HW4): the same array here
        # (a product the file stores on the int8 grid its convolution reads: see _quantized_by)
        chain, y, conv = past_moves(users, m.outputs[0], outputs, {}, lambda op: op == "ConvertTensor")
        if conv is None or not _quantized_by(conv, [m.outputs[0]] + [n.outputs[0] for n in chain], p.stored):
            continue
        found.append((m, chain, y, conv))
    return found


def fuse(p: Planning) -> list[Node]:
    nodes, vals, stored = p.nodes, p.vals, p.stored
    fused, drop = {}, set()
    for m, chain, y, conv in by_nodes(p, "fuse_channel_scale", _products):
        if chain is None:
            _scale_into_int8(m, users_of(p), set(p.graph.outputs), p, fused, drop)
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
        fused[id(conv)] = made_node(p, ("scaled", id(conv), id(m), x), (conv, m), lambda: Node(
            SCALED_POINTWISE, [x, s], list(conv.outputs), f"{conv.name} (+{m.name})", conv.param, conv.param_type,
            conv.fmt))
        drop.update([id(m)] + [id(n) for n in chain])
    return rewritten(nodes, fused, drop)


def _scale_into_int8(m: Node, users, outputs, p: Planning, fused: dict, drop: set) -> None:
    """A Scale (a BatchNorm left unfolded, DenseNet's pre-activations, with its ReLU fused) read only by an
    int8 1x1 convolution: one AffinePointwise node (ops.conv.affine_pointwise), the Scale computed in the
    convolution's packing pass as ops.scale computes it."""
    from ..kernels.micro.epilogue import NO_POST, POST, POST_CLIP, POST_NONE
    from ..kernels.ops.conv import AFFINE, int8_scales
    if len(m.inputs) != 1 or len(m.outputs) != 1:
        return
    chain, y, conv = past_moves(users, m.outputs[0], outputs, {}, lambda op: op == "ConvertTensor")
    if conv is None or int8_scales(conv) is None or \
            not _quantized_by(conv, [m.outputs[0]] + [n.outputs[0] for n in chain], p.stored):
        return
    x = m.inputs[0]
    v = p.vals.get(x)
    if v is None or v.shape is None or v.dtype != "float32" or len(v.shape) != 4 or x in p.stored or \
            not all(isinstance(d, int) for d in v.shape) or v.shape[0] != 1 or not _pointwise_reading(conv, y, v.shape[1]):
        return
    from ..kernels.weight_cache import node_part

    def make():
        sc = np.ascontiguousarray(np.asarray(m.param.get("scaleData"), np.float32).reshape(-1))
        b = m.param.get("biasData")
        b = np.ascontiguousarray(np.asarray(b, np.float32).reshape(-1)) if b is not None and len(b) else np.zeros_like(sc)
        kind, alpha, beta = m.param.get(POST, NO_POST)
        return sc, b, int(kind), np.float32(alpha), np.float32(beta)
    # one object per Scale while the session plans: the kernels of later plans are shared (plan/reuse keys by id)
    affine = node_part("scale_affine", (m.param.get("scaleData"), m.param.get("biasData"), m.param.get(POST)), make)
    sc, b, kind = affine[:3]
    if sc.size != v.shape[1] or b.size != sc.size or kind not in (POST_NONE, POST_CLIP):
        return
    fused[id(conv)] = Node("AffinePointwise", [x], list(conv.outputs), f"{conv.name} (+{m.name})",
                           {**conv.param, AFFINE: affine}, conv.param_type, conv.fmt)
    drop.update([id(m)] + [id(n) for n in chain])


run = rewriting(fuse)
