"""Ops that move data without arithmetic: shapes, slices, joins and layout."""
from __future__ import annotations

import numpy as np

from ...format.dtypes import from_mnn
from . import Val, numel, register
from .elementwise import broadcast


def _known(v: Val, what: str, node):
    if v.value is None:
        raise ValueError(f"{node.op} '{node.name}': {what} must be known when shapes are inferred")
    return [int(x) for x in np.asarray(v.value).reshape(-1)]


@register("Input", "Input")
def _input(node, ins):
    dims = node.param.get("dims")
    return [Val(tuple(int(d) if d >= 0 else f"d{i}" for i, d in enumerate(dims)) if dims is not None else None,
                from_mnn(node.param.get("dtype", "DT_FLOAT")))]


@register("Concat", "Axis")
def _concat(node, ins):
    rank = len(ins[0].shape)
    axis = node.param.get("axis", 0) % rank
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


@register("Slice", "Slice")
def _split(node, ins):
    """Caffe-style split: cut points along one axis, one output per piece."""
    shape = list(ins[0].shape)
    axis = node.param.get("axis", 0) % len(shape)
    points = [0] + [int(p) for p in node.param.get("slicePoints", [])] + [shape[axis]]
    outs = []
    for a, b in zip(points[:-1], points[1:]):
        s = list(shape)
        s[axis] = b - a
        outs.append(Val(tuple(s), ins[0].dtype))
    return outs


@register("StridedSlice", "StridedSliceParam")
def _strided_slice(node, ins):
    """ONNX-style slice (fromType 1): inputs data, starts, ends, axes[, steps]."""
    shape = list(ins[0].shape)
    starts, ends = _known(ins[1], "starts", node), _known(ins[2], "ends", node)
    axes = _known(ins[3], "axes", node) if len(ins) > 3 else list(range(len(starts)))
    steps = _known(ins[4], "steps", node) if len(ins) > 4 else [1] * len(starts)
    for s, e, a, st in zip(starts, ends, axes, steps):
        a %= len(shape)
        if isinstance(shape[a], int):
            shape[a] = len(range(*slice(s, e, st).indices(shape[a])))
    return [Val(tuple(shape), ins[0].dtype)]


@register("GatherV2", "GatherV2")
def _gather(node, ins):
    axis = _known(ins[2], "axis", node)[0] if len(ins) > 2 else 0
    shape = ins[0].shape
    axis %= len(shape)
    return [Val(tuple(shape[:axis]) + tuple(ins[1].shape) + tuple(shape[axis + 1:]), ins[0].dtype)]


def reshape_dims(in_shape, dims):
    dims = list(dims)
    for i, d in enumerate(dims):
        if d == 0 and i < len(in_shape):
            dims[i] = in_shape[i]
    if -1 in dims:
        known = numel([d for d in dims if d != -1])
        total = numel(in_shape)
        if all(isinstance(d, int) for d in in_shape):
            dims[dims.index(-1)] = total // max(known, 1)
        else:
            dims[dims.index(-1)] = "d?"
    return tuple(dims)


@register("Reshape", "Reshape")
def _reshape(node, ins):
    dims = node.param.get("dims")
    if dims is None or len(ins) > 1:
        dims = _known(ins[1], "target shape", node)
    return [Val(reshape_dims(ins[0].shape, [int(d) for d in dims]), ins[0].dtype)]


@register("Flatten", "Flatten")
def _flatten(node, ins):
    shape = ins[0].shape
    axis = node.param.get("axis", 1) % max(len(shape), 1)
    return [Val((numel(shape[:axis]), numel(shape[axis:])), ins[0].dtype)]


@register("Permute", "Permute")
def _permute(node, ins):
    perm = [int(p) for p in node.param["dims"]]
    return [Val(tuple(ins[0].shape[p] for p in perm), ins[0].dtype)]


@register("Squeeze", "SqueezeParam")
def _squeeze(node, ins):
    shape = ins[0].shape
    dims = node.param.get("squeezeDims")
    if (dims is None or len(dims) == 0) and len(ins) > 1:
        dims = _known(ins[1], "axes", node)
    if dims is None or len(dims) == 0:
        axes = {i for i, d in enumerate(shape) if d == 1}
    else:
        axes = {int(d) % len(shape) for d in dims}
    return [Val(tuple(d for i, d in enumerate(shape) if i not in axes), ins[0].dtype)]


@register("Unsqueeze", "SqueezeParam")
def _unsqueeze(node, ins):
    shape = list(ins[0].shape)
    dims = node.param.get("squeezeDims")
    dims = [int(d) for d in (dims if dims is not None and len(dims) else _known(ins[1], "axes", node))]
    rank = len(shape) + len(dims)
    for d in sorted(x % rank for x in dims):
        shape.insert(d, 1)
    return [Val(tuple(shape), ins[0].dtype)]


@register("Shape", None)
def _shape(node, ins):
    shape = ins[0].shape
    value = np.array(shape, dtype=np.int32) if all(isinstance(d, int) for d in shape) else None
    return [Val((len(shape),), "int32", value)]


@register("Rank", None)
def _rank(node, ins):
    return [Val((), "int32", np.array(len(ins[0].shape), dtype=np.int32))]


@register("BroadcastTo", None)
def _broadcast_to(node, ins):
    return [Val(broadcast(ins[0].shape, tuple(_known(ins[1], "target shape", node))), ins[0].dtype)]


@register("Fill", None)
def _fill(node, ins):
    return [Val(tuple(_known(ins[0], "shape", node)), ins[1].dtype)]


@register("Padding", "PadParam", )
def _padding(node, ins):
    pads = _known(ins[1], "pads", node)
    shape = tuple(d + pads[2 * i] + pads[2 * i + 1] if isinstance(d, int) else d
                  for i, d in enumerate(ins[0].shape))
    return [Val(shape, ins[0].dtype)]


@register("SliceTf", "SliceTf")
def _slice_tf(node, ins):
    """TensorFlow slice: inputs data, begin, size (-1 = to the end)."""
    begin, size = _known(ins[1], "begin", node), _known(ins[2], "size", node)
    shape = tuple(s if s >= 0 else (d - b if isinstance(d, int) else d)
                  for d, b, s in zip(ins[0].shape, begin, size)) + tuple(ins[0].shape[len(begin):])
    return [Val(shape, ins[0].dtype)]
