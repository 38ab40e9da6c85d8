"""Values of small known tensors (shape arithmetic), so that shapes computed at run time become known.

Only the ops that shape subgraphs use; the runtime's kernels cover the rest.
"""
from __future__ import annotations

import numpy as np

BINARY = {"ADD": np.add, "SUB": np.subtract, "MUL": np.multiply, "REALDIV": np.true_divide,
          "DIV": np.floor_divide, "FLOORDIV": np.floor_divide, "MOD": np.mod, "FLOORMOD": np.mod,
          "MAXIMUM": np.maximum, "MINIMUM": np.minimum, "EQUAL": np.equal, "LESS": np.less,
          "GREATER": np.greater}


def _strided(node, x, starts, ends, axes=None, steps=None):
    if node.param.get("fromType", 0) != 1:
        return None
    sl = [slice(None)] * x.ndim
    axes = range(len(starts)) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    for s, e, a, st in zip(starts, ends, axes, steps):
        sl[int(a)] = slice(int(s), int(e), int(st))
    return x[tuple(sl)]


def value(node, vals):
    p = node.param
    op = node.op
    if op == "BinaryOp" and p.get("opType") in BINARY:
        out = BINARY[p["opType"]](vals[0], vals[1])
        return out.astype(vals[0].dtype) if out.dtype != bool else out
    if op == "Concat":
        return np.concatenate([np.atleast_1d(v) for v in vals], axis=p.get("axis", 0))
    if op == "Unsqueeze":
        dims = p.get("squeezeDims")
        return np.expand_dims(vals[0], tuple(int(d) for d in (dims if dims is not None else vals[1])))
    if op == "Squeeze":
        dims = p.get("squeezeDims")
        return np.squeeze(vals[0], tuple(int(d) for d in dims) if dims is not None and len(dims) else None)
    if op == "GatherV2":
        axis = int(np.asarray(vals[2]).reshape(-1)[0]) if len(vals) > 2 else 0
        return np.take(vals[0], vals[1], axis=axis)
    if op == "SliceTf":
        begin, size = np.asarray(vals[1]).reshape(-1), np.asarray(vals[2]).reshape(-1)
        return vals[0][tuple(slice(int(b), None if s < 0 else int(b + s)) for b, s in zip(begin, size))]
    if op == "StridedSlice":
        return _strided(node, vals[0], *[np.asarray(v).reshape(-1) for v in vals[1:]])
    if op == "Reshape":
        return vals[0].reshape([int(d) for d in (vals[1] if len(vals) > 1 else p["dims"])])
    if op == "Cast":
        return vals[0]
    if op == "Identity":
        return vals[0]
    return None
