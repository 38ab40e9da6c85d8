"""Ops that index: arg-reductions, sorting and selection, gathers and scatters by index tensors,
sequence generators. Indices are int32 (MNN has no int64 tensors)."""
from __future__ import annotations

import numpy as np

from . import Val, define, ints, known, params, same


def _axis_of(operand, default=0) -> int:
    return ints(operand)[0] if operand is not None else default


@define("ArgMax", "ArgMin", param="ArgMax", kind="reduction")
class ArgMax:
    """The first index of the largest (smallest) value along `axis`, the axis removed."""
    def infer(node, ins):
        shape = ins[0].shape
        axis = params(node)["axis"] % len(shape)
        return [Val(tuple(d for i, d in enumerate(shape) if i != axis), "int32")]

    def compute(node, xs):
        x = xs[0]
        axis = params(node)["axis"] % x.ndim
        fn = np.argmax if node.op == "ArgMax" else np.argmin
        return fn(x, axis=axis).astype(np.int32)


@define("TopKV2", param="TopKV2", inputs=("x", "k"), kind="index")
class TopKV2:
    """The k largest (smallest when not `largest`) values along the last axis and their indices; ties
    keep the lower index first."""
    def infer(node, ins):
        k = known(ins[1], "k", node)[0]
        shape = tuple(ins[0].shape[:-1]) + (k,)
        return [Val(shape, ins[0].dtype), Val(shape, "int32")]

    def compute(node, xs):
        x, k = xs[0], ints(xs[1])[0]
        largest = params(node)["largest"]
        key = -x.astype(np.float64) if largest and x.dtype.kind == "f" else (-x.astype(np.int64) if largest else x)
        idx = np.argsort(key, axis=-1, kind="stable")[..., :k]
        return [np.take_along_axis(x, idx, axis=-1), idx.astype(np.int32)]


@define("CumSum", "CumProd", param="CumSum", inputs=("x", "axis"), kind="reduction")
class CumSum:
    """Running sum (product) along the axis input; exclusive starts from the identity, reverse runs
    from the end."""
    infer = same

    def compute(node, xs):
        x = xs[0]
        axis = _axis_of(xs[1]) % x.ndim
        p = params(node)
        fn = np.cumsum if node.op == "CumSum" else np.cumprod
        if p["reverse"]:
            x = np.flip(x, axis)
        out = fn(x, axis=axis, dtype=x.dtype)
        if p["exclusive"]:
            ident = np.zeros_like if node.op == "CumSum" else np.ones_like
            head = ident(np.take(out, [0], axis=axis))
            out = np.concatenate([head, np.take(out, np.arange(x.shape[axis] - 1), axis=axis)], axis=axis)
        return np.flip(out, axis) if p["reverse"] else out


def _wrap(idx, size):
    idx = np.asarray(idx).astype(np.int64)
    return np.where(idx < 0, idx + size, idx)


@define("GatherElements", inputs=("x", "indices", "axis"), kind="index")
class GatherElements:
    """out[i][j][k] = x[index][j][k] along the axis (ONNX GatherElements); negative indices count back."""
    def infer(node, ins):
        return [Val(ins[1].shape, ins[0].dtype)]

    def compute(node, xs):
        x = xs[0]
        axis = _axis_of(xs[2] if len(xs) > 2 else None) % x.ndim
        idx = _wrap(xs[1], x.shape[axis])
        x = x[tuple(slice(None) if a == axis else slice(0, n) for a, n in enumerate(idx.shape))]
        return np.take_along_axis(x, idx, axis=axis)


@define("GatherND", param="Axis", inputs=("x", "indices"), kind="index")
class GatherND:
    """ONNX GatherND with `axis` batch dims (MNN's converter folds batch dims into the indices)."""
    def infer(node, ins):
        b = params(node)["axis"]
        ishape, xshape = ins[1].shape, ins[0].shape
        return [Val(tuple(ishape[:-1]) + tuple(xshape[b + ishape[-1]:]), ins[0].dtype)]

    def compute(node, xs):
        x, idx = xs[0], np.asarray(xs[1]).astype(np.int64)
        b = params(node)["axis"]
        if b:
            batch = int(np.prod(x.shape[:b]))
            xr = x.reshape((batch,) + x.shape[b:])
            ir = idx.reshape((batch, -1, idx.shape[-1]))
            out = np.stack([xr[i][tuple(_wrap(ir[i][..., k], xr.shape[1 + k]) for k in range(idx.shape[-1]))]
                            for i in range(batch)])
            return out.reshape(idx.shape[:-1] + x.shape[b + idx.shape[-1]:])
        m = idx.shape[-1]
        return x[tuple(_wrap(idx[..., k], x.shape[k]) for k in range(m))]


SCATTER_REDUCE = {"ADD": np.add, "MUL": np.multiply, "MAXIMUM": np.maximum, "MINIMUM": np.minimum}


@define("ScatterElements", param="BinaryOp", inputs=("x", "indices", "updates", "axis"), kind="index")
class ScatterElements:
    """x with updates written at the indices along the axis; opType -1 replaces, else reduces."""
    infer = same

    def compute(node, xs):
        out = np.array(xs[0], copy=True)
        axis = _axis_of(xs[3] if len(xs) > 3 else None) % out.ndim
        idx = _wrap(xs[1], out.shape[axis])
        upd = np.asarray(xs[2]).astype(out.dtype)
        op = params(node)["opType"]
        red = SCATTER_REDUCE.get(op) if isinstance(op, str) else None
        for pos in np.ndindex(*idx.shape):
            tgt = list(pos)
            tgt[axis] = idx[pos]
            tgt = tuple(tgt)
            out[tgt] = red(out[tgt], upd[pos]) if red else upd[pos]
        return out


@define("ScatterNd", param="BinaryOp", inputs=("indices", "updates", "shape", "x?"), kind="index")
class ScatterNd:
    """A tensor of `shape` (or the 4th input) with updates written at the index tuples."""
    def infer(node, ins):
        if len(ins) > 3:
            return [Val(ins[3].shape, ins[3].dtype)]
        return [Val(tuple(known(ins[2], "shape", node)), ins[1].dtype)]

    def compute(node, xs):
        idx, upd = np.asarray(xs[0]).astype(np.int64), np.asarray(xs[1])
        out = np.array(xs[3], copy=True) if len(xs) > 3 and xs[3] is not None else np.zeros(ints(xs[2]), upd.dtype)
        op = params(node)["opType"]
        red = SCATTER_REDUCE.get(op) if isinstance(op, str) else None
        m = idx.shape[-1]
        flat_idx = idx.reshape(-1, m)
        flat_upd = upd.reshape((flat_idx.shape[0],) + out.shape[m:])
        for k in range(flat_idx.shape[0]):
            tgt = tuple(_wrap(flat_idx[k], np.array(out.shape[:m])))
            out[tgt] = red(out[tgt], flat_upd[k]) if red else flat_upd[k]
        return out


@define("Where", param="Extra", inputs=("condition",), kind="index")
class Where:
    """TensorFlow's where with one input: the coordinates of the non-zero elements, [count, rank]. MNN
    counts wrongly without its parameter table (Extra {vector: false}, as its converter writes it)."""
    def infer(node, ins):
        if ins[0].value is None:
            raise ValueError("the count is known only at run time")
        return [Val((int(np.count_nonzero(ins[0].value)), len(ins[0].shape)), "int32")]

    def compute(node, xs):
        return np.argwhere(np.asarray(xs[0]) != 0).astype(np.int32).reshape(-1, np.ndim(xs[0]))


@define("Unique", inputs=("x",), kind="index")
class Unique:
    """MNN's Unique (CPUUnique.cpp): the distinct values of a flattened tensor ordered by their 32-bit
    pattern read as int32 (value order for integers; for floats, negatives come after positives, largest
    first), with - for 3 or 4 outputs - the first index of each, the index of each element's value and
    the counts; with 2 outputs the second is that per-element index. ONNX's orders are built on it by
    its converter (frontends/onnx/index.py)."""
    def infer(node, ins):
        if ins[0].value is None:
            raise ValueError("the count is known only at run time")
        return [Val(v.shape, str(v.dtype)) for v in Unique.compute(node, [np.asarray(ins[0].value)])]

    def compute(node, xs):
        x = np.asarray(xs[0]).reshape(-1)
        bits = x.astype(np.float32).view(np.int32) if x.dtype.kind == "f" else x.astype(np.int32)
        keys, first, inverse, counts = np.unique(bits, return_index=True, return_inverse=True, return_counts=True)
        values = x[first]
        if len(node.outputs) == 2:
            return [values, inverse.reshape(-1).astype(np.int32)]
        outs = [values, first.astype(np.int32), inverse.reshape(-1).astype(np.int32), counts.astype(np.int32)]
        return outs[:max(len(node.outputs), 1)]


@define("OneHot", param="OneHotParam", inputs=("indices", "depth", "on", "off"), kind="generator",
        grows=True)
class OneHot:
    """on where the index hits, off elsewhere, along a new `axis`; negative indices count back from depth."""
    def infer(node, ins):
        depth = known(ins[1], "depth", node)[0]
        shape = list(ins[0].shape)
        axis = params(node)["axis"]
        axis = axis % (len(shape) + 1)
        shape.insert(axis, depth)
        return [Val(tuple(shape), ins[2].dtype)]

    def compute(node, xs):
        idx = np.asarray(xs[0]).astype(np.int64)
        depth = ints(xs[1])[0]
        on, off = np.asarray(xs[2]).reshape(-1)[0], np.asarray(xs[3]).reshape(-1)[0]
        idx = np.where(idx < 0, idx + depth, idx)
        axis = params(node)["axis"] % (idx.ndim + 1)
        hot = idx[..., None] == np.arange(depth)
        out = np.where(hot, on, off).astype(np.asarray(xs[2]).dtype)
        return np.moveaxis(out, -1, axis)


@define("EyeLike", inputs=("x", "k"), kind="generator", grows=True)
class EyeLike:
    """Ones on the k-th diagonal of a matrix shaped like x."""
    infer = same

    def compute(node, xs):
        k = _axis_of(xs[1] if len(xs) > 1 else None)
        return np.eye(xs[0].shape[0], xs[0].shape[1], k=k, dtype=xs[0].dtype)


@define("Tile", inputs=("x", "repeats"), kind="movement", grows=True, spreads_grid=True)
class Tile:
    def infer(node, ins):
        reps = known(ins[1], "repeats", node)
        return [Val(tuple(d * r if isinstance(d, int) else d for d, r in zip(ins[0].shape, reps)), ins[0].dtype)]

    def compute(node, xs):
        return np.tile(xs[0], ints(xs[1]))


@define("Range", param="Range", inputs=("start", "limit", "delta"), kind="generator", grows=True)
class Range:
    def infer(node, ins):
        """Bounds known only at run time give a length of its own name: the rank still flows on (a
        decoder's positions arange(past, past + new) feed its embeddings and mask)."""
        if any(v.value is None for v in ins):
            return [Val((f"len({node.outputs[0]})",), ins[0].dtype)]
        start, limit, delta = (np.asarray(v.value) for v in ins)
        n = max(int(np.ceil((float(np.asarray(limit).reshape(-1)[0]) - float(np.asarray(start).reshape(-1)[0]))
                            / float(np.asarray(delta).reshape(-1)[0]))), 0)
        return [Val((n,), ins[0].dtype)]

    def compute(node, xs):
        start, limit, delta = (np.asarray(v).reshape(-1)[0] for v in xs)
        n = max(int(np.ceil((float(limit) - float(start)) / float(delta))), 0)
        return (start + np.arange(n) * delta).astype(np.asarray(xs[0]).dtype)


@define("Pack", param="PackParam", inputs=("*xs",), kind="movement", spreads_grid=True)
class Pack:
    """np.stack along `axis`."""
    def infer(node, ins):
        shape = list(ins[0].shape)
        axis = params(node)["axis"] % (len(shape) + 1)
        shape.insert(axis, len(ins))
        return [Val(tuple(shape), ins[0].dtype)]

    def compute(node, xs):
        shape = np.broadcast_shapes(*[np.shape(x) for x in xs])
        return np.stack([np.broadcast_to(x, shape) for x in xs], axis=params(node)["axis"])


@define("Unpack", param="Axis", inputs=("x",), kind="movement", spreads_grid=True)
class Unpack:
    """Pack's inverse (MNN's Unpack, TF's Unstack): one output per index along `axis`, that axis dropped. MNN's
    converter writes it (a grouped convolution's pieces, a FastViT's attention split), so files it made
    carry it."""
    def infer(node, ins):
        shape = list(ins[0].shape)
        del shape[params(node)["axis"] % len(shape)]
        return [Val(tuple(shape), ins[0].dtype) for _ in node.outputs]

    def compute(node, xs):
        x = np.asarray(xs[0])
        axis = params(node)["axis"] % x.ndim
        if x.shape[axis] != len(node.outputs):
            from ...errors import InvalidModel
            raise InvalidModel(f"Unpack '{node.name}': {len(node.outputs)} outputs for an axis of {x.shape[axis]}")
        return [np.take(x, k, axis=axis) for k in range(x.shape[axis])]


@define("ZerosLike", inputs=("x",), kind="generator")
class ZerosLike:
    infer = same

    def compute(node, xs):
        return np.zeros_like(xs[0])


@define("CastLike", inputs=("x", "like"))
class CastLike:
    def infer(node, ins):
        return [Val(ins[0].shape, ins[1].dtype)]

    def compute(node, xs):
        return xs[0].astype(np.asarray(xs[1]).dtype)


def depth_space(x, block, mode, to_space):
    n, c, h, w = x.shape
    b = block
    if to_space:
        if mode == "DCR":
            y = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
        else:
            y = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
        return y.reshape(n, c // (b * b), h * b, w * b)
    y = x.reshape(n, c, h // b, b, w // b, b)
    y = y.transpose(0, 3, 5, 1, 2, 4) if mode == "DCR" else y.transpose(0, 1, 3, 5, 2, 4)
    return y.reshape(n, c * b * b, h // b, w // b)


@define("DepthToSpace", "SpaceToDepth", param="DepthSpaceParam", kind="movement", spreads_grid=True)
class DepthToSpace:
    """Channel blocks to pixels and back (DCR or CRD order), NCHW."""
    def infer(node, ins):
        n, c, h, w = ins[0].shape
        b = params(node)["blockSize"]
        if node.op == "DepthToSpace":
            return [Val((n, c // (b * b), h * b, w * b), ins[0].dtype)]
        return [Val((n, c * b * b, h // b, w // b), ins[0].dtype)]

    def compute(node, xs):
        return depth_space(xs[0], params(node)["blockSize"], params(node)["mode"],
                           node.op == "DepthToSpace")
