"""What the fusion stages ask of the ops being planned beyond the graph's own queries (ir.graph:
consumers_of, producers_of, Graph.sole_consumer): a tensor's shape when every dim is known, a
constant's value, a tensor's one reader where a fusion may drop the tensor, a walk through data-movement
ops, the rewritten node list."""
from __future__ import annotations

from operator import is_

import numpy as np

from ...ir.graph import Node
from ..kernels.weight_cache import session_memo


def known(v) -> bool:
    """Every dim known, rank 2 or more."""
    return v is not None and v.shape is not None and all(isinstance(d, int) for d in v.shape) and len(v.shape) >= 2


def fixed_shape(vals: dict, name: str) -> tuple | None:
    """The tensor's shape when shape inference knows every dim, else None."""
    v = vals.get(name)
    return tuple(v.shape) if v is not None and v.shape is not None and all(isinstance(d, int) for d in v.shape) \
        else None


def scalar(vals: dict, name: str):
    """The value of a one-element constant tensor, or None."""
    v = vals.get(name)
    return None if v is None or v.value is None or np.size(v.value) != 1 else np.asarray(v.value).reshape(-1)[0]


def sole_reader(users: dict, t: str, outputs: set, stored: dict) -> Node | None:
    """t's one reader where t has exactly one and is neither a graph output nor stored on a grid (a fusion
    may then compute t inside its reader and never write it), else None."""
    us = users.get(t, [])
    return us[0] if len(us) == 1 and t not in outputs and t not in stored else None


def past_moves(users: dict, t: str, outputs: set, stored: dict, moves, limit: int = 1 << 30) -> tuple:
    """t followed through up to `limit` nodes whose op `moves(op)` holds for (ops that only move data, as
    ir.ops.is_view; one tensor in, one out) while each tensor on the
    way has one reader and is neither a graph output nor stored on a grid: (those nodes, the last
    tensor, its one reader), the reader None where that condition or the limit stops the walk."""
    chain = []
    while len(chain) < limit:
        n = sole_reader(users, t, outputs, stored)
        if n is None:
            break
        if not moves(n.op) or n.inputs[0] != t or len(n.outputs) != 1:
            return chain, t, n
        chain.append(n)
        t = n.outputs[0]
    return chain, t, None


def rewriting(fuse):
    """The `run` of a stage that only rewrites the node list, `fuse(p)` giving the new list: not where the
    plan keeps every tensor of the graph (p.keep_all: verify's per-layer runs), which no fusion may drop."""
    def run(p) -> None:
        if not p.keep_all:
            p.nodes = fuse(p)
    return run


def by_nodes(p, tag: str, find) -> list:
    """find(p): what a fusion stage matches by the nodes alone (their ops, parameters and readers, the stored
    grids, the graph's outputs), never by a tensor's Val; the session's last answer for `tag` where p.nodes are the
    same node objects as then (made_node keeps fused nodes' identity across input shapes), so a stage walks the
    graph once, not at every new shape, and tests only the Vals of what it found. One entry a tag (the nodes
    held); the answer is shared: never written."""
    memo = session_memo("by nodes")
    if memo is None:
        return find(p)
    nodes, key = p.nodes, (id(p.stored), id(p.raw), tuple(p.graph.outputs))
    hit = memo.get(tag)
    if hit is not None and hit[1] == key and len(hit[0]) == len(nodes) and all(map(is_, hit[0], nodes)):
        return hit[2]
    found = find(p)
    memo[tag] = (list(nodes), key, found, p.stored, p.raw)     # (the objects the key names by id held)
    return found


def made_node(p, key: tuple, sources: tuple, make) -> Node:
    """make(), or the node it made in the session's last plan for the same `key` (a stage's tag, the ids of
    `sources`, and anything else make() reads that is not fixed by those objects): a fused node keeps its
    identity across input shapes, so what is kept by node (reuse.key_of's part of a shared kernel's key) is
    made once, and each node is made once, not at every shape (nodes are never written, so plans may share
    them). `sources`, the nodes it is made of, are held while the entry lives (their ids stay theirs); entries
    live while the next plan uses them (plan/__init__.build: at most two plans' worth)."""
    if p.made is None:
        return make()
    last, now = p.made
    hit = now.get(key) or last.get(key)
    if hit is None:
        hit = (make(), sources)
    now[key] = hit
    return hit[0]


def rewritten(nodes: list[Node], replace: dict, drop: set) -> list[Node]:
    """`nodes` with the nodes whose id is in `replace` replaced and those in `drop` left out: the same list
    where neither names one (so the next stage's users_of is the one already made)."""
    if not replace and not drop:
        return nodes
    return [replace.get(id(n), n) for n in nodes if id(n) not in drop]


def users_of(p) -> dict:
    """ir.graph.consumers_of(p.nodes), made once per node list: most fusion stages change nothing in most
    models and hand the same list on (rewritten), and each asked it again (~35 us a stage on
    EfficientNet-B0, planned again at every new input shape). Stages read it and never write it, nor
    p.nodes in place (a stage that rewrites returns a new list)."""
    cached = p.users
    if cached is not None and cached[0] is p.nodes:
        return cached[1]
    out: dict = {}
    for n in p.nodes:
        ins = n.inputs
        if len(ins) == 1:
            i = ins[0]
            if i in out:
                out[i].append(n)
            else:
                out[i] = [n]
        else:
            for i in dict.fromkeys(ins):
                if i in out:
                    out[i].append(n)
                else:
                    out[i] = [n]
    p.users = (p.nodes, out)
    return out
