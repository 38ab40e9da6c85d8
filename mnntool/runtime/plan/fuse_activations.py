"""A float convolution (or Scale: a BatchNorm left unfolded) whose only reader is an activation (SiLU,
HardSwish, GELU, sigmoid, tanh, leaky ReLU, clip) as one node that applies it in its epilogue (param
epilogue.POST): the convolution's output is never written to memory and read back. Reshapes between them
(a transformer's Linear as a 1x1 convolution between two reshapes) stay, after the activation. Not
where the convolution's output is stored on an int8 grid (MNN rounds it before the activation reads
it), nor the activation's, unless it is a clip (ReLU, ReLU6) read directly: exact in any order.
Before `fuse_channel_scale`, which may follow the convolution."""
from __future__ import annotations

from ...ir.graph import Node
from ...ir.ops import is_view
from ..kernels.micro.epilogue import (POST, POST_CLIP, POST_GELU, POST_GELU_TANH, POST_HARDSWISH, POST_LEAKY,
                                      POST_SIGMOID, POST_SILU, POST_TANH)
from .fuse_silu import FUSED_SILU
from .match import by_nodes, made_node, past_moves, rewriting, rewritten, users_of
from .state import Planning

OPTIONAL = True
_UNARY_POSTS = {"SIGMOID": POST_SIGMOID, "SILU": POST_SILU, "HARDSWISH": POST_HARDSWISH, "GELU": POST_GELU_TANH,
                "GELU_STANDARD": POST_GELU, "TANH": POST_TANH}


def post_of(n: Node) -> tuple | None:
    """The activation node `n` computes as a Post (epilogue.POST_*, alpha, beta), or None."""
    if n.op == FUSED_SILU:
        return (POST_SILU, 0.0, 0.0)
    if n.op == "Sigmoid":
        return (POST_SIGMOID, 0.0, 0.0)
    if n.op == "TanH":
        return (POST_TANH, 0.0, 0.0)
    if n.op == "UnaryOp" and n.param.get("opType") in _UNARY_POSTS:
        return (_UNARY_POSTS[n.param["opType"]], 0.0, 0.0)
    if n.op == "ReLU":
        slope = float(n.param.get("slope", 0.0) or 0.0)
        return (POST_LEAKY, slope, 0.0) if slope else (POST_CLIP, 0.0, float("inf"))
    if n.op == "ReLU6":
        return (POST_CLIP, float(n.param.get("minValue", 0.0)), float(n.param.get("maxValue", 6.0)))
    return None


def _pairs(p: Planning) -> list[tuple]:
    """(convolution, its output, the views between, the activation's input, the activation, its Post) of every
    pair the nodes alone allow (match.by_nodes: the Vals are tested at each shape)."""
    nodes, stored = p.nodes, p.stored
    users = users_of(p)
    outputs = set(p.graph.outputs)
    found = []
    for conv in nodes:
        if conv.op not in ("Convolution", "ConvolutionDepthwise", "Scale") or len(conv.inputs) != 1 or \
                POST in conv.param or (conv.param.get("quanParameter") or {}).get("scaleIn"):
            continue
        y = conv.outputs[0]
        # reshapes between (a Linear as a 1x1 convolution): the activation moves before them
        chain, t, act = past_moves(users, y, outputs, stored, is_view, limit=8)
        post = post_of(act) if act is not None else None
        # a clip's output stored on a grid: the same values rounded the same way after the fused node
        # (DenseNet's BatchNorm + ReLU before each int8 convolution: 3.5 ms of 31.5 a run unfused)
        if post is None or act.inputs[0] != t or len(act.outputs) != 1 or \
                (act.outputs[0] in stored and (chain or post[0] != POST_CLIP)):
            continue
        found.append((conv, y, chain, t, act, post))
    return found


def fuse(p: Planning) -> list[Node]:
    nodes, vals = p.nodes, p.vals
    fused, drop = {}, set()
    for conv, y, chain, t, act, post in by_nodes(p, "fuse_activations", _pairs):
        v, u, w = vals.get(y), vals.get(t), vals.get(act.outputs[0])
        if v is None or u is None or w is None or v.dtype != "float32" or w.dtype != "float32" or u.shape != w.shape:
            continue
        name = f"{conv.name} (+{act.name})"
        if not chain:
            fused[id(conv)] = made_node(p, ("act", id(conv), id(act)), (conv, act), lambda: Node(
                conv.op, list(conv.inputs), list(act.outputs), name, {**conv.param, POST: post}, conv.param_type,
                conv.fmt))
        else:       # the activation before the reshapes; the last reshape writes the activation's tensor
            fused[id(conv)] = Node(conv.op, list(conv.inputs), [y], name, {**conv.param, POST: post},
                                   conv.param_type, conv.fmt)
            last = chain[-1]
            fused[id(last)] = Node(last.op, list(last.inputs), list(act.outputs), last.name, last.param,
                                   last.param_type, last.fmt)
        drop.add(id(act))
    return rewritten(nodes, fused, drop)


run = rewriting(fuse)
