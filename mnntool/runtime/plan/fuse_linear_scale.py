"""A Scale (a BatchNorm the converter kept) reading a float convolution's output through views, one
value a channel on each side (a linear layer over tokens, LeViT's Linear + BatchNorm1d: (tokens, C, 1, 1)
-> (tokens, C)), is folded into the convolution's weights and bias: y = s (W x + b) + t = (s W) x + (s b
+ t). The converter leaves them apart (the Reshapes between them are not a convolution's output in
MNN's terms); here each was a step and a pass over the tokens (LeViT-128s: 47 of them)."""
from __future__ import annotations

import numpy as np

from ...ir.graph import Node, producers_of
from ...ir.ops import is_convolution, is_view
from ..kernels.micro.epilogue import POST
from .match import rewriting, sole_reader, users_of
from .state import Planning

OPTIONAL = True
STARTS = frozenset({"Scale"})      # ops a match starts from: without one the stage has nothing to do


def _channels_only(shape) -> int | None:
    """C for a shape (N, C, 1, ...), else None."""
    if shape is None or len(shape) < 2 or not all(isinstance(d, int) for d in shape):
        return None
    return int(shape[1]) if int(np.prod(shape[2:], dtype=np.int64)) == 1 else None


def _plain_float(conv: Node) -> bool:
    c = conv.param.get("common") or {}
    w = conv.param.get("weight")
    return (conv.op == "Convolution" and is_convolution(conv.op) and len(conv.inputs) == 1 and w is not None
            and np.size(w) > 0 and conv.param.get("quanParameter") is None and conv.param.get("symmetricQuan") is None
            and not c.get("relu") and not c.get("relu6") and POST not in conv.param)


def _scale_of(node: Node, cout: int):
    """(s, t) of a Scale with `cout` channels and no fused activation, else None."""
    if node.op != "Scale" or POST in node.param or len(node.inputs) != 1:
        return None
    s = np.asarray(node.param.get("scaleData", []), np.float32).reshape(-1)
    t = node.param.get("biasData")
    t = np.asarray(t, np.float32).reshape(-1) if t is not None and len(t) else np.zeros_like(s)
    return (s, t) if s.size == cout and t.size == cout else None


def fuse(p: Planning) -> list[Node]:
    nodes, vals, stored = p.nodes, p.vals, p.stored
    users, producer = users_of(p), producers_of(nodes)
    outputs = set(p.graph.outputs)
    replace, drop, rename = {}, set(), {}
    for sc in nodes:
        if sc.op != "Scale" or sc.outputs[0] in outputs or sc.outputs[0] in stored:
            continue
        v = vals.get(sc.inputs[0])
        cout = _channels_only(v.shape if v is not None else None)
        if cout is None or v.dtype != "float32":
            continue
        # back through views, each tensor read by the next node only
        t, conv = sc.inputs[0], None
        while True:
            if sole_reader(users, t, outputs, stored) is None:
                break
            n = producer.get(t)
            if n is None:
                break
            if is_view(n.op) and len(n.outputs) == 1 and n.inputs:
                t = n.inputs[0]
                continue
            conv = n
            break
        if conv is None or not _plain_float(conv) or id(conv) in replace:
            continue
        co = vals.get(conv.outputs[0])
        c = conv.param["common"]
        if co is None or _channels_only(co.shape) != cout or c.get("outputCount") != cout:
            continue
        got = _scale_of(sc, cout)
        if got is None:
            continue
        s, shift = got
        w = np.asarray(conv.param["weight"], np.float32).reshape(cout, -1) * s[:, None]
        b = np.asarray(conv.param.get("bias", np.zeros(cout)), np.float32).reshape(-1)
        b = (b if b.size == cout else np.zeros(cout, np.float32)) * s + shift
        param = {**conv.param, "weight": w.reshape(-1), "bias": b.astype(np.float32)}
        replace[id(conv)] = Node(conv.op, list(conv.inputs), list(conv.outputs), f"{conv.name} (folded {sc.name})",
                                 param, conv.param_type, conv.fmt)
        drop.add(id(sc))
        rename[sc.outputs[0]] = sc.inputs[0]
    if not drop:
        return nodes
    out = []
    for n in nodes:
        if id(n) in drop:
            continue
        n = replace.get(id(n), n)
        if any(i in rename for i in n.inputs):
            n = Node(n.op, [rename.get(i, i) for i in n.inputs], list(n.outputs), n.name, n.param, n.param_type, n.fmt,
                     n.graphs)
        out.append(n)
    return out


run = rewriting(fuse)
