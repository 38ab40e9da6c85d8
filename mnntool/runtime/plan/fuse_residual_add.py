"""A float convolution whose only reader is a residual Add (x + r, r of the same shape, computed before
the convolution: a ResNet block's shortcut) as one ResidualConvolution node that adds r after the
convolution, then the ReLU/ReLU6 that follows the Add (the Add's own activationType, or a ReLU node
reading it alone), in one pass over its output (kernels.micro.residual): the Add's step, and the tensor
it wrote, are gone (ResNet-50: 16 such Adds on maps up to 56x56x256; HRNet-w18-small ~40). onnxruntime
fuses the same pattern (its FusedConv's "sum" input).

Not where the convolution carries a fused activation of its own (the add would come after it), nor where
the convolution (int8), its output, the Add's or the ReLU's is stored on an int8 grid (MNN rounds there),
nor where r is broadcast, constant or computed after the convolution. After `fuse_activations` (the
convolution's post must be known to be none) and `fuse_channel_scale` (a squeeze-excite's scaled 1x1
convolution stays that)."""
from __future__ import annotations

from ...ir.graph import Node
from ..kernels.micro.epilogue import POST, POST_CLIP, POST_LEAKY
from .fuse_activations import post_of
from .match import by_nodes, made_node, rewriting, rewritten, sole_reader, users_of
from .state import Planning

OPTIONAL = True
STARTS = frozenset({"Convolution"})      # ops a match starts from: without one the stage has nothing to do
RESIDUAL_CONVOLUTION = "ResidualConvolution"


def _float(v) -> bool:
    return v is not None and v.dtype == "float32" and v.shape is not None and v.value is None and \
        len(v.shape) == 4 and all(isinstance(d, int) for d in v.shape)


def _adds(p: Planning) -> list[tuple]:
    """(convolution, its output, the Add, r, the Add's activationType, the clip reading the Add alone and its Post,
    or None) of every pair the nodes alone allow (match.by_nodes: the Vals are tested at each shape)."""
    nodes, stored = p.nodes, p.stored
    users = users_of(p)
    outputs = set(p.graph.outputs)
    made_at = {o: k for k, n in enumerate(nodes) for o in n.outputs}
    found = []
    for at, conv in enumerate(nodes):
        if conv.op != "Convolution" or len(conv.inputs) != 1 or len(conv.outputs) != 1 or POST in conv.param or \
                (conv.param.get("quanParameter") or {}).get("scaleIn") or conv.param.get("symmetricQuan"):
            continue
        y = conv.outputs[0]
        add = sole_reader(users, y, outputs, stored)
        if add is None or add.op != "BinaryOp" or add.param.get("opType") != "ADD" or len(add.inputs) != 2 or \
                len(add.outputs) != 1 or add.outputs[0] in stored or y not in add.inputs:
            continue
        r = add.inputs[1] if add.inputs[0] == y else add.inputs[0]
        act_type = int(add.param.get("activationType", 0) or 0)
        # r ready before the convolution runs (not its own output)
        if r == y or act_type not in (0, 1) or made_at.get(r, -1) >= at or r in stored:
            continue
        clip, out = None, add.outputs[0]
        after = users.get(out, []) if not act_type else []
        if len(after) == 1 and out not in outputs and after[0].inputs[:1] == [out] and len(after[0].outputs) == 1 \
                and (pa := post_of(after[0])) is not None and pa[0] in (POST_CLIP, POST_LEAKY) and \
                after[0].outputs[0] not in stored:
            clip = (after[0], pa)
        found.append((conv, y, add, r, act_type, clip))
    return found


def fuse(p: Planning) -> list[Node]:
    nodes, vals = p.nodes, p.vals
    fused, drop = {}, set()
    for conv, y, add, r, act_type, clip in by_nodes(p, "fuse_residual_add", _adds):
        v, u, z = vals.get(y), vals.get(r), vals.get(add.outputs[0])
        # r the same shape (no broadcast)
        if not (_float(v) and _float(u) and _float(z)) or not v.shape == u.shape == z.shape:
            continue
        out, post, act = add.outputs[0], (POST_CLIP, 0.0, float("inf")) if act_type else None, None
        # a ReLU/ReLU6 reading the Add alone: the add's post
        if post is None and clip is not None and _float(vals.get(clip[0].outputs[0])):
            act, post, out = clip[0], clip[1], clip[0].outputs[0]

        def make():
            param = {k: val for k, val in conv.param.items()}
            if post is not None:
                param[POST] = post
            name = f"{conv.name} (+{add.name})" + (f" (+{act.name})" if act is not None else "")
            return Node(RESIDUAL_CONVOLUTION, [conv.inputs[0], r], [out], name, param, conv.param_type, conv.fmt)
        # (r, out and post follow from the three nodes)
        fused[id(conv)] = made_node(p, ("residual", id(conv), id(add), id(act)), (conv, add, act), make)
        drop.add(id(add))
        if act is not None:
            drop.add(id(act))
    return rewritten(nodes, fused, drop)


run = rewriting(fuse)
