"""Ops that move data without arithmetic: shapes, slices, joins and layout."""
from __future__ import annotations

import numpy as np

from ..dtypes import from_mnn
from . import Val, define, ints, known, numel, params, same
from .elementwise import broadcast


@define("Input", param="Input", inputs=(), kind="input")
class Input:
    def infer(node, ins):
        dims = node.param.get("dims")
        return [Val(tuple(int(d) if d >= 0 else f"d{i}" for i, d in enumerate(dims)) if dims is not None else None,
                    from_mnn(params(node)["dtype"]))]

    def compute(node, xs):
        raise ValueError("an Input has no value of its own")


@define("Concat", param="Axis", inputs=("*xs",), kind="movement", spreads_grid=True)
class Concat:
    def infer(node, ins):
        rank = len(ins[0].shape)
        axis = params(node)["axis"] % rank
        out = list(ins[0].shape)
        total = 0
        for v in ins:
            d = v.shape[axis]
            if not isinstance(d, int):
                total = d
                break
            total += d
        out[axis] = total
        return [Val(tuple(out), ins[0].dtype)]

    def compute(node, xs):
        return np.concatenate([np.atleast_1d(v) for v in xs], axis=params(node)["axis"])


def split_points(node, shape, sizes=None) -> tuple[int, list[int]]:
    """A Slice's axis and its piece boundaries [0, ..., size]."""
    axis = params(node)["axis"] % len(shape)
    points = node.param.get("slicePoints")
    n_out = len(node.outputs)
    if sizes is not None:
        cuts = list(np.cumsum(ints(sizes))[:-1])
    elif points is not None and len(points):
        cuts = ints(points)
    else:
        step = -(-shape[axis] // n_out)
        cuts = [step * k for k in range(1, n_out)]
    return axis, [0] + [min(int(c), shape[axis]) for c in cuts] + [shape[axis]]


@define("Slice", param="Slice", inputs=("x", "sizes?"), kind="movement", spreads_grid=True)
class Slice:
    """Caffe-style split: cut points along one axis (or the sizes input), one output per piece."""
    def infer(node, ins):
        shape = list(ins[0].shape)
        sizes = known(ins[1], "split sizes", node) if len(ins) > 1 else None
        axis, bounds = split_points(node, shape, sizes)
        outs = []
        for a, b in zip(bounds[:-1], bounds[1:]):
            s = list(shape)
            s[axis] = b - a if isinstance(b, int) and isinstance(a, int) else None
            outs.append(Val(tuple(s), ins[0].dtype))
        return outs

    def compute(node, xs):
        axis, bounds = split_points(node, xs[0].shape, xs[1] if len(xs) > 1 else None)
        sl = (slice(None),) * axis
        return [xs[0][sl + (slice(a, b),)] for a, b in zip(bounds[:-1], bounds[1:])]


def onnx_slices(rank, starts, ends, axes, steps):
    sl = [slice(None)] * rank
    for s, e, a, st in zip(starts, ends, axes, steps):
        sl[int(a) % rank] = slice(int(s), int(e), int(st))
    return tuple(sl)


def tf_slices(rank, begin, end, strides, p):
    """TensorFlow StridedSlice with begin/end/shrink/new-axis/ellipsis masks, as an index tuple."""
    bm, em, sm = p["beginMask"], p["endMask"], p["shrinkAxisMask"]
    nm, el = p["newAxisMask"], p["ellipsisMask"]
    sl: list = []
    for k in range(len(begin)):
        if el >> k & 1:
            sl.append(Ellipsis)
        elif nm >> k & 1:
            sl.append(None)
        elif sm >> k & 1:
            sl.append(int(begin[k]))
        else:
            sl.append(slice(None if bm >> k & 1 else int(begin[k]), None if em >> k & 1 else int(end[k]),
                            int(strides[k])))
    return tuple(sl)


def strided_index(node, rank, operands):
    """The index tuple of a StridedSlice from its operand values (starts, ends[, axes][, steps])."""
    vals = [ints(v) for v in operands]
    if params(node)["fromType"] == 1:
        starts, ends = vals[0], vals[1]
        axes = vals[2] if len(vals) > 2 else list(range(len(starts)))
        steps = vals[3] if len(vals) > 3 else [1] * len(starts)
        if any(s == 0 for s in steps):
            raise ValueError("slice step 0")
        return onnx_slices(rank, starts, ends, axes, steps)
    strides = vals[2] if len(vals) > 2 else [1] * len(vals[0])
    return tf_slices(rank, vals[0], vals[1], strides, node.param)


@define("StridedSlice", param="StridedSliceParam", inputs=("x", "begin", "end", "axes?", "steps?"),
        kind="movement", spreads_grid=True)
class StridedSlice:
    """fromType 1: ONNX Slice (starts, ends, axes, steps); else TensorFlow's with its masks."""
    def infer(node, ins):
        operands = [known(v, "slice bounds", node) for v in ins[1:]]
        shape = ins[0].shape
        if not all(isinstance(d, int) for d in shape):
            if params(node)["fromType"] != 1:
                raise ValueError("symbolic dims")
            out = list(shape)
            idx = strided_index(node, len(shape), operands)
            for a, s in enumerate(idx):
                if s != slice(None) and isinstance(shape[a], int):
                    out[a] = len(range(*s.indices(shape[a])))
                elif s != slice(None):
                    out[a] = None
            return [Val(tuple(out), ins[0].dtype)]
        dummy = np.empty(shape, np.uint8) if numel(shape) <= 1 << 24 else None
        if dummy is None:
            raise ValueError("too large to infer by example")
        return [Val(dummy[strided_index(node, len(shape), operands)].shape, ins[0].dtype)]

    def compute(node, xs):
        return np.ascontiguousarray(xs[0][strided_index(node, xs[0].ndim, xs[1:])])


@define("SliceTf", param="SliceTf", inputs=("x", "begin", "size"), kind="movement")
class SliceTf:
    """TensorFlow slice: begin and size (-1 = to the end)."""
    def infer(node, ins):
        begin, size = known(ins[1], "begin", node), known(ins[2], "size", node)
        shape = tuple(s if s >= 0 else (d - b if isinstance(d, int) else d)
                      for d, b, s in zip(ins[0].shape, begin, size)) + tuple(ins[0].shape[len(begin):])
        return [Val(shape, ins[0].dtype)]

    def compute(node, xs):
        begin, size = ints(xs[1]), ints(xs[2])
        return xs[0][tuple(slice(b, None if s < 0 else b + s) for b, s in zip(begin, size))]


def _gather_axis(node, operand):
    if operand is not None:
        return ints(operand)[0]
    return int(node.param.get("axis", 0))   # a field of the Axis table some files write (GatherV2 has none)


@define("GatherV2", "Gather", param="GatherV2", inputs=("x", "indices", "axis?"), kind="index")
class GatherV2:
    """np.take along axis (the 3rd input, default 0); negative indices count from the end."""
    def infer(node, ins):
        axis = _gather_axis(node, known(ins[2], "axis", node) if len(ins) > 2 else None)
        shape = ins[0].shape
        axis %= len(shape)
        return [Val(tuple(shape[:axis]) + tuple(ins[1].shape) + tuple(shape[axis + 1:]), ins[0].dtype)]

    def compute(node, xs):
        x = xs[0]
        axis = _gather_axis(node, xs[2] if len(xs) > 2 else None) % x.ndim
        idx = np.asarray(xs[1]).astype(np.int64)
        idx = np.where(idx < 0, idx + x.shape[axis], idx)
        if idx.size and (idx.min() < 0 or idx.max() >= x.shape[axis]):
            raise IndexError(f"{node.op} '{node.name}': index out of range for axis of size {x.shape[axis]}")
        return np.take(x, idx, axis=axis)


def reshape_dims(in_shape, dims, allow_zero=False):
    dims = list(dims)
    if not allow_zero:
        for i, d in enumerate(dims):
            if d == 0 and i < len(in_shape):
                dims[i] = in_shape[i]
    if -1 in dims:
        known_ = numel([d for d in dims if d != -1])
        total = numel(in_shape)
        if all(isinstance(d, int) for d in in_shape):
            dims[dims.index(-1)] = total // max(known_, 1) if known_ else 0
        else:
            dims[dims.index(-1)] = "d?"
    return tuple(dims)


@define("Reshape", param="Reshape", inputs=("x", "shape?"), kind="movement", moves="view")
class Reshape:
    """dims or the shape input; 0 copies the input's dim, -1 is inferred."""
    def infer(node, ins):
        dims = node.param.get("dims")
        if dims is None or len(dims) == 0 or len(ins) > 1:
            target = ins[1]
            if target.value is None and target.shape is not None and len(target.shape) == 1 and \
                    isinstance(target.shape[0], int):       # a shape computed at run time: its rank is known
                return [Val(tuple(f"{node.outputs[0]}_d{k}" for k in range(target.shape[0])), ins[0].dtype)]
            dims = known(target, "target shape", node)
        return [Val(reshape_dims(ins[0].shape, [int(d) for d in dims]), ins[0].dtype)]

    def compute(node, xs):
        dims = ints(xs[1]) if len(xs) > 1 else ints(node.param["dims"])
        return xs[0].reshape(reshape_dims(xs[0].shape, dims))


def _flatten_axis(axis: int, rank: int) -> int:
    """ONNX's (and MNN's) axis in [-rank, rank]: rank itself flattens everything into the first dim
    ([prod, 1]); only a negative axis counts from the end."""
    return axis + rank if axis < 0 else axis


@define("Flatten", param="Flatten", kind="movement", moves="view")
class Flatten:
    def infer(node, ins):
        shape = ins[0].shape
        axis = _flatten_axis(params(node)["axis"], len(shape))
        def part(dims, k):    # an open dim leaves the product open
            return numel(dims) if all(isinstance(d, int) for d in dims) else f"{node.outputs[0]}_d{k}"
        return [Val((part(shape[:axis], 0), part(shape[axis:], 1)), ins[0].dtype)]

    def compute(node, xs):
        x = xs[0]
        axis = _flatten_axis(params(node)["axis"], x.ndim)
        return x.reshape(int(np.prod(x.shape[:axis])), -1) if x.size else x.reshape(int(np.prod(x.shape[:axis])), int(np.prod(x.shape[axis:])))


@define("Permute", param="Permute", kind="movement", moves="permute")
class Permute:
    def infer(node, ins):
        return [Val(tuple(ins[0].shape[p] for p in ints(node.param["dims"])), ins[0].dtype)]

    def compute(node, xs):
        return np.ascontiguousarray(xs[0].transpose(ints(node.param["dims"])))


@define("Transpose", param="Transpose", inputs=("x", "perm"), kind="movement", moves="permute")
class Transpose:
    def infer(node, ins):
        return [Val(tuple(ins[0].shape[p] for p in known(ins[1], "perm", node)), ins[0].dtype)]

    def compute(node, xs):
        return np.ascontiguousarray(xs[0].transpose(ints(xs[1])))


@define("ReverseSequence", param="ReverseSequenceParam", inputs=("x", "lengths"), kind="movement",
        moves="permute")
class ReverseSequence:
    """Each batch entry's first lengths[b] steps along seqDim in reverse order, the rest as they are
    (TensorFlow's and ONNX's ReverseSequence). MNN refuses a length outside 1..steps and a lengths
    tensor that is not one per batch entry; so does this."""
    infer = same

    def compute(node, xs):
        p = params(node)
        x = np.asarray(xs[0])
        batch, seq = p["batchDim"] % x.ndim, p["seqDim"] % x.ndim
        y = np.moveaxis(x, (batch, seq), (0, 1))
        lengths = ints(xs[1])
        if batch == seq or len(lengths) != y.shape[0] or any(not 1 <= n <= y.shape[1] for n in lengths):
            raise ValueError(f"ReverseSequence '{node.name}': lengths {lengths} for {y.shape[0]} sequences of "
                             f"{y.shape[1]} steps (each must be 1..{y.shape[1]})")
        out = np.array(y, copy=True)
        for b, n in enumerate(lengths):
            out[b, :n] = y[b, :n][::-1]
        return np.moveaxis(out, (0, 1), (batch, seq))


def _squeeze_axes(node, shape, operand):
    dims = node.param.get("squeezeDims")
    if (dims is None or len(dims) == 0) and operand is not None:
        dims = ints(operand)
    if dims is None or len(dims) == 0:
        return {i for i, d in enumerate(shape) if d == 1}
    return {int(d) % len(shape) for d in dims}


@define("Squeeze", param="SqueezeParam", inputs=("x", "axes?"), kind="movement", moves="view")
class Squeeze:
    def infer(node, ins):
        axes = _squeeze_axes(node, ins[0].shape, known(ins[1], "axes", node) if len(ins) > 1 else None)
        return [Val(tuple(d for i, d in enumerate(ins[0].shape) if i not in axes), ins[0].dtype)]

    def compute(node, xs):
        axes = _squeeze_axes(node, xs[0].shape, xs[1] if len(xs) > 1 else None)
        return xs[0].reshape(tuple(d for i, d in enumerate(xs[0].shape) if i not in axes))


def _unsqueezed(node, shape, operand):
    dims = node.param.get("squeezeDims")
    if dims is None or len(dims) == 0:
        dims = node.param.get("axis")   # ExpandDims from an Axis table (SqueezeParam has no axis)
        dims = [dims] if isinstance(dims, int) else dims
    if dims is None or len(dims) == 0:
        dims = ints(operand)
    out = list(shape)
    rank = len(shape) + len(dims)
    for d in sorted(int(x) % rank for x in dims):
        out.insert(d, 1)
    return tuple(out)


@define("Unsqueeze", "ExpandDims", param="SqueezeParam", inputs=("x", "axes?"), kind="movement",
        moves="view")
class Unsqueeze:
    def infer(node, ins):
        operand = known(ins[1], "axes", node) if len(ins) > 1 else None
        return [Val(_unsqueezed(node, ins[0].shape, operand), ins[0].dtype)]

    def compute(node, xs):
        return xs[0].reshape(_unsqueezed(node, xs[0].shape, xs[1] if len(xs) > 1 else None))


@define("Shape", kind="shape")
class Shape:
    def infer(node, ins):
        shape = ins[0].shape
        value = np.array(shape, dtype=np.int32) if all(isinstance(d, int) for d in shape) else None
        return [Val((len(shape),), "int32", value)]

    def compute(node, xs):
        return np.array(xs[0].shape, np.int32)


@define("Rank", kind="shape")
class Rank:
    def infer(node, ins):
        return [Val((), "int32", np.array(len(ins[0].shape), dtype=np.int32))]

    def compute(node, xs):
        return np.array(xs[0].ndim, np.int32)


@define("Size", param="Size", kind="shape")
class Size:
    def infer(node, ins):
        shape = ins[0].shape
        value = np.array(numel(shape), np.int32) if all(isinstance(d, int) for d in shape) else None
        return [Val((), "int32", value)]

    def compute(node, xs):
        return np.array(xs[0].size, np.int32)


@define("BroadcastTo", inputs=("x", "shape"), kind="movement", grows=True, spreads_grid=True)
class BroadcastTo:
    """ONNX Expand: the input broadcast with the target shape (either may be larger)."""
    def infer(node, ins):
        return [Val(broadcast(ins[0].shape, tuple(known(ins[1], "target shape", node))), ins[0].dtype)]

    def compute(node, xs):
        shape = np.broadcast_shapes(xs[0].shape, tuple(ints(xs[1])))
        return np.ascontiguousarray(np.broadcast_to(xs[0], shape))


@define("Fill", inputs=("shape", "value"), kind="generator", grows=True)
class Fill:
    def infer(node, ins):
        return [Val(tuple(known(ins[0], "shape", node)), ins[1].dtype)]

    def compute(node, xs):
        value = np.asarray(xs[1])
        return np.full(ints(xs[0]), value.reshape(-1)[0] if value.size else 0, dtype=value.dtype)


PAD_MODES = {"CONSTANT": "constant", "REFLECT": "reflect", "SYMMETRIC": "symmetric", "EDGE": "edge"}


@define("Padding", param="PadParam", inputs=("x", "pads", "value?"), kind="movement", grows=True,
        spreads_grid=True)
class Padding:
    """pads as [begin0, end0, begin1, end1, ...]; negative pads crop; the 3rd input is the fill value."""
    def infer(node, ins):
        pads = known(ins[1], "pads", node)
        shape = tuple(d + pads[2 * i] + pads[2 * i + 1] if isinstance(d, int) and 2 * i + 1 < len(pads) else d
                      for i, d in enumerate(ins[0].shape))
        return [Val(shape, ins[0].dtype)]

    def compute(node, xs):
        x = xs[0]
        pads = ints(xs[1]) + [0] * (2 * x.ndim - len(ints(xs[1])))
        crop = tuple(slice(max(-pads[2 * i], 0), x.shape[i] - max(-pads[2 * i + 1], 0)) for i in range(x.ndim))
        x = x[crop]
        width = [(max(pads[2 * i], 0), max(pads[2 * i + 1], 0)) for i in range(x.ndim)]
        mode = PAD_MODES[params(node)["mode"]]
        if mode == "constant":
            value = np.asarray(xs[2]).reshape(-1)[0] if len(xs) > 2 and xs[2] is not None and np.size(xs[2]) else 0
            return np.pad(x, width, mode="constant", constant_values=value)
        return np.pad(x, width, mode=mode)
