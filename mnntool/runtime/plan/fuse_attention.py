"""Attention as exporters write it,

    scores = MatMul(q, k)  [* c]  [+ mask]  -> Softmax(last axis)  [-> Where(IsNaN(p), 0, p) | floor]  -> MatMul(p, v)

as one FusedAttention step: the scores are written once, masked and normalised in place, and
multiplied by v, instead of 3 to 6 steps each passing over the L x L scores (kernels/attention.py)."""
from __future__ import annotations

from ...ir.graph import Node, producers_of
from ...ir.ops import params as read_params
from .match import known, rewriting, users_of
from .state import Planning

OPTIONAL = True
STARTS = frozenset({"Softmax"})      # ops a match starts from: without one the stage has nothing to do
FUSED_ATTENTION = "FusedAttention"


def fuse(p: Planning) -> list[Node]:
    nodes, vals, g = p.nodes, p.vals, p.graph
    users, producer = users_of(p), producers_of(nodes)
    outputs = set(g.outputs)

    def only_user(name):
        return g.sole_consumer(name, users)

    replace: dict[int, Node] = {}
    drop: set[int] = set()
    idx = {id(n): k for k, n in enumerate(nodes)}
    for sm in nodes:
        if sm.op != "Softmax" or not known(vals.get(sm.inputs[0])):
            continue
        rank = len(vals[sm.inputs[0]].shape)
        if int(read_params(sm)["axis"]) % rank != rank - 1:     # the schema's default where the file has none
            continue
        chain, mask = [sm], None
        src = producer.get(sm.inputs[0])
        factor, scaler = 1.0, None
        if src is not None and src.op == "BinaryOp" and src.param.get("opType") == "ADD" and \
                int(src.param.get("activationType", 0)) == 0 and only_user(src.outputs[0]) is sm:
            mm_out, mask = src.inputs
            if not _from_matmul(mm_out, src, producer, only_user, g, vals):
                mask, mm_out = mm_out, mask
            chain.insert(0, src)
            src = producer.get(mm_out)
        # the scores times a positive constant (LeViT's q k^T * d^-0.5 before its attention biases)
        got = _scaled_scores(src, chain[0], producer, only_user, g, vals)
        if got is not None:
            factor, scaler = got
            chain.insert(0, scaler)
            src = producer.get(scaler_input(scaler, g))
        mm1 = src
        if mm1 is None or mm1.op != "MatMul" or len(mm1.inputs) != 2 or mm1.param.get("transposeA") or \
                only_user(mm1.outputs[0]) is not chain[0]:
            continue
        if mask is not None and (not known(vals.get(mask)) or vals[mask].dtype != "float32"):
            continue
        pr, guard = sm.outputs[0], False
        nxt = users.get(pr, [])
        if len(nxt) == 2 and {u.op for u in nxt} == {"BinaryOp", "Select"}:    # IsNaN(p) ? 0 : p
            ne = next(u for u in nxt if u.op == "BinaryOp")
            sel = next(u for u in nxt if u.op == "Select")
            if ne.param.get("opType") == "NOTEQUAL" and ne.inputs == [pr, pr] and only_user(ne.outputs[0]) is sel and \
                    sel.inputs[0] == ne.outputs[0] and sel.inputs[2] == pr and g.scalar(sel.inputs[1]) == 0.0:
                chain += [ne, sel]
                pr, guard = sel.outputs[0], True
        floor = only_user(pr) if not guard and pr not in outputs else None
        if floor is not None and floor.op == "ReLU6" and float(floor.param.get("minValue", 0.0)) == 2.0 ** -60:
            chain.append(floor)     # passes/floor_masked_softmax.py's clamp: it moves p by <= 2^-60, skipped here
            pr = floor.outputs[0]
        mm2 = only_user(pr) if pr not in outputs else None
        if mm2 is None or mm2.op != "MatMul" or len(mm2.inputs) != 2 or mm2.inputs[0] != pr or \
                mm2.param.get("transposeA") or mm2.param.get("transposeB"):
            continue
        if not (len(users.get(sm.outputs[0], [])) == (2 if guard else 1)):
            continue
        q, k, v = mm1.inputs[0], mm1.inputs[1], mm2.inputs[1]
        # q and k scaled by positive constants (an exporter's 1/sqrt(sqrt(d)) on each): the softmax takes
        # the product in its exponent instead, two passes over q and k fewer; under a mask, which adds to
        # the scaled scores, the scores are scaled before it ("score_scale").
        scale, scalers = factor, []
        reader = {q: mm1, k: mm1, v: mm2}       # each operand's reader inside the chain
        for name in (q, k):
            mul = producer.get(name)
            if mul is None or mul.op != "BinaryOp" or mul.param.get("opType") != "MUL" or \
                    int(mul.param.get("activationType", 0)) or only_user(name) is not mm1:
                continue
            factor = next((g.scalar(c) for c in mul.inputs if g.scalar(c) is not None), None)
            other = next((i for i in mul.inputs if g.scalar(i) is None), None)
            if factor is None or factor <= 0 or other is None or not known(vals.get(other)) or \
                    vals[other].shape != vals[name].shape:
                continue
            scale *= factor
            scalers.append(mul)
            reader[other] = mul
            q, k = (other, k) if name == q else (q, other)
        if not all(known(vals.get(x)) and vals[x].dtype == "float32" for x in (q, k, v, mm2.outputs[0])):
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
        if perm_node is not None and perm_node.op == "Permute" and known(vals.get(perm_node.outputs[0])):
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
    return [replace.get(k, n) for k, n in enumerate(nodes) if k not in drop] if drop or replace else nodes


def scaler_input(mul: Node, g) -> str:
    """The input of a MUL by a scalar constant that is not the constant."""
    return next(i for i in mul.inputs if g.scalar(i) is None)


def _scaled_scores(node, reader, producer, only_user, g, vals):
    """(factor, node) when `node` multiplies a MatMul's output, read by nothing else, by a positive scalar
    constant into a tensor of the same shape that only `reader` reads; else None."""
    if node is None or node.op != "BinaryOp" or node.param.get("opType") != "MUL" or len(node.inputs) != 2 or \
            int(node.param.get("activationType", 0)) or only_user(node.outputs[0]) is not reader:
        return None
    factors = [g.scalar(i) for i in node.inputs if g.scalar(i) is not None]
    if len(factors) != 1 or not factors[0] > 0:
        return None
    x = scaler_input(node, g)
    mm = producer.get(x)
    out = vals.get(node.outputs[0])
    if mm is None or mm.op != "MatMul" or only_user(x) is not node or not known(vals.get(x)) or out is None or \
            vals[x].shape != out.shape:
        return None
    return float(factors[0]), node


def _from_matmul(name: str, reader, producer, only_user, g, vals) -> bool:
    """`name` is a MatMul's output, or a scaled one (_scaled_scores)."""
    node = producer.get(name)
    return node is not None and (node.op == "MatMul" or
                                 _scaled_scores(node, reader, producer, only_user, g, vals) is not None)


def _view_chain(name: str, producer: dict, only_user, reader: Node, vals: dict):
    """(raw tensor, [("T", perm) | ("R", shape), ...] in order, the nodes) for the Permutes and Reshapes
    that make `name` from a tensor, each read by the next only, the chain starting at a Permute; the
    step replays them as numpy views (a reshape numpy cannot view copies: the same values). ([] when
    there is no Permute to save.)"""
    ops, nodes, cur, user = [], [], name, reader
    while True:
        node = producer.get(cur)
        if node is None or node.op not in ("Permute", "Reshape") or only_user(cur) is not user or \
                not known(vals.get(cur)) or not known(vals.get(node.inputs[0])):
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


run = rewriting(fuse)
