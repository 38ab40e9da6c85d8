"""Packed weights kept across plans. A model with open input dims is planned again at every new input
shape, and its convolutions' weights were re-packed each time, although the packing depends on the
weights and the tile layout only, never on H and W: EfficientNet-B0 re-packed ~21 MB per plan (~4,400
page faults and ~15% of a new shape's planning on the EPYC), and every one of the session's 8 plans kept
its own copy.

Only weights read from the model file are kept: their arrays are views of the file's buffer (a
bytearray the reader owns), which planning never writes (a plan that did would already break the
session's second plan), so a buffer address names the same numbers for as long as the buffer lives. Arrays that
own their data (weights a pass or kernel computed, scratch) are packed every time, since a later
array may reuse the address with other contents. An entry goes when the file buffer does (weak
reference), so closing a session frees its packed weights. Packed arrays are read-only to every kernel
and shared by the plans and threads of a session."""
from __future__ import annotations

import threading
import weakref

import numpy as np

_entries: dict = {}         # key -> packed array
_keys_of: dict = {}         # id(buffer) -> (weak reference, set of keys)
_lock = threading.Lock()


def _root(a: np.ndarray):
    """The object at the bottom of `a`'s chain of views."""
    while isinstance(a, np.ndarray) and a.base is not None:
        a = a.base
    return a


def _forget(buffer_id: int) -> None:
    with _lock:
        _, keys = _keys_of.pop(buffer_id, (None, ()))
        for k in keys:
            _entries.pop(k, None)


def packed_once(pack, w: np.ndarray, *args):
    """pack(w, *args), computed once per (weights in the file buffer, pack, args) while the buffer lives."""
    root = _root(w)
    if isinstance(root, np.ndarray) or root is None:
        return _packed_in_session(pack, w, root, args)
    key = (id(root), w.__array_interface__["data"][0], w.shape, w.strides, w.dtype.str, pack, args)
    hit = _entries.get(key)
    if hit is not None:
        return hit
    if id(root) not in _keys_of:
        try:
            weakref.ref(root)
        except TypeError:       # a buffer type without weak references (bytes): kept while a session plans
            return _packed_in_session(pack, w, root, args)
    out = pack(w, *args)
    with _lock:
        if id(root) not in _keys_of:
            try:
                ref = weakref.ref(root, lambda _r, i=id(root): _forget(i))
            except TypeError:           # a buffer type without weak references: not kept
                return out
            _keys_of[id(root)] = (ref, set())
        _keys_of[id(root)][1].add(key)
        _entries[key] = out
    return out


def cached_count() -> int:
    """Packed arrays held now (tests)."""
    return len(_entries)


# ------------------------------------------------------------------ a session's shape-free parts of its kernels
# A model with open input dims is planned again at every new input shape, and its kernel factories recomputed
# what does not depend on the shape (a convolution's float weights and bias, its window and activation from the
# parameter tables): EfficientNet-B0 ~20 us a convolution, ~80 a shape. A session keeps those parts while it
# plans (Session._build_locked: `parts_of`), by the identity of the parameter objects they come from (which the
# entry holds, so an id names the same object while the entry lives); a factory called outside a session's
# planning (tests, the eager path) computes them every time.
_ACTIVE = threading.local()


class Parts:
    """A session's shape-free parts: key -> [value, the objects the key names by id (held), the plan that last
    used it]. An entry no plan used among the last KEEP_PLANS goes (a fusion that computes its weights at
    every plan, fuse_scalar_affine's, makes parameter objects of that plan's own: their parts must not pile up)."""

    KEEP_PLANS = 16

    def __init__(self):
        self.entries: dict = {}
        self.kept: dict = {}        # id -> array: the arrays node parts hold (their packs are kept too)
        self.memos: dict = {}       # name -> dict: plan stages' memos (session_memo)
        self.plan = 0

    def get(self, key, objects, make):
        hit = self.entries.get(key)
        if hit is None:
            hit = self.entries[key] = [make(), objects, self.plan]
            if isinstance(hit[0], np.ndarray):     # weights a node part holds: packed once too (packed_once)
                root = _root(hit[0])
                self.kept[id(root)] = root
        hit[2] = self.plan
        return hit[0]

    def planned(self) -> None:
        """A plan is done: every KEEP_PLANS plans, entries older than that go."""
        self.plan += 1
        if self.plan % self.KEEP_PLANS == 0:
            old = self.plan - self.KEEP_PLANS
            self.entries = {k: e for k, e in self.entries.items() if e[2] >= old}
            self.kept = {}
            for e in self.entries.values():
                if isinstance(e[0], np.ndarray):
                    root = _root(e[0])
                    self.kept[id(root)] = root


class parts_of:
    """`with parts_of(parts): ...`: factories called inside keep their shape-free parts in `parts` (a Parts)."""

    def __init__(self, parts: Parts):
        self.parts = parts

    def __enter__(self):
        self.before = getattr(_ACTIVE, "parts", None)
        _ACTIVE.parts = self.parts
        return self.parts

    def __exit__(self, *exc):
        _ACTIVE.parts = self.before
        self.parts.planned()


def node_part(tag: str, objects: tuple, make):
    """make(), or the value it gave for the same `tag` and the same (identical) parameter `objects` while this
    session plans. `objects` must be everything make() reads."""
    parts = getattr(_ACTIVE, "parts", None)
    if parts is None:
        return make()
    key = (tag,) + tuple(map(id, objects))
    hit = parts.entries.get(key)        # (Parts.get's hit, inline: ~100 calls at each new shape of EfficientNet-B0)
    if hit is not None:
        hit[2] = parts.plan
        return hit[0]
    return parts.get(key, objects, make)


def session_memo(name: str) -> dict | None:
    """A dict kept across the plans of the session planning now (None outside its planning): plan stages'
    memos (plan/shapes.py: its size is the graph's, not the number of plans)."""
    parts = getattr(_ACTIVE, "parts", None)
    return None if parts is None else parts.memos.setdefault(name, {})


def _packed_in_session(pack, w: np.ndarray, root, args):
    """pack(w, *args) for weights that own their data (a file's float16 weights made float32, weights a pass
    computed) or whose buffer takes no weak reference: kept in the planning session's parts where a node part
    holds the array (weights of a plan's own, trimmed for its shape, say, are packed every time)."""
    parts = getattr(_ACTIVE, "parts", None)
    if parts is None or id(root) not in parts.kept:
        return pack(w, *args)
    key = ("packed", id(root), w.__array_interface__["data"][0], w.shape, w.strides, w.dtype.str, pack, args)
    return parts.get(key, (root,), lambda: pack(w, *args))


def shape_free(tag: str, weight: np.ndarray, objects: tuple, values: tuple, make):
    """make(), or the value it gave while this session plans for the same `tag`, the same (identical) `weight`
    array and `objects`, and equal `values` (ints, strings: never floats, where 0.0 == -0.0 would pass for
    another value). For what a kernel factory computes from a layer's weights and parameters alone (a GEMM's
    padded bias and epilogue, a depthwise layer's bias in lanes): planned again at each new input shape, they
    cost ~10 us a layer. Only where the weights live across plans (a file's, or a node part's: packed_once's
    rule); weights of a plan's own (trimmed for its shape) compute every time. The entry holds the objects it is
    keyed by, so an id names the same object while it lives. The value is shared by the plans of a session:
    read-only to the kernels, as packed weights are."""
    parts = getattr(_ACTIVE, "parts", None)
    if parts is None:
        return make()
    key = (tag, id(weight), values) + tuple(map(id, objects))
    hit = parts.entries.get(key)
    if hit is not None:
        hit[2] = parts.plan
        return hit[0]
    root = _root(weight)
    if isinstance(root, np.ndarray) and id(root) not in parts.kept:
        return make()
    return parts.get(key, (weight,) + tuple(objects), make)
