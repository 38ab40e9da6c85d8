"""Data-movement kernels: reshapes and views, joins and splits, slices, gathers, padding."""
from __future__ import annotations

import numpy as np

from ...ir.ops.tensor import reshape_dims
from . import kernel, returns, writes


def _ints(v) -> list[int]:
    return [int(x) for x in np.asarray(v).reshape(-1)]


@kernel("ConvertTensor", "Identity", "Dropout")
def passthrough(node, ins, outs):
    return returns(lambda i: [i[0]])


@kernel("Reshape")
def reshape(node, ins, outs):
    out_shape = tuple(outs[0].shape)
    if all(isinstance(d, int) for d in out_shape):
        return returns(lambda i: [i[0].reshape(out_shape)])
    return returns(lambda i: [i[0].reshape(reshape_dims(i[0].shape, _ints(i[1] if len(i) > 1 else node.param["dims"])))])


@kernel("Flatten")
def flatten(node, ins, outs):
    shape = tuple(outs[0].shape)
    return returns(lambda i: [i[0].reshape(shape)])


@kernel("Permute")
def permute(node, ins, outs):
    perm = _ints(node.param["dims"])
    return writes(lambda i, o: np.copyto(o[0], i[0].transpose(perm)))


@kernel("Transpose")
def transpose(node, ins, outs):
    perm = _ints(ins[1].value)
    return writes(lambda i, o: np.copyto(o[0], i[0].transpose(perm)))


@kernel("Squeeze", "Unsqueeze", "ExpandDims")
def squeeze(node, ins, outs):
    shape = tuple(outs[0].shape)
    return returns(lambda i: [i[0].reshape(shape)])


@kernel("Concat")
def concat(node, ins, outs):
    axis = int(node.param.get("axis", 0))
    return writes(lambda i, o: np.concatenate([np.asarray(a).astype(o[0].dtype, copy=False) for a in i],
                                              axis=axis, out=o[0]))


def split_bounds(node, ins, outs) -> tuple[int, list[int]]:
    """A Slice's axis and the piece boundaries along it ([0, ..., size])."""
    shape = ins[0].shape
    axis = int(node.param.get("axis", 0)) % len(shape)
    points = node.param.get("slicePoints")
    if node.param.get("sourceType", "CAFFE") == "CAFFE" and points is not None and len(points):
        cuts = _ints(points)
    else:
        sizes = _ints(ins[1].value) if len(ins) > 1 else (_ints(points) if points is not None and len(points) else
                                                         [shape[axis] // len(outs)] * len(outs))
        cuts = list(np.cumsum(sizes)[:-1])
    return axis, [0] + [int(c) for c in cuts] + [shape[axis]]


@kernel("Slice")
def split(node, ins, outs):
    # the pieces as precomputed index tuples: np.split costs 4 us a call, these 0.6 (an LSTM splits its
    # gates once per time step)
    axis, bounds = split_bounds(node, ins, outs)
    pieces = [(slice(None),) * axis + (slice(lo, hi),) for lo, hi in zip(bounds[:-1], bounds[1:])]
    return returns(lambda i: [i[0][p] for p in pieces])


def _onnx_slices(rank, starts, ends, axes, steps):
    sl = [slice(None)] * rank
    for s, e, a, st in zip(starts, ends, axes, steps):
        sl[a % rank] = slice(s, e, st)
    return tuple(sl)


def _tf_slices(shape, begin, end, strides, p):
    bm, em, sm = p.get("beginMask", 0), p.get("endMask", 0), p.get("shrinkAxisMask", 0)
    if p.get("ellipsisMask", 0) or p.get("newAxisMask", 0):
        raise ValueError("ellipsis/new-axis masks")
    sl = []
    for k in range(len(begin)):
        if sm >> k & 1:
            sl.append(begin[k])
            continue
        sl.append(slice(None if bm >> k & 1 else begin[k], None if em >> k & 1 else end[k], strides[k]))
    return tuple(sl)


@kernel("StridedSlice")
def strided_slice(node, ins, outs):
    rank = len(ins[0].shape)
    vals = [_ints(v.value) if v.value is not None else None for v in ins[1:]]
    if any(v is None for v in vals):
        def dyn(i):
            return [i[0][_slice_for(node, rank, ins[0].shape, [_ints(v) for v in i[1:]])]]
        return returns(dyn)
    sl = _slice_for(node, rank, ins[0].shape, vals)
    return returns(lambda i: [np.ascontiguousarray(i[0][sl])])


def _slice_for(node, rank, shape, vals):
    if node.param.get("fromType", 0) == 1:
        starts, ends = vals[0], vals[1]
        axes = vals[2] if len(vals) > 2 else list(range(len(starts)))
        steps = vals[3] if len(vals) > 3 else [1] * len(starts)
        return _onnx_slices(rank, starts, ends, axes, steps)
    strides = vals[2] if len(vals) > 2 else [1] * len(vals[0])
    return _tf_slices(shape, vals[0], vals[1], strides, node.param)


@kernel("SliceTf")
def slice_tf(node, ins, outs):
    def run(i):
        begin, size = _ints(i[1]), _ints(i[2])
        sl = tuple(slice(b, None if s < 0 else b + s) for b, s in zip(begin, size))
        return [i[0][sl]]
    return returns(run)


@kernel("GatherV2", "Gather")
def gather(node, ins, outs):
    axis = _ints(ins[2].value)[0] if len(ins) > 2 and ins[2].value is not None else int(node.param.get("axis", 0))

    def run(i):
        ax = axis % i[0].ndim
        idx = np.asarray(i[1]).astype(np.int64)
        idx = np.where(idx < 0, idx + i[0].shape[ax], idx)
        return [np.take(i[0], idx, axis=ax)]
    return returns(run)


@kernel("Shape")
def shape(node, ins, outs):
    return returns(lambda i: [np.array(i[0].shape, np.int32)])


@kernel("Rank")
def rank(node, ins, outs):
    return returns(lambda i: [np.array(i[0].ndim, np.int32)])


@kernel("Size")
def size(node, ins, outs):
    return returns(lambda i: [np.array(i[0].size, np.int32)])


@kernel("BroadcastTo")
def broadcast_to(node, ins, outs):
    def run(i):
        target = _ints(i[1])
        shape = np.broadcast_shapes(i[0].shape, tuple(target))
        return [np.ascontiguousarray(np.broadcast_to(i[0], shape))]
    return returns(run)


@kernel("Fill")
def fill(node, ins, outs):
    return returns(lambda i: [np.full(_ints(i[0]), np.asarray(i[1]).reshape(()), dtype=np.asarray(i[1]).dtype)])


@kernel("Padding")
def padding(node, ins, outs):
    mode = {"CONSTANT": "constant", "REFLECT": "reflect", "SYMMETRIC": "symmetric", "EDGE": "edge"}[
        node.param.get("mode", "CONSTANT")]

    def run(i):
        pads = _ints(i[1])
        width = [(pads[2 * k], pads[2 * k + 1]) for k in range(len(pads) // 2)]
        return [np.pad(i[0], width, mode=mode)]
    return returns(run)
