"""A same-shape float32 Add whose sum a LayerNorm over the last axis reads, as one AddLayerNorm step with
both outputs (the sum is the residual stream the next block adds to): a transformer's every block has
two, ~0.8 us a step at a tiny BERT's sizes. Not where either tensor is stored on an int8 grid. Before
the activation stages: an Add followed by an activation stays an Add."""
from __future__ import annotations

from ...ir.graph import Node
from .match import fixed_shape, rewriting, rewritten, users_of
from .state import Planning

OPTIONAL = True
STARTS = frozenset({"LayerNorm"})      # ops a match starts from: without one the stage has nothing to do


def fuse(p: Planning) -> list[Node]:
    nodes, vals, stored = p.nodes, p.vals, p.stored
    users = users_of(p)
    drop, replace = set(), {}
    for add in nodes:
        if add.op != "BinaryOp" or add.param.get("opType") != "ADD" or len(add.inputs) != 2 or \
                int(add.param.get("activationType", 0) or 0) or add.outputs[0] in stored:
            continue
        shape = fixed_shape(vals, add.outputs[0])
        if not shape or shape[-1] < 1 or any(fixed_shape(vals, i) != shape or vals[i].dtype != "float32"
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
    return rewritten(nodes, replace, drop)


run = rewriting(fuse)
