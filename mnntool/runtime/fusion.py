"""Chains the planner runs as one kernel, found on the graph being planned (the file keeps the ops
MNN runs). Attention as exporters write it,

    scores = MatMul(q, k)  [+ mask]  -> Softmax(last axis)  [-> Where(IsNaN(p), 0, p)]  -> MatMul(p, v)

becomes one FusedAttention step: the scores are written once, masked and normalised in place, and
multiplied by v, instead of 3 to 6 steps each passing over the L x L scores. The others: SiLU as
x * sigmoid(x); activations into the convolution before them; a channel scale into the pointwise
convolution after it; an embedding's negative-index fix read through; a residual Add with the
LayerNorm of its sum; ShuffleNet's channel shuffle. `fused_nodes` applies them all, in order."""
from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Node
from .kernels.grid import (POST, POST_CLIP, POST_GELU, POST_GELU_TANH, POST_HARDSWISH, POST_LEAKY, POST_SIGMOID,
                           POST_SILU, POST_TANH)

FUSED_ATTENTION = "FusedAttention"


def _known(v) -> bool:
    return v is not None and v.shape is not None and all(isinstance(d, int) for d in v.shape) and len(v.shape) >= 2


def readers(nodes: list[Node]) -> dict[str, list[Node]]:
    """Each tensor's reading nodes (a node reading a tensor twice, IsNaN as x != x, counts once)."""
    users: dict[str, list[Node]] = {}
    for n in nodes:
        for i in dict.fromkeys(n.inputs):
            users.setdefault(i, []).append(n)
    return users


def sole_reader(users: dict, outputs: set, name: str) -> Node | None:
    """The one node reading `name` when it is not a graph output and nothing else reads it, else None:
    a chain may drop a tensor only then."""
    us = users.get(name, [])
    return us[0] if len(us) == 1 and name not in outputs else None


def _fixed_shape(vals: dict, name: str) -> tuple | None:
    """The tensor's shape when shape inference knows every dim, else None."""
    v = vals.get(name)
    return tuple(v.shape) if v is not None and v.shape is not None and all(isinstance(d, int) for d in v.shape) \
        else None


def fuse_attention(g: Graph, vals: dict) -> list[Node]:
    """g's nodes with each attention chain replaced by one FusedAttention node (g is not changed)."""
    users, producer = readers(g.nodes), g.producers()
    outputs = set(g.outputs)

    def only_user(name):
        return sole_reader(users, outputs, name)

    replace: dict[int, Node] = {}
    drop: set[int] = set()
    idx = {id(n): k for k, n in enumerate(g.nodes)}
    for sm in g.nodes:
        if sm.op != "Softmax" or not _known(vals.get(sm.inputs[0])):
            continue
        rank = len(vals[sm.inputs[0]].shape)
        if int(sm.param.get("axis", -1)) % rank != rank - 1:
            continue
        chain, mask = [sm], None
        src = producer.get(sm.inputs[0])
        if src is not None and src.op == "BinaryOp" and src.param.get("opType") == "ADD" and \
                int(src.param.get("activationType", 0)) == 0 and only_user(src.outputs[0]) is sm:
            mm_out, mask = src.inputs
            if producer.get(mm_out) is None or producer[mm_out].op != "MatMul":
                mask, mm_out = mm_out, mask
            chain.insert(0, src)
            src = producer.get(mm_out)
        mm1 = src
        if mm1 is None or mm1.op != "MatMul" or len(mm1.inputs) != 2 or mm1.param.get("transposeA") or \
                only_user(mm1.outputs[0]) is not chain[0]:
            continue
        if mask is not None and (not _known(vals.get(mask)) or vals[mask].dtype != "float32"):
            continue
        p, guard = sm.outputs[0], False
        nxt = users.get(p, [])
        if len(nxt) == 2 and {u.op for u in nxt} == {"BinaryOp", "Select"}:    # IsNaN(p) ? 0 : p
            ne = next(u for u in nxt if u.op == "BinaryOp")
            sel = next(u for u in nxt if u.op == "Select")
            if ne.param.get("opType") == "NOTEQUAL" and ne.inputs == [p, p] and only_user(ne.outputs[0]) is sel and \
                    sel.inputs[0] == ne.outputs[0] and sel.inputs[2] == p and g.scalar(sel.inputs[1]) == 0.0:
                chain += [ne, sel]
                p, guard = sel.outputs[0], True
        mm2 = only_user(p) if p not in outputs else None
        if mm2 is None or mm2.op != "MatMul" or len(mm2.inputs) != 2 or mm2.inputs[0] != p or \
                mm2.param.get("transposeA") or mm2.param.get("transposeB"):
            continue
        if not (len(users.get(sm.outputs[0], [])) == (2 if guard else 1)):
            continue
        q, k, v = mm1.inputs[0], mm1.inputs[1], mm2.inputs[1]
        # q and k scaled by positive constants (an exporter's 1/sqrt(sqrt(d)) on each): the softmax takes
        # the product in its exponent instead, two passes over q and k fewer; under a mask, which adds to
        # the scaled scores, the scores are scaled before it ("score_scale").
        scale, scalers = 1.0, []
        reader = {q: mm1, k: mm1, v: mm2}       # each operand's reader inside the chain
        for name in (q, k):
            mul = producer.get(name)
            if mul is None or mul.op != "BinaryOp" or mul.param.get("opType") != "MUL" or \
                    int(mul.param.get("activationType", 0)) or only_user(name) is not mm1:
                continue
            factor = next((g.scalar(c) for c in mul.inputs if g.scalar(c) is not None), None)
            other = next((i for i in mul.inputs if g.scalar(i) is None), None)
            if factor is None or factor <= 0 or other is None or not _known(vals.get(other)) or \
                    vals[other].shape != vals[name].shape:
                continue
            scale *= factor
            scalers.append(mul)
            reader[other] = mul
            q, k = (other, k) if name == q else (q, other)
        if not all(_known(vals.get(x)) and vals[x].dtype == "float32" for x in (q, k, v, mm2.outputs[0])):
            continue
        # head splits and transposes before q, k and v (Permute, through Reshapes) replayed as numpy views
        # in the step, and the head merge after it (one Permute) as the view the step writes through: a
        # tiny transformer's 5 Permute steps a layer, each a copy and ~1.4 us of dispatch, become 0-1
        views, moved = [], []
        inputs = []
        for name in (q, k, v):
            raw, chain_ops, nodes_ = _view_chain(name, producer, only_user, reader[name], vals)
            inputs.append(raw)
            views.append(chain_ops)
            moved += nodes_
        out, out_perm = mm2.outputs[0], None
        perm_node = only_user(out) if out not in outputs else None
        if perm_node is not None and perm_node.op == "Permute" and _known(vals.get(perm_node.outputs[0])):
            out, out_perm = perm_node.outputs[0], [int(d) for d in perm_node.param["dims"]]
            moved.append(perm_node)
        params = {"transposeB": bool(mm1.param.get("transposeB")), "guard": guard}
        if mask is None:
            params["scale"] = scale
        else:
            params["score_scale"] = scale
        if any(views):
            params["views"] = views
        if out_perm is not None:
            params["out_perm"] = out_perm
        fused = Node(FUSED_ATTENTION, inputs + ([mask] if mask else []), [out],
                     f"{mm1.name} (+{len(chain) + 1 + len(scalers) + len(moved)} ops)", params)
        members = scalers + moved + [mm1] + chain + [mm2]
        replace[idx[id(mm2)]] = fused
        drop.update(idx[id(n)] for n in members if n is not mm2)
    return [replace.get(k, n) for k, n in enumerate(g.nodes) if k not in drop]


def _view_chain(name: str, producer: dict, only_user, reader: Node, vals: dict):
    """(raw tensor, [("T", perm) | ("R", shape), ...] in order, the nodes) for the Permutes and Reshapes
    that make `name` from a tensor, each read by the next only, the chain starting at a Permute; the
    step replays them as numpy views (a reshape numpy cannot view copies: the same values). ([] when
    there is no Permute to save.)"""
    ops, nodes, cur, user = [], [], name, reader
    while True:
        node = producer.get(cur)
        if node is None or node.op not in ("Permute", "Reshape") or only_user(cur) is not user or \
                not _known(vals.get(cur)) or not _known(vals.get(node.inputs[0])):
            break
        if node.op == "Permute":
            ops.insert(0, ("T", tuple(int(d) for d in node.param["dims"])))
        else:
            ops.insert(0, ("R", tuple(vals[cur].shape)))
        nodes.insert(0, node)
        cur, user = node.inputs[0], node
    while ops and ops[0][0] == "R":        # Reshapes before the first Permute are views already
        ops.pop(0)
        cur = nodes.pop(0).outputs[0]
    return (cur, ops, nodes) if ops else (name, [], [])


FUSED_SILU = "FusedSiLU"


def _is_sigmoid(n) -> bool:
    return n.op == "Sigmoid" or (n.op == "UnaryOp" and n.param.get("opType") == "SIGMOID")


def fuse_silu(g: Graph, vals: dict, nodes: list[Node]) -> list[Node]:
    """x * sigmoid(x) (SiLU/Swish as exporters write it) as one FusedSiLU step over `nodes`, when the
    sigmoid is read by that product only: one pass instead of two, no sigmoid tensor."""
    users = readers(nodes)
    outputs = set(g.outputs)
    drop, replace = set(), {}
    for k, sig in enumerate(nodes):
        if not _is_sigmoid(sig) or sig.outputs[0] in outputs:
            continue
        x = sig.inputs[0]
        us = users.get(sig.outputs[0], [])
        if len(us) != 1:
            continue
        mul = us[0]
        if mul.op != "BinaryOp" or mul.param.get("opType") != "MUL" or int(mul.param.get("activationType", 0)) or \
                sorted(mul.inputs) != sorted([x, sig.outputs[0]]):
            continue
        v = vals.get(x)
        if v is None or v.dtype != "float32" or v.shape is None or vals.get(mul.outputs[0]) is None or \
                vals[mul.outputs[0]].shape != v.shape:
            continue
        drop.add(k)
        replace[id(mul)] = Node(FUSED_SILU, [x], list(mul.outputs), f"{sig.name} (+1 op)", {})
    return [replace.get(id(n), n) for k, n in enumerate(nodes) if k not in drop]


def _scalar(vals: dict, name: str):
    """The value of a one-element constant tensor, or None."""
    v = vals.get(name)
    return None if v is None or v.value is None or np.size(v.value) != 1 else np.asarray(v.value).reshape(-1)[0]


def fuse_index_wrap(g: Graph, vals: dict, nodes: list[Node]) -> list[Node]:
    """A GatherV2 reading idx + (0 > idx) * n (the converter's fix of negative indices for MNN, which
    reads them as they are: frontends/onnx/index.non_negative) reads idx itself: the runtime's
    GatherV2 counts negative indices from the end already, so three steps on the indices go (an
    embedding's ~3 us of a tiny transformer's ~80). Only where the three tensors are read by the chain
    alone and n is the gathered axis's size."""
    users = readers(nodes)
    producer = {o: n for n in nodes for o in n.outputs}
    outputs = set(g.outputs)

    def only(name: str, op: str, kind: str):
        n = producer.get(name)
        ok = n is not None and n.op == op and n.param.get("opType") == kind and \
            sole_reader(users, outputs, name) is not None and not int(n.param.get("activationType", 0) or 0)
        return n if ok else None
    drop, replace = set(), {}
    for gather in nodes:
        if gather.op != "GatherV2" or len(gather.inputs) < 2:
            continue
        add = only(gather.inputs[1], "BinaryOp", "ADD")
        mul = add and next(filter(None, (only(i, "BinaryOp", "MUL") for i in add.inputs)), None)
        neg = mul and next(filter(None, (only(i, "BinaryOp", "GREATER") for i in mul.inputs)), None)
        if neg is None or len(neg.inputs) != 2 or _scalar(vals, neg.inputs[0]) != 0:
            continue
        idx = neg.inputs[1]
        dim = _scalar(vals, next(i for i in mul.inputs if i != neg.outputs[0]))
        x, axis = vals.get(gather.inputs[0]), _scalar(vals, gather.inputs[2]) if len(gather.inputs) > 2 else 0
        if sorted(add.inputs) != sorted([idx, mul.outputs[0]]) or x is None or x.shape is None or axis is None or \
                dim is None or x.shape[int(axis) % len(x.shape)] != dim:
            continue
        drop.update((id(add), id(mul), id(neg)))
        replace[id(gather)] = Node("GatherV2", [gather.inputs[0], idx] + list(gather.inputs[2:]), list(gather.outputs),
                                   gather.name, dict(gather.param))
    return [replace.get(id(n), n) for n in nodes if id(n) not in drop]


def fuse_add_layer_norm(g: Graph, vals: dict, nodes: list[Node], stored: dict) -> list[Node]:
    """A same-shape float32 Add whose sum a LayerNorm over the last axis reads, as one AddLayerNorm step
    with both outputs (the sum is the residual stream the next block adds to): a transformer's every
    block has two, ~0.8 us a step at a tiny BERT's sizes. Not where either tensor is stored on an int8
    grid."""
    users = readers(nodes)
    drop, replace = set(), {}
    for add in nodes:
        if add.op != "BinaryOp" or add.param.get("opType") != "ADD" or len(add.inputs) != 2 or \
                int(add.param.get("activationType", 0) or 0) or add.outputs[0] in stored:
            continue
        shape = _fixed_shape(vals, add.outputs[0])
        if not shape or shape[-1] < 1 or any(_fixed_shape(vals, i) != shape or vals[i].dtype != "float32"
                                             for i in add.inputs + add.outputs):
            continue
        rank = len(shape)
        norm = next((n for n in users.get(add.outputs[0], []) if n.op == "LayerNorm" and n.inputs[0] == add.outputs[0]
                     and len(n.inputs) == 1 and n.outputs[0] not in stored and
                     [int(a) % rank for a in n.param.get("axis", [-1])] == [rank - 1]), None)
        if norm is None:
            continue
        drop.add(id(norm))
        replace[id(add)] = Node("AddLayerNorm", list(add.inputs), [add.outputs[0], norm.outputs[0]],
                                f"{add.name} (+{norm.name})", dict(norm.param))
    return [replace.get(id(n), n) for n in nodes if id(n) not in drop]


CHANNEL_SHUFFLE = "ChannelShuffle"


def fuse_channel_shuffle(g: Graph, vals: dict, nodes: list[Node]) -> list[Node]:
    """ShuffleNet's channel shuffle, Concat of k (n, c, h, w) tensors -> Reshape (n, k, c, h, w) ->
    Permute (0, 2, 1, 3, 4) -> Reshape (n, k c, h, w), as one ChannelShuffle step writing each input's
    channels to every k-th channel of the output: one pass where the Concat and the Permute each
    copied all of it (ShuffleNet-v2: 29 steps, 0.24 ms of 4.6). Only where the chain's tensors are read
    by the chain alone."""
    users = readers(nodes)
    outputs = set(g.outputs)

    def next_of(n: Node, op: str):
        user = sole_reader(users, outputs, n.outputs[0]) if len(n.outputs) == 1 else None
        return user if user is not None and user.op == op and user.inputs[0] == n.outputs[0] else None

    drop, replace = set(), {}
    for cat in nodes:
        if cat.op != "Concat" or len(cat.inputs) < 2 or int(cat.param.get("axis", 0)) not in (1, -3):
            continue
        first = _fixed_shape(vals, cat.inputs[0])
        if first is None or len(first) != 4 or any(_fixed_shape(vals, i) != first for i in cat.inputs) or \
                any(vals[i].dtype != "float32" for i in cat.inputs):
            continue
        n, c, h, w = first
        k = len(cat.inputs)
        split = next_of(cat, "Reshape")
        perm = split and next_of(split, "Permute")
        merge = perm and next_of(perm, "Reshape")
        if merge is None or _fixed_shape(vals, split.outputs[0]) != (n, k, c, h, w) or \
                [int(d) for d in np.asarray(perm.param.get("dims", [])).reshape(-1)] != [0, 2, 1, 3, 4] or \
                _fixed_shape(vals, merge.outputs[0]) != (n, k * c, h, w):
            continue
        drop.update((id(split), id(perm), id(merge)))
        replace[id(cat)] = Node(CHANNEL_SHUFFLE, list(cat.inputs), list(merge.outputs), f"{cat.name} (+3 ops)", {})
    return [replace.get(id(n), n) for n in nodes if id(n) not in drop]


_UNARY_POSTS = {"SIGMOID": POST_SIGMOID, "SILU": POST_SILU, "HARDSWISH": POST_HARDSWISH, "GELU": POST_GELU_TANH,
                "GELU_STANDARD": POST_GELU, "TANH": POST_TANH}


def _post_of(n: Node) -> tuple | None:
    """The activation node `n` computes as a Post (grid.POST_*, alpha, beta), or None."""
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


# ops that only move data: an elementwise activation after them may run before them instead
MOVES = ("Reshape", "ConvertTensor", "Squeeze", "Unsqueeze", "Flatten")


def past_moves(users: dict, t: str, outputs: set, stored: dict, ops, limit: int = 1 << 30) -> tuple:
    """t followed through up to `limit` nodes of `ops` (one tensor in, one out) while each tensor on the
    way has one reader and is neither a graph output nor stored on a grid: (those nodes, the last
    tensor, its one reader), the reader None where that condition or the limit stops the walk."""
    chain = []
    while len(chain) < limit:
        us = users.get(t, [])
        if len(us) != 1 or t in outputs or t in stored:
            break
        n = us[0]
        if n.op not in ops or n.inputs[0] != t or len(n.outputs) != 1:
            return chain, t, n
        chain.append(n)
        t = n.outputs[0]
    return chain, t, None


def fuse_activations(g: Graph, vals: dict, nodes: list[Node], stored: dict) -> list[Node]:
    """A float convolution (or Scale: a BatchNorm left unfolded) whose only reader is an activation (SiLU,
    HardSwish, GELU, sigmoid, tanh, leaky ReLU, clip) as one node that applies it in its epilogue (param
    grid.POST): the convolution's output is never written to memory and read back. Reshapes between them
    (a transformer's Linear as a 1x1 convolution between two reshapes) stay, after the activation. Not
    where either tensor is stored on an int8 grid (MNN rounds the convolution's output before the
    activation reads it)."""
    users = readers(nodes)
    outputs = set(g.outputs)
    fused, drop = {}, set()
    for conv in nodes:
        if conv.op not in ("Convolution", "ConvolutionDepthwise", "Scale") or len(conv.inputs) != 1 or \
                POST in conv.param or (conv.param.get("quanParameter") or {}).get("scaleIn"):
            continue
        y = conv.outputs[0]
        # reshapes between (a Linear as a 1x1 convolution): the activation moves before them
        chain, t, act = past_moves(users, y, outputs, stored, MOVES, limit=5)
        post = _post_of(act) if act is not None else None
        if post is None or act.inputs[0] != t or len(act.outputs) != 1 or act.outputs[0] in stored:
            continue
        v, u, w = vals.get(y), vals.get(t), vals.get(act.outputs[0])
        if v is None or u is None or w is None or v.dtype != "float32" or w.dtype != "float32" or u.shape != w.shape:
            continue
        name = f"{conv.name} (+{act.name})"
        if not chain:
            fused[id(conv)] = Node(conv.op, list(conv.inputs), list(act.outputs), name, {**conv.param, POST: post},
                                   conv.param_type, conv.fmt)
        else:       # the activation before the reshapes; the last reshape writes the activation's tensor
            fused[id(conv)] = Node(conv.op, list(conv.inputs), [y], name, {**conv.param, POST: post},
                                   conv.param_type, conv.fmt)
            last = chain[-1]
            fused[id(last)] = Node(last.op, list(last.inputs), list(act.outputs), last.name, last.param,
                                   last.param_type, last.fmt)
        drop.add(id(act))
    return [fused.get(id(n), n) for n in nodes if id(n) not in drop]


SCALED_POINTWISE = "ScaledPointwise"


def _pointwise_reading(conv: Node, y: str, channels: int) -> bool:
    """A float group-1 1x1 convolution, stride 1, unpadded, reading y (of `channels` channels)."""
    if conv.op != "Convolution" or conv.inputs != [y] or (conv.param.get("quanParameter") or {}).get("scaleIn"):
        return False
    c = conv.param.get("common", {})
    pads = c.get("pads")
    pads = [] if pads is None else [int(v) for v in np.asarray(pads).reshape(-1)]
    return (c.get("kernelX", 1) == c.get("kernelY", 1) == 1 and c.get("strideX", 1) == c.get("strideY", 1) == 1
            and (c.get("group", 1) or 1) == 1 and not c.get("padX", 0) and not c.get("padY", 0) and not any(pads)
            and c.get("padMode", "CAFFE") != "SAME" and c.get("inputCount", channels) in (0, channels))


def fuse_channel_scale(g: Graph, vals: dict, nodes: list[Node], stored: dict) -> list[Node]:
    """A squeeze-excite's channel scale x * s (s of shape (1, C, 1, 1)) whose only reader is a 1x1
    convolution as one ScaledPointwise node: the convolution's packed weights are scaled by s on each
    run (Cout x C products) instead of x (C x H x W). Only where the map has at least Cout pixels, so
    scaling the weights costs less than the pass over x it saves (EfficientNet-B0's 112x112 and 56x56
    blocks; its 7x7 blocks, 1152 channels into 320, keep the multiply)."""
    users = readers(nodes)
    outputs = set(g.outputs)
    fused, drop = {}, set()
    for m in nodes:
        if m.op != "BinaryOp" or m.param.get("opType") != "MUL" or len(m.inputs) != 2 or len(m.outputs) != 1 or \
                int(m.param.get("activationType", 0) or 0):
            continue
        # layout tags between them (NCHW -> NC4HW4): the same array here
        chain, y, conv = past_moves(users, m.outputs[0], outputs, stored, ("ConvertTensor",))
        if conv is None:
            continue
        a, b = (vals.get(i) for i in m.inputs)
        if a is None or b is None or a.shape is None or b.shape is None or a.dtype != "float32" or b.dtype != "float32":
            continue
        x, s = (m.inputs[0], m.inputs[1]) if len(b.shape) == 4 and b.shape[2:] == (1, 1) else (m.inputs[1], m.inputs[0])
        xs, ss = vals[x].shape, vals[s].shape
        if len(xs) != 4 or not all(isinstance(d, int) for d in xs) or xs[0] != 1 or ss != (1, xs[1], 1, 1) or \
                x in stored or s in stored:
            continue
        if not _pointwise_reading(conv, y, xs[1]) or xs[2] * xs[3] < conv.param["common"]["outputCount"]:
            continue
        fused[id(conv)] = Node(SCALED_POINTWISE, [x, s], list(conv.outputs), f"{conv.name} (+{m.name})",
                               conv.param, conv.param_type, conv.fmt)
        drop.update([id(m)] + [id(n) for n in chain])
    return [fused.get(id(n), n) for n in nodes if id(n) not in drop]


def fused_nodes(g: Graph, vals: dict, stored: dict) -> list[Node]:
    """g's nodes with every chain above as one node, the passes in the order each needs: attention
    before the index fix and the shuffle (which leave its inputs alone), the Add and LayerNorm before
    the activations (an Add followed by an activation stays an Add), a convolution's activation before
    the channel scale that may follow it."""
    nodes = fuse_channel_shuffle(g, vals, fuse_index_wrap(g, vals, fuse_attention(g, vals)))
    nodes = fuse_silu(g, vals, fuse_add_layer_norm(g, vals, nodes, stored))
    return fuse_channel_scale(g, vals, fuse_activations(g, vals, nodes, stored), stored)
