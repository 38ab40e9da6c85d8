"""A float convolution (ReLU fused or none) whose output is only multiplied by a scalar constant and/or has
one added, one op reading the last (HGNetV2's learnable affine blocks: relu(conv) * s + b after each of
hgnetv2_b0's 21 convolutions), folded into the convolution: relu(y) * s + b = clip(s y + b, b, inf) for
s > 0 (clip(-inf, b) for s < 0), so the weights and bias are scaled by s, b joins the bias and the bound
is the epilogue's fused clip (epilogue.POST_CLIP). Each op was a pass over the map (hgnetv2_b0's 42: 0.6
of 10 ms, 1 thread). Not where a tensor on the way is stored on an int8 grid."""
from __future__ import annotations

import numpy as np

from ...ir.graph import Node
from ..kernels.micro.epilogue import POST, POST_CLIP
from .match import rewriting, rewritten, users_of
from .state import Planning

OPTIONAL = True
_STEPS = 2      # ops folded after one convolution: a multiply and an add, in either order


def _plain(conv: Node) -> bool:
    c = conv.param.get("common") or {}
    w = conv.param.get("weight")
    return (conv.op in ("Convolution", "ConvolutionDepthwise") and len(conv.inputs) == 1 and w is not None
            and np.size(w) > 0 and conv.param.get("quanParameter") is None
            and conv.param.get("symmetricQuan") is None and not c.get("relu6") and POST not in conv.param)


def _scalar_step(n: Node, t: str, p: Planning) -> tuple | None:
    """("MUL" | "ADD", c) when n is t * c or t + c for a float scalar constant c, the shape kept."""
    if n.op != "BinaryOp" or n.param.get("opType") not in ("MUL", "ADD") or len(n.inputs) != 2 or \
            len(n.outputs) != 1 or int(n.param.get("activationType", 0) or 0) or t not in n.inputs:
        return None
    other = n.inputs[1] if n.inputs[0] == t else n.inputs[0]
    c = p.graph.constants.get(other)
    vt, vo = p.vals.get(t), p.vals.get(n.outputs[0])
    if c is None or np.size(c) != 1 or np.asarray(c).dtype != np.float32 or vt is None or vo is None or \
            vt.shape != vo.shape or vo.dtype != "float32":
        return None
    return n.param["opType"], float(np.asarray(c).reshape(-1)[0])


def fuse(p: Planning) -> list[Node]:
    nodes, stored = p.nodes, p.stored
    consts = p.graph.constants
    # no multiply or add by a one-element constant (what _scalar_step needs): nothing to fold (planned at every new
    # input shape: the walk below cost ~0.1 ms on EfficientNet-B0, which has none)
    if not any(n.op == "BinaryOp" and any(i in consts and np.size(consts[i]) == 1 for i in n.inputs) for n in nodes):
        return nodes
    users = users_of(p)
    outputs = set(p.graph.outputs)
    fused, drop = {}, set()
    for conv in nodes:
        if not _plain(conv):
            continue
        s, b, t, folded = 1.0, 0.0, conv.outputs[0], []
        while len(folded) < _STEPS:
            us = users.get(t, [])
            if len(us) != 1 or t in outputs or t in stored:
                break
            step = _scalar_step(us[0], t, p)
            if step is None:
                break
            kind, c = step
            s, b = (s * c, b * c) if kind == "MUL" else (s, b + c)
            folded.append(us[0])
            t = us[0].outputs[0]
        if not folded or s == 0.0 or t in stored or not np.isfinite(s) or not np.isfinite(b):
            continue
        common = dict(conv.param["common"])
        cout = int(common.get("outputCount") or 0)
        w = np.asarray(conv.param["weight"], np.float32).reshape(-1) * np.float32(s)
        bias = np.asarray(conv.param.get("bias", []), np.float32).reshape(-1)
        bias = (bias if bias.size == cout else np.zeros(cout, np.float32)) * np.float32(s) + np.float32(b)
        param = {**conv.param, "weight": w, "bias": bias.astype(np.float32)}
        if common.get("relu"):
            common["relu"] = False
            param[POST] = (POST_CLIP, b, float("inf")) if s > 0 else (POST_CLIP, float("-inf"), b)
        param["common"] = common
        name = f"{conv.name} (scaled by {', '.join(n.name for n in folded)})"
        fused[id(conv)] = Node(conv.op, list(conv.inputs), [t], name, param, conv.param_type, conv.fmt)
        drop.update(id(n) for n in folded)
    return rewritten(nodes, fused, drop)


run = rewriting(fuse)
