"""A GatherV2 reading idx + (0 > idx) * n (the converter's fix of negative indices for MNN, which reads
them as they are: frontends/onnx/index.non_negative) reads idx itself: the runtime's GatherV2 counts
negative indices from the end already, so three steps on the indices go (an embedding's ~3 us of a
tiny transformer's ~80). Only where the three tensors are read by the chain alone and n is the
gathered axis's size."""
from __future__ import annotations

from ...ir.graph import Node, producers_of
from .match import rewriting, rewritten, scalar, users_of
from .state import Planning

OPTIONAL = True
STARTS = frozenset({"GatherV2"})      # ops a match starts from: without one the stage has nothing to do


def fuse(p: Planning) -> list[Node]:
    nodes, vals = p.nodes, p.vals
    users = users_of(p)
    producer = producers_of(nodes)
    g = p.graph

    def only(name: str, op: str, kind: str):
        n = producer.get(name)
        ok = n is not None and n.op == op and n.param.get("opType") == kind and \
            g.sole_consumer(name, users) is not None and not int(n.param.get("activationType", 0) or 0)
        return n if ok else None
    drop, replace = set(), {}
    for gather in nodes:
        if gather.op != "GatherV2" or len(gather.inputs) < 2:
            continue
        add = only(gather.inputs[1], "BinaryOp", "ADD")
        mul = add and next(filter(None, (only(i, "BinaryOp", "MUL") for i in add.inputs)), None)
        neg = mul and next(filter(None, (only(i, "BinaryOp", "GREATER") for i in mul.inputs)), None)
        if neg is None or len(neg.inputs) != 2 or scalar(vals, neg.inputs[0]) != 0:
            continue
        idx = neg.inputs[1]
        dim = scalar(vals, next(i for i in mul.inputs if i != neg.outputs[0]))
        x, axis = vals.get(gather.inputs[0]), scalar(vals, gather.inputs[2]) if len(gather.inputs) > 2 else 0
        if sorted(add.inputs) != sorted([idx, mul.outputs[0]]) or x is None or x.shape is None or axis is None or \
                dim is None or x.shape[int(axis) % len(x.shape)] != dim:
            continue
        drop.update((id(add), id(mul), id(neg)))
        replace[id(gather)] = Node("GatherV2", [gather.inputs[0], idx] + list(gather.inputs[2:]), list(gather.outputs),
                                   gather.name, dict(gather.param))
    return rewritten(nodes, replace, drop)


run = rewriting(fuse)
