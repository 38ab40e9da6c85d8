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
MAX_PARTS = 8192        # entries a session keeps (cleared when full: planning recomputes them)


class parts_of:
    """`with parts_of(cache): ...`: factories called inside keep their shape-free parts in `cache` (a dict)."""

    def __init__(self, cache: dict):
        self.cache = cache

    def __enter__(self):
        self.before = getattr(_ACTIVE, "cache", None)
        _ACTIVE.cache = self.cache
        return self.cache

    def __exit__(self, *exc):
        _ACTIVE.cache = self.before


def node_part(tag: str, objects: tuple, make):
    """make(), or the value it gave for the same `tag` and the same (identical) parameter `objects` while this
    session plans. `objects` must be everything make() reads."""
    cache = getattr(_ACTIVE, "cache", None)
    if cache is None:
        return make()
    key = (tag,) + tuple(map(id, objects))
    hit = cache.get(key)
    if hit is not None:
        return hit[0]
    value = make()
    if len(cache) >= MAX_PARTS:
        cache.clear()
    cache[key] = (value, objects)       # the objects held: their ids stay theirs
    if isinstance(value, np.ndarray):   # weights a node part holds: packed once too (packed_once)
        root = _root(value)
        cache.setdefault(_KEPT, {})[id(root)] = root
    return value


def session_memo(name: str) -> dict | None:
    """A dict kept across the plans of the session planning now (None outside its planning): plan stages'
    memos (plan/shapes.py)."""
    cache = getattr(_ACTIVE, "cache", None)
    if cache is None:
        return None
    key = ("memo", name)
    hit = cache.get(key)
    if hit is None:
        if len(cache) >= MAX_PARTS:
            cache.clear()
        hit = cache[key] = ({}, None)
    return hit[0]


_KEPT = "kept arrays"      # in a session's parts: id -> array of the arrays its node parts hold


def _packed_in_session(pack, w: np.ndarray, root, args):
    """pack(w, *args) for weights that own their data (a file's float16 weights made float32, weights a pass
    computed): kept in the planning session's parts where a node part holds the array (weights of a plan's
    own, trimmed for its shape, say, are packed every time)."""
    cache = getattr(_ACTIVE, "cache", None)
    kept = cache.get(_KEPT) if cache is not None else None
    if not kept or id(root) not in kept:
        return pack(w, *args)
    key = ("packed", id(root), w.__array_interface__["data"][0], w.shape, w.strides, w.dtype.str, pack, args)
    hit = cache.get(key)
    if hit is None:
        if len(cache) >= MAX_PARTS:
            cache.clear()
        hit = cache[key] = (pack(w, *args), root)
    return hit[0]
