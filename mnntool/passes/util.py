"""Small graph-editing helpers shared by the passes."""
from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Node


def sole_user(g: Graph, node: Node) -> Node | None:
    """The only consumer of node's single output (Graph.sole_consumer), when it reads it once: a fold
    into it replaces one operand."""
    out = node.outputs[0]
    user = g.sole_consumer(out)
    return user if user is not None and user.inputs.count(out) == 1 else None


def rename_input(g: Graph, old: str, new: str) -> None:
    for n in g.nodes:
        n.inputs = [new if i == old else i for i in n.inputs]


def remove_passthrough(g: Graph, node: Node) -> bool:
    """Drop a node whose output equals its first input; False when that cannot be done safely."""
    src, dst = node.inputs[0], node.outputs[0]
    if dst in g.outputs:
        if src in g.outputs or src in g.inputs or src in g.constants:
            return False
        producer = next((n for n in g.nodes if src in n.outputs), None)
        if producer is None:
            return False
        producer.outputs[producer.outputs.index(src)] = dst
        rename_input(g, src, dst)
    else:
        rename_input(g, dst, src)
    g.nodes.remove(node)
    return True


def const_of(g: Graph, name: str):
    return g.constants.get(name)


def per_channel(value: np.ndarray, channels: int, rank: int = 4):
    """A constant that broadcasts over NCHW as one value per channel (or one scalar) -> (channels,)."""
    v = np.asarray(value)
    if v.size == 1:
        return np.full(channels, float(v.reshape(-1)[0]), np.float64)
    if v.size != channels:
        return None
    shape = v.shape
    if len(shape) > rank:
        return None
    padded = (1,) * (rank - len(shape)) + tuple(shape)
    if padded[1] == channels and all(d == 1 for k, d in enumerate(padded) if k != 1):
        return v.reshape(-1).astype(np.float64)
    return None


def expand_each(g: Graph, count_of, expand) -> bool:
    """Each node for which count_of(g, node) is non-zero replaced, in place in the order, by the nodes
    expand(g, node, count) returns (the split passes); whether any was."""
    out, changed = [], False
    for node in g.nodes:
        k = count_of(g, node)
        if k:
            out += expand(g, node, k)
            changed = True
        else:
            out.append(node)
    g.nodes = out
    return changed
