"""Kernels shared by the plans of one arena. A model with open input dims is planned again at every new
input shape, but some of its ops see the same operands at every shape: EfficientNet-B0's squeeze-excite
branches (a 1x1 convolution on a pooled 1x1 map, 32 of its 52 convolutions) and whatever follows a global
pool. Such an op's kernel is built once and shared by the plans that see the same operands, where its
factory cost ~40 us a shape and its first run bound its compiled code again (kernels.compile.jit.Bound).

Sharing is safe where the plans never run at once: plans of one arena (arenas.py) never do, since a run
reserves its plan's arena, so the kernels are kept per arena. A kernel's compiled code is bound to the
argument types of its first call: a plan that takes a kernel over checks (stage `bind`) that its step's
arguments (the input arrays, which sit in fixed slots, and the output views) have the types they had in
the plan that built it, else builds its own. Only an op whose operands (shapes, dtypes, grids, values)
were the same in the arena's last plan is kept: at most one lookup key is made per op that needs one."""
from __future__ import annotations

import weakref

from ..kernels.compile.aot import type_key

_SCALARS = (bool, int, float, str)


class Entry:
    """A shared kernel, what its key names (held: an id in the key stays that object's while the entry
    lives), and its step's argument types in the plan that built it (None until that plan is bound)."""

    __slots__ = ("kernel", "pins", "sig", "__weakref__")

    def __init__(self, kernel, pins: list):
        self.kernel, self.pins, self.sig = kernel, pins, None


class Lane:
    """What an arena's plans share: each op's operand shapes in the last plan, and the shared kernels (held
    by the plans using them: an entry goes with the last of them)."""

    def __init__(self):
        self.seen: dict = {}
        self.nodes: dict = {}       # node name -> (node, its part of the key, the objects it names): key_of
        self.entries = weakref.WeakValueDictionary()


def _obj(v, pins: list):
    if v is None or type(v) in _SCALARS:
        return v
    if type(v) is tuple and all(x is None or type(x) in _SCALARS for x in v):
        return v
    pins.append(v)
    return ("#", id(v))


def _val(v, pins: list) -> tuple:
    return (v.shape, v.dtype, v.grid, v.zero, None if v.value is None else _obj(v.value, pins))


def _node_key(node) -> tuple[tuple, list]:
    pins: list = []
    return (node.op, node.name, tuple(node.inputs), tuple(node.outputs), node.param_type, node.fmt,
            tuple((k, _obj(v, pins)) for k, v in node.param.items())), pins


def key_of(node, ins, outs, settings, lane=None) -> tuple[tuple, list]:
    """(everything kernel_for(node, ins, outs, settings) reads, the objects the key names by id). The
    node's part is kept in the lane by name while the node is the same object (a graph's nodes are never
    written; a fused node is made anew by each plan)."""
    if lane is None:
        part, pins = _node_key(node)
    else:
        got = lane.nodes.get(node.name)
        if got is None or got[0] is not node:
            got = lane.nodes[node.name] = (node, *_node_key(node))
        part, pins = got[1], got[2]
    pins = list(pins)
    key = (part, tuple(_val(v, pins) for v in ins), tuple(_val(v, pins) for v in outs), settings)
    return key, pins


def lane_of(p) -> Lane | None:
    if p.arena is None or p.keep_all:
        return None
    if p.arena.kernels is None:
        p.arena.kernels = Lane()
    return p.arena.kernels


def kernel(p, node, ins, outs, build):
    """(the op's kernel, its Entry or None, whether built here): a kernel the arena's plans share where the
    op's operands were the same in its last plan, else build() (= kernel_for(node, ins, outs, settings))."""
    lane = lane_of(p)
    if lane is None:
        return build(), None, True
    shapes = tuple(v.shape for v in ins) + tuple(v.shape for v in outs)
    last = lane.seen.get(node.name)
    lane.seen[node.name] = shapes
    if last != shapes:
        return build(), None, True
    key, pins = key_of(node, ins, outs, p.settings, lane)
    entry = lane.entries.get(key)
    if entry is not None:
        p.shared.append(entry)
        return entry.kernel, entry, False
    k = build()
    if k.view:      # a view's kernel costs less to build than its key
        return k, None, True
    entry = lane.entries[key] = Entry(k, pins)
    p.shared.append(entry)
    return k, entry, True


def check(step, args, views, rebuild) -> None:
    """At binding (stage `bind`): the plan that built a shared kernel records its step's argument types
    (the input arrays in their fixed slots, the output views: what its compiled code is bound to at its
    first call); a plan that took it over keeps it where its step's are the same, else builds its own."""
    entry, built = step.shared, step.source[3]
    sig = None if args is None else type_key(tuple(args) + tuple(views or ()))
    if built:
        entry.sig = sig or "?"      # "?": an input not in a fixed slot, its types unknown here: not shared
    elif sig is None or sig != entry.sig:
        step.kernel, step.shared = rebuild(), None
