"""x * sigmoid(x) (SiLU/Swish as exporters write it) as one FusedSiLU step, when the sigmoid is read by
that product only: one pass instead of two, no sigmoid tensor. Before `fuse_activations`, which takes
a FusedSiLU into the convolution before it."""
from __future__ import annotations

from ...ir.graph import Node
from .match import by_nodes, made_node, rewriting, users_of
from .state import Planning

OPTIONAL = True
FUSED_SILU = "FusedSiLU"


def is_sigmoid(n) -> bool:
    return n.op == "Sigmoid" or (n.op == "UnaryOp" and n.param.get("opType") == "SIGMOID")


def _products(p: Planning) -> list[tuple]:
    """(position of the sigmoid, the sigmoid, x, the product) of every x * sigmoid(x) the nodes alone allow
    (match.by_nodes: the Vals are tested at each shape)."""
    users = users_of(p)
    outputs = set(p.graph.outputs)
    found = []
    for k, sig in enumerate(p.nodes):
        if not is_sigmoid(sig) or sig.outputs[0] in outputs:
            continue
        x = sig.inputs[0]
        us = users.get(sig.outputs[0], [])
        if len(us) != 1:
            continue
        mul = us[0]
        if mul.op != "BinaryOp" or mul.param.get("opType") != "MUL" or int(mul.param.get("activationType", 0)) or \
                sorted(mul.inputs) != sorted([x, sig.outputs[0]]):
            continue
        found.append((k, sig, x, mul))
    return found


def fuse(p: Planning) -> list[Node]:
    nodes, vals = p.nodes, p.vals
    drop, replace = set(), {}
    for k, sig, x, mul in by_nodes(p, "fuse_silu", _products):
        v = vals.get(x)
        if v is None or v.dtype != "float32" or v.shape is None or vals.get(mul.outputs[0]) is None or \
                vals[mul.outputs[0]].shape != v.shape:
            continue
        drop.add(k)
        replace[id(mul)] = made_node(p, ("silu", id(sig), id(mul)), (sig, mul), lambda: Node(
            FUSED_SILU, [x], list(mul.outputs), f"{sig.name} (+1 op)", {}))
    return [replace.get(id(n), n) for k, n in enumerate(nodes) if k not in drop] if drop or replace else nodes


run = rewriting(fuse)
