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
        return pack(w, *args)
    key = (id(root), w.__array_interface__["data"][0], w.shape, w.strides, w.dtype.str, pack, args)
    hit = _entries.get(key)
    if hit is not None:
        return hit
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
