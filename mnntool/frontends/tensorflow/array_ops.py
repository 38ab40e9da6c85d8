"""TensorFlow's data-movement ops (tile, slice, split, gather/scatter, one-hot, top-k, reverse, band
masks, einsum), computed in TensorFlow's own layout and lowered by the ONNX frontend's converters."""
from __future__ import annotations

import numpy as np

from ..shape_tracking import T, emit_onnx, reverse_axes
from .ops import CONST_EVAL, _const, _fail, attr, op


def _x(ctx, v):
    return ctx.tensor(ctx.as_nhwc(v)) if isinstance(v, T) else v


def _tmp(ctx, node, tag):
    return ctx.tmp(f"{node.name}_{tag}")


def _ints(ctx, node, v, what):
    return _const(ctx, node, v, what).astype(np.int64).reshape(-1)


@op("Tile")
def tile(ctx, node, args):
    return emit_onnx(ctx, "Tile", [_x(ctx, args[0]), _ints(ctx, node, args[1], "the multiples")], [ctx.out(node)])


@op("BroadcastTo")
def broadcast_to(ctx, node, args):
    return emit_onnx(ctx, "Expand", [_x(ctx, args[0]), _ints(ctx, node, args[1], "the shape")], [ctx.out(node)])


@op("Fill")
def fill(ctx, node, args):
    return emit_onnx(ctx, "Expand", [_x(ctx, args[1]), _ints(ctx, node, args[0], "the dims")], [ctx.out(node)])


def slice_begin_size(ctx, x, begin, size, outs):
    """TensorFlow's (and TFLite's) Slice: a size of -1 runs to the end."""
    shape = ctx.shape_of(x)
    end = np.asarray([shape[k] if s < 0 else b + s for k, (b, s) in enumerate(zip(begin, size))], np.int64)
    return emit_onnx(ctx, "Slice", [x, begin, end, np.arange(len(begin), dtype=np.int64)], outs)


@op("Slice")
def slice_(ctx, node, args):
    return slice_begin_size(ctx, _x(ctx, args[0]), _ints(ctx, node, args[1], "the begin"),
                            _ints(ctx, node, args[2], "the size"), [ctx.out(node)])


def _outs(ctx, node, n):
    return [ctx.out(node, k) for k in range(n)]


@op("Split", "SplitV")
def split(ctx, node, args):
    if node.op == "Split":
        axis, x, sizes = args[0], _x(ctx, args[1]), None
        n = int(attr(node, "num_split"))
    else:
        x, sizes, axis = _x(ctx, args[0]), _ints(ctx, node, args[1], "the sizes"), args[2]
        n = len(sizes)
    axis = int(_const(ctx, node, axis, "the axis").reshape(-1)[0])
    return split_sizes(ctx, x, axis, sizes, _outs(ctx, node, n))


def split_sizes(ctx, x, axis: int, sizes, outs):
    """TensorFlow's (and TFLite's) Split/SplitV: equal parts without sizes, a -1 size takes the rest."""
    axis %= len(ctx.shape_of(x))
    dim = ctx.shape_of(x)[axis]
    if sizes is None:
        sizes = np.full(len(outs), dim // len(outs), np.int64)
    elif (sizes < 0).any():
        sizes[sizes < 0] = dim - sizes[sizes >= 0].sum()
    if len(outs) == 1:
        return ctx.emit("Identity", [ctx.tensor(x)], outs, {})
    return emit_onnx(ctx, "Split", [x, sizes], outs, {"axis": axis})


@op("Unpack")
def unpack(ctx, node, args):
    x = _x(ctx, args[0])
    axis = int(attr(node, "axis", 0)) % len(ctx.shape_of(x))
    return unstack(ctx, x, axis, _outs(ctx, node, ctx.shape_of(x)[axis]))


def unstack(ctx, x, axis: int, outs):
    """x's slices along `axis`, that axis dropped (Unpack, TFLite's UNPACK)."""
    n = ctx.shape_of(x)[axis]
    parts = emit_onnx(ctx, "Split", [x, np.ones(n, np.int64)], [ctx.tmp(f"{outs[0]}_s{k}") for k in range(n)],
                      {"axis": axis}) if n > 1 else [x]
    return [emit_onnx(ctx, "Squeeze", [p, np.asarray([axis], np.int64)], [o])[0] for p, o in zip(parts, outs)]


@op("GatherV2", "Gather")
def gather(ctx, node, args):
    if attr(node, "batch_dims", 0):
        _fail(ctx, node, "batch_dims is not supported")
    axis = 0 if node.op == "Gather" else int(_const(ctx, node, args[2], "the axis").reshape(-1)[0])
    return emit_onnx(ctx, "Gather", [_x(ctx, args[0]), _x(ctx, args[1])], [ctx.out(node)], {"axis": axis})


@op("GatherNd")
def gather_nd(ctx, node, args):
    return emit_onnx(ctx, "GatherND", [_x(ctx, args[0]), _x(ctx, args[1])], [ctx.out(node)])


@op("ScatterNd")
def scatter_nd(ctx, node, args):
    """Into zeros of the given shape; repeated indices add up, as in TensorFlow."""
    updates = _x(ctx, args[1])
    dtype = ctx.val(updates).dtype if isinstance(updates, T) else np.asarray(updates).dtype
    zeros = np.zeros(_ints(ctx, node, args[2], "the shape"), np.dtype(dtype or "float32"))
    idx = _x(ctx, args[0])
    idx = emit_onnx(ctx, "Cast", [idx], [_tmp(ctx, node, "i64")], {"to": 7})[0] if isinstance(idx, T) else \
        np.asarray(idx, np.int64)
    return emit_onnx(ctx, "ScatterND", [zeros, idx, updates], [ctx.out(node)], {"reduction": "add"})


@op("OneHot")
def one_hot(ctx, node, args):
    idx, depth, on, off = (_x(ctx, a) for a in args[:4])
    values = np.asarray([_const(ctx, node, off, "off_value"), _const(ctx, node, on, "on_value")]).reshape(-1)
    return emit_onnx(ctx, "OneHot", [idx, np.asarray(_ints(ctx, node, depth, "the depth")[:1]), values],
                     [ctx.out(node)], {"axis": int(attr(node, "axis", -1))})


@op("ReverseV2")
def reverse(ctx, node, args):
    x = _x(ctx, args[0])
    rank = len(ctx.shape_of(x))
    axes = sorted({int(a) % rank for a in _ints(ctx, node, args[1], "the axes")})
    if not axes:
        return ctx.emit("Identity", [x], [ctx.out(node)], {})
    return [reverse_axes(ctx, x, axes, ctx.out(node))]


@op("TopKV2")
def top_k(ctx, node, args):
    x = _x(ctx, args[0])
    k = _ints(ctx, node, args[1], "k")[:1]
    vals, idx = emit_onnx(ctx, "TopK", [x, k], [ctx.out(node), _tmp(ctx, node, "i64")],
                          {"axis": -1, "largest": 1, "sorted": 1})
    return [vals, emit_onnx(ctx, "Cast", [idx], [ctx.out(node, 1)], {"to": 6})[0]]


@op("MatrixBandPart")
def band_part(ctx, node, args):
    """The band is fixed by constants on a known shape: a constant mask."""
    x = _x(ctx, args[0])
    lower, upper = (int(_ints(ctx, node, a, "the band")[0]) for a in args[1:3])
    m, n = ctx.shape_of(x)[-2:]
    i, j = np.arange(m)[:, None], np.arange(n)[None, :]
    mask = ((lower < 0) | (i - j <= lower)) & ((upper < 0) | (j - i <= upper))
    return emit_onnx(ctx, "Where", [mask, x, np.zeros((), np.dtype(ctx.val(x).dtype or "float32"))], [ctx.out(node)])


@op("PlaceholderWithDefault")
def placeholder_with_default(ctx, node, args):
    """Frozen at its default: the converted model has no input for it."""
    return [args[0]]


CONST_EVAL["LinSpace"] = lambda node, args: [np.linspace(args[0], args[1], int(args[2])).astype(np.asarray(args[0]).dtype)]
CONST_EVAL["InvertPermutation"] = lambda node, args: [np.argsort(args[0]).astype(np.asarray(args[0]).dtype)]
CONST_EVAL["BroadcastArgs"] = lambda node, args: [np.asarray(np.broadcast_shapes(tuple(args[0]), tuple(args[1])),
                                                             np.asarray(args[0]).dtype)]


# ---- einsum: two operands as one batched MatMul between transposes/reshapes --------------------------------

def _parse_einsum(ctx, node, equation: str, n: int):
    if "..." in equation or "->" not in equation:
        _fail(ctx, node, f"equation '{equation}' (ellipsis or implicit output) is not supported")
    lhs, out = equation.replace(" ", "").split("->")
    terms = lhs.split(",")
    if len(terms) != n or any(len(set(t)) != len(t) for t in terms + [out]):
        _fail(ctx, node, f"equation '{equation}' (a repeated index in one operand) is not supported")
    return terms, out


def _permute(ctx, node, x, src: str, dst: str, tag):
    if src == dst:
        return x
    return emit_onnx(ctx, "Transpose", [x], [_tmp(ctx, node, tag)], {"perm": [src.index(c) for c in dst]})[0]


def _sum_out(ctx, node, x, term: str, keep: str, tag):
    """x with the indices of `term` not in `keep` summed away; returns (x, remaining term)."""
    gone = [k for k, c in enumerate(term) if c not in keep]
    if not gone:
        return x, term
    y = emit_onnx(ctx, "ReduceSum", [x, np.asarray(gone, np.int64)], [_tmp(ctx, node, tag)], {"keepdims": 0})[0]
    return y, "".join(c for c in term if c in keep)


@op("Einsum")
def einsum(ctx, node, args):
    xs = [_x(ctx, a) for a in args]
    xs = [ctx.tensor(x) for x in xs]
    (terms, out) = _parse_einsum(ctx, node, attr(node, "equation"), len(xs))
    if len(xs) == 1:
        y, t = _sum_out(ctx, node, xs[0], terms[0], out, "sum")
        return emit_onnx(ctx, "Transpose", [y], [ctx.out(node)], {"perm": [t.index(c) for c in out]})
    if len(xs) != 2:
        _fail(ctx, node, "more than two operands are not supported")
    a, b = xs
    ta, tb = terms
    # an index only one operand has and the output lacks is summed there first
    a, ta = _sum_out(ctx, node, a, ta, tb + out, "sa")
    b, tb = _sum_out(ctx, node, b, tb, ta + out, "sb")
    batch = [c for c in ta if c in tb and c in out]
    contract = [c for c in ta if c in tb and c not in out]
    free_a = [c for c in ta if c not in tb]
    free_b = [c for c in tb if c not in ta]
    sa, sb = ctx.shape_of(a), ctx.shape_of(b)
    size = {c: sa[k] for k, c in enumerate(ta)} | {c: sb[k] for k, c in enumerate(tb)}

    def prod(cs):
        return int(np.prod([size[c] for c in cs])) if cs else 1
    a = _permute(ctx, node, a, ta, "".join(batch + free_a + contract), "pa")
    b = _permute(ctx, node, b, tb, "".join(batch + contract + free_b), "pb")
    a = ctx.reshape(a, [prod(batch), prod(free_a), prod(contract)], _tmp(ctx, node, "a3"))[0]
    b = ctx.reshape(b, [prod(batch), prod(contract), prod(free_b)], _tmp(ctx, node, "b3"))[0]
    y = emit_onnx(ctx, "MatMul", [a, b], [_tmp(ctx, node, "mm")])[0]
    full = batch + free_a + free_b
    y = ctx.reshape(y, [size[c] for c in full], _tmp(ctx, node, "nd"))[0]
    return emit_onnx(ctx, "Transpose", [y], [ctx.out(node)], {"perm": [full.index(c) for c in out]})
