"""ONNX index, selection and generator ops -> IR (MNN's ArgMax, TopKV2, CumSum, GatherElements, GatherND,
ScatterElements, ScatterNd, Where, OneHot, EyeLike, Tile, Range, Size)."""
from __future__ import annotations

import numpy as np

from ...errors import MnnToolError
from .math import _restore, binary, coerced_2d
from .registry import converts
from .tensor import _axis, ir_dtype


def _rank(ctx, node, name=None):
    rank = ctx.rank(name or node.input[0])
    if rank is None:
        raise MnnToolError(f"{ctx.path}: {node.op_type} '{node.name}': the input's rank is unknown")
    return rank


def _opt(node, k):
    return node.input[k] if len(node.input) > k and node.input[k] else None


def _flip(ctx, node, x, axis, rank, out):
    """x reversed along axis: a StridedSlice with step -1."""
    ins = [x] + [ctx.int_const(f"{out}_{k}", [v]) for k, v in (("s", -1), ("e", -2**31), ("a", axis), ("st", -1))]
    ctx.emit("StridedSlice", ins, [out], {"fromType": 1}, out)


@converts("ArgMax", "ArgMin")
def arg_max(ctx, node, a):
    """MNN's ArgMax takes the first of equal values; select_last_index flips the axis first and maps the
    index back (size - 1 - i)."""
    rank = _rank(ctx, node)
    axis = int(a.get("axis", 0)) % rank
    keep = int(a.get("keepdims", 1))
    last = int(a.get("select_last_index", 0))
    x, out = node.input[0], node.output[0]
    if last:
        shape = ctx.shape(x)
        if shape is None or not isinstance(shape[axis], int):
            raise MnnToolError(f"{ctx.path}: {node.op_type} '{node.name}': select_last_index needs a known axis size")
        flipped = ctx.tmp(out + "_flip")
        _flip(ctx, node, x, axis, rank, flipped)
        x = flipped
    idx = ctx.tmp(out + "_idx") if (keep or last) else out
    ctx.emit(node.op_type, [x], [idx], {"axis": axis, "topK": 1, "outMaxVal": 0}, node.name + "_arg" if idx != out else node.name)
    if last:
        back = ctx.tmp(out + "_back") if keep else out
        binary(ctx, ctx.int_const(node.name + "_last", int(ctx.shape(node.input[0])[axis]) - 1), idx, back, "SUB",
               node.name + "_back" if keep else node.name)
        idx = back
    if keep:
        ctx.emit("Unsqueeze", [idx], [out], {"squeezeDims": [axis]}, node.name)


@converts("Hardmax")
def hardmax(ctx, node, a):
    rank = _rank(ctx, node)
    shape = ctx.shape(node.input[0])
    x, axis, like = coerced_2d(ctx, node, a)
    axis = axis % rank if like is None else 1
    depth = int(np.prod(shape[axis:])) if like is not None and shape and all(isinstance(d, int) for d in shape[
        int(a.get("axis", 1)) % rank:]) else (shape[axis] if shape and like is None else None)
    if like is not None:
        depth = int(np.prod(shape[int(a.get("axis", 1)) % rank:])) if shape and all(
            isinstance(d, int) for d in shape[int(a.get("axis", 1)) % rank:]) else None
    if not isinstance(depth, int):
        raise MnnToolError(f"{ctx.path}: Hardmax '{node.name}': needs a known size of the axis")
    idx = ctx.tmp(node.output[0] + "_idx")
    y = ctx.tmp(node.output[0] + "_hm") if like else node.output[0]
    ctx.emit("ArgMax", [x], [idx], {"axis": axis, "topK": 1}, node.name + "_arg")
    ctx.emit("OneHot", [idx, ctx.int_const(node.name + "_depth", depth), ctx.float_const(node.name + "_on", 1.0),
                        ctx.float_const(node.name + "_off", 0.0)], [y], {"axis": axis, "dType": "DT_FLOAT"}, node.name)
    if like:
        _restore(ctx, node, y, like)


@converts("TopK")
def top_k(ctx, node, a):
    """TopKV2 works on the last axis: other axes are moved there and back."""
    rank = _rank(ctx, node)
    axis = int(a.get("axis", -1)) % rank
    param = {"T": "DT_FLOAT", "sorted": True, "largest": bool(a.get("largest", 1))}
    k = node.input[1]
    kc = ctx.const(k)
    if kc is not None:
        k = ctx.int_const(node.name + "_k", np.asarray(kc).reshape(-1)[:1])
    if axis == rank - 1:
        ctx.emit("TopKV2", [node.input[0], k], list(node.output), param, node.name)
        return
    perm = list(range(rank))
    perm[axis], perm[-1] = perm[-1], perm[axis]
    xt = ctx.tmp(node.output[0] + "_t")
    ctx.emit("Permute", [node.input[0]], [xt], {"dims": perm}, node.name + "_in")
    vt, it = ctx.tmp(node.output[0] + "_vt"), ctx.tmp(node.output[1] + "_it")
    ctx.emit("TopKV2", [xt, k], [vt, it], param, node.name)
    ctx.emit("Permute", [vt], [node.output[0]], {"dims": perm}, node.name + "_v")
    ctx.emit("Permute", [it], [node.output[1]], {"dims": perm}, node.name + "_i")


def _cumprod_unrolled(ctx, node, a, axis: int, n: int):
    """MNN's runtime crashes on CumProd (3.6.1): the running product as n slices, n-1 products and a
    Concat, for axes of known length."""
    x, out, name = node.input[0], node.output[0], node.name
    exclusive, reverse = bool(a.get("exclusive", 0)), bool(a.get("reverse", 0))
    order = list(range(n))[::-1] if reverse else list(range(n))
    pieces = {}
    for i in order:
        p = ctx.tmp(f"{out}_s{i}")
        ins = [x] + [ctx.int_const(f"{name}_{i}_{k}", [v]) for k, v in (("s", i), ("e", i + 1), ("a", axis))]
        ctx.emit("StridedSlice", ins, [p], {"fromType": 1}, p)
        pieces[i] = p
    running, acc = {}, None
    for i in order:
        if exclusive:
            running[i] = acc
        acc = pieces[i] if acc is None else _mul(ctx, acc, pieces[i], f"{out}_p{i}")
        if not exclusive:
            running[i] = acc
    ones = None
    parts = []
    for i in range(n):
        if running[i] is None:
            if ones is None:
                ones = ctx.tmp(out + "_ones")
                zero = ctx.tmp(out + "_zero")
                binary(ctx, pieces[i], pieces[i], zero, "SUB", out + "_zero")
                one = ctx.float_const(name + "_one", 1.0) if ctx.dtype(x).startswith("float") else ctx.int_const(name + "_one", 1)
                binary(ctx, zero, one, ones, "ADD", out + "_ones")
            parts.append(ones)
        else:
            parts.append(running[i])
    ctx.emit("Concat", parts, [out], {"axis": axis}, name)


def _mul(ctx, a_, b_, out):
    binary(ctx, a_, b_, out, "MUL", out)
    return out


@converts("CumSum", "CumProd")
def cumsum(ctx, node, a):
    axis_c = ctx.const(node.input[1])
    shape = ctx.shape(node.input[0])
    if node.op_type == "CumProd":
        if axis_c is None and shape is not None and len(shape) == 1:
            axis_c = np.zeros(1, np.int32)          # a 1-D input has one axis, whatever the tensor says
        axis = int(np.asarray(axis_c).reshape(-1)[0]) % len(shape) if axis_c is not None and shape is not None else None
        if axis is None or not isinstance(shape[axis], int) or not 0 < shape[axis] <= 256:
            raise MnnToolError(f"{ctx.path}: CumProd '{node.name}': needs a constant axis of known length (<= 256): "
                               "MNN's runtime crashes on its CumProd op, so it is unrolled")
        _cumprod_unrolled(ctx, node, a, axis, shape[axis])
        return
    axis = ctx.const(node.input[1])
    ax = ctx.int_const(node.name + "_axis", np.asarray(axis).reshape(-1)[:1]) if axis is not None else node.input[1]
    ctx.emit(node.op_type, [node.input[0], ax], [node.output[0]],
             {"exclusive": bool(a.get("exclusive", 0)), "reverse": bool(a.get("reverse", 0))}, node.name)


@converts("GatherElements")
def gather_elements(ctx, node, a):
    axis = int(a.get("axis", 0)) % _rank(ctx, node)
    ctx.emit("GatherElements", [node.input[0], non_negative(ctx, node, node.input[1], axis),
                                ctx.int_const(node.name + "_axis", [axis])], [node.output[0]], {}, node.name)


def non_negative(ctx, node, indices, axis):
    """Indices with the axis size added where negative: MNN reads negative indices as they are."""
    v = ctx.const(indices)
    dim = (ctx.shape(node.input[0]) or [None] * (axis + 1))[axis]
    if v is not None:
        if (np.asarray(v) < 0).any():
            if not isinstance(dim, int):
                raise MnnToolError(f"{ctx.path}: {node.op_type} '{node.name}': negative indices need a known axis size")
            return ctx.int_const(node.name + "_idx", np.where(v < 0, v + dim, v))
        return indices
    if not isinstance(dim, int):
        return indices
    neg, shift, fixed = (ctx.tmp(f"{node.output[0]}_{t}") for t in ("neg", "shift", "idx"))
    binary(ctx, ctx.int_const(node.name + "_zero", 0), indices, neg, "GREATER", neg)
    binary(ctx, neg, ctx.int_const(node.name + "_dim", dim), shift, "MUL", shift)
    binary(ctx, indices, shift, fixed, "ADD", fixed)
    return fixed


@converts("Gather")
def gather(ctx, node, a):
    axis = _axis(ctx, node, a)
    indices = non_negative(ctx, node, node.input[1], axis)     # MNN's GatherV2 reads negative indices as 0
    ctx.emit("GatherV2", [node.input[0], indices, ctx.int_const(node.name + "_axis", [axis])], [node.output[0]],
             {}, node.name)


@converts("GatherND")
def gather_nd(ctx, node, a):
    """batch_dims b > 0 is written as b = 0 with each index led by its batch coordinates (a constant
    block concatenated in front of the index tuples): MNN 3.6's GatherND with its batch axis set reads
    the wrong rows (measured on int32 and float32 data, batch_dims 1 and 2)."""
    b = int(a.get("batch_dims", 0))
    data, idx, out, name = node.input[0], node.input[1], node.output[0], node.name
    if b == 0:
        ctx.emit("GatherND", [data, idx], [out], {"axis": 0}, name)
        return
    ishape = ctx.shape(idx)
    if ishape is None or not all(isinstance(d, int) for d in ishape):
        raise MnnToolError(f"{ctx.path}: GatherND '{name}': batch_dims={b} needs the indices' shape at convert "
                           "time (MNN's batched GatherND reads the wrong rows; give --input-shape)")
    lead = np.indices(ishape[:b], dtype=np.int32)                     # [b, *batch]
    lead = lead.reshape((b,) + tuple(ishape[:b]) + (1,) * (len(ishape) - 1 - b))
    lead = np.moveaxis(np.broadcast_to(lead, (b,) + tuple(ishape[:-1])), 0, -1)
    i32, full = ctx.tmp(out + "_idx32"), ctx.tmp(out + "_idx_full")
    ctx.emit("Cast", [idx], [i32], {"dstT": "DT_INT32"}, i32)
    ctx.emit("Concat", [ctx.int_const(name + "_batch_coords", np.ascontiguousarray(lead)), i32], [full],
             {"axis": -1}, full)
    ctx.emit("GatherND", [data, full], [out], {"axis": 0}, name)


@converts("ScatterElements", "Scatter")
def scatter_elements(ctx, node, a):
    axis = int(a.get("axis", 0)) % _rank(ctx, node)
    red = a.get("reduction", b"none")
    red = red.decode() if isinstance(red, bytes) else red
    if red not in ("none", "add"):
        raise MnnToolError(f"{ctx.path}: {node.op_type} '{node.name}': reduction '{red}' is not run by MNN's "
                           "ScatterElements (measured); only none and add convert")
    op = {"none": -1, "add": "ADD"}[red]
    ctx.emit("ScatterElements", [node.input[0], non_negative(ctx, node, node.input[1], axis), node.input[2],
                                 ctx.int_const(node.name + "_axis", [axis])], [node.output[0]],
             {"opType": op, "T": "DT_FLOAT"}, node.name)


@converts("ScatterND")
def scatter_nd(ctx, node, a):
    red = a.get("reduction", b"none")
    red = red.decode() if isinstance(red, bytes) else red
    if red in ("max", "min"):
        raise MnnToolError(f"{ctx.path}: ScatterND '{node.name}': reduction '{red}' differs in MNN's ScatterNd "
                           "(measured); none, add and mul convert")
    op = {"none": -1, "add": "ADD", "mul": "MUL"}[red]
    ishape, dshape = ctx.shape(node.input[1]), ctx.shape(node.input[0])
    k = ishape[-1] if ishape and isinstance(ishape[-1], int) else None
    if k is not None and k > 1:
        return _scatter_nd_joined(ctx, node, op, k, dshape)
    shape = ctx.tmp(node.output[0] + "_shape")
    ctx.emit("Shape", [node.input[0]], [shape], {}, node.name + "_shape", fmt="NCHW")
    ctx.emit("ScatterNd", [node.input[1], node.input[2], shape, node.input[0]], [node.output[0]],
             {"opType": op, "T": "DT_FLOAT"}, node.name)


def _scatter_nd_joined(ctx, node, op, k: int, dshape) -> None:
    """ScatterND with k > 1 coordinates per index, on the data viewed with its first k dims joined into
    one and the coordinates joined into one flat index: MNN 3.6's ScatterNd writes only the first run of
    the last dimension of each slice when an index has two or more coordinates (wrong values, measured;
    MNN's own converter's file too). Needs the data's first k dims at convert time."""
    if dshape is None or len(dshape) < k or any(not isinstance(d, int) for d in dshape):
        raise MnnToolError(f"{ctx.path}: ScatterND '{node.name}': {k} coordinates per index need the data's "
                           "shape at convert time (MNN computes multi-coordinate ScatterNd wrongly; give "
                           "--input-shape)")
    dims = [int(d) for d in dshape]
    strides = [int(np.prod(dims[i + 1:k], dtype=np.int64)) for i in range(k)]
    idx = ctx.const(node.input[1])
    if idx is not None:        # constant indices: joined now
        flat_idx = ctx.int_const(node.name + "_flat_idx",
                                 (np.asarray(idx, np.int64) % np.array(dims[:k]) * strides).sum(-1, keepdims=True))
    else:
        scaled, flat_idx = ctx.tmp(node.output[0] + "_scaled"), ctx.tmp(node.output[0] + "_flat_idx")
        binary(ctx, node.input[1], ctx.int_const(node.name + "_strides", strides), scaled, "MUL",
               node.name + "_scaled")
        ctx.emit("Reduction", [scaled], [flat_idx], {"operation": "SUM", "dim": [-1], "keepDims": True},
                 node.name + "_flat_idx")
    joined = [int(np.prod(dims[:k], dtype=np.int64))] + dims[k:]
    view, out = ctx.tmp(node.output[0] + "_joined"), ctx.tmp(node.output[0] + "_scattered")
    ctx.emit("Reshape", [node.input[0], ctx.int_const(node.name + "_joined_shape", joined)], [view],
             {"dimType": "NCHW"}, node.name + "_join")
    ctx.emit("ScatterNd", [flat_idx, node.input[2], ctx.int_const(node.name + "_shape", joined), view], [out],
             {"opType": op, "T": "DT_FLOAT"}, node.name)
    ctx.emit("Reshape", [out, ctx.int_const(node.name + "_out_shape", dims)], [node.output[0]],
             {"dimType": "NCHW"}, node.name + "_unjoin")


@converts("NonZero")
def non_zero(ctx, node, a):
    zero = ctx.float_const(node.name + "_zero", 0.0) if ctx.dtype(node.input[0]).startswith("float") \
        else ctx.int_const(node.name + "_zero", 0)
    nz, coords = ctx.tmp(node.output[0] + "_nz"), ctx.tmp(node.output[0] + "_coords")
    binary(ctx, node.input[0], zero, nz, "NOTEQUAL", node.name + "_nz")
    ctx.emit("Where", [nz], [coords], {"vector": False}, node.name + "_where")
    ctx.emit("Transpose", [coords, ctx.int_const(node.name + "_perm", [1, 0])], [node.output[0]], {}, node.name)


@converts("Compress")
def compress(ctx, node, a):
    coords, flat = ctx.tmp(node.output[0] + "_coords"), ctx.tmp(node.output[0] + "_idx")
    ctx.emit("Where", [node.input[1]], [coords], {"vector": False}, node.name + "_where")
    ctx.emit("Reshape", [coords, ctx.int_const(node.name + "_m1", [-1])], [flat], {"dimType": "NCHW"}, node.name + "_flat")
    x = node.input[0]
    if "axis" not in a:
        xf = ctx.tmp(node.output[0] + "_x")
        ctx.emit("Reshape", [x, ctx.int_const(node.name + "_xm1", [-1])], [xf], {"dimType": "NCHW"}, node.name + "_x")
        x, axis = xf, 0
    else:
        axis = int(a["axis"]) % _rank(ctx, node)
    ctx.emit("GatherV2", [x, flat, ctx.int_const(node.name + "_axis", [axis])], [node.output[0]], {}, node.name)


@converts("Unique")
def unique(ctx, node, a):
    """MNN's Unique orders the values by their bits read as int32 (ir/ops/index.py): ONNX's order - first
    appearance (sorted=0) or ascending values (sorted=1 on floats) - is a permutation of it, found with
    TopKV2 over the first indices or the values; each element's index goes through the inverse
    permutation. Integers sorted come out of MNN's op in order already."""
    if "axis" in a:
        raise MnnToolError(f"{ctx.path}: Unique '{node.name}': axis is not supported (MNN's Unique flattens)")
    name = node.name
    want = list(node.output) + [""] * (4 - len(node.output))
    raw = [ctx.tmp(f"{name}_mnn_{t}") for t in ("values", "first", "inverse", "counts")]
    ctx.emit("Unique", [node.input[0]], raw, {}, name + "_mnn")
    by_value = bool(int(a.get("sorted", 1)))
    if by_value and not ctx.dtype(node.input[0]).startswith("float"):
        for r, o in zip(raw, want):
            if o:
                ctx.emit("Identity", [r], [o], {}, o)
        return
    n, key, perm, dummy = (ctx.tmp(f"{name}_{t}") for t in ("n", "key", "perm", "sortedkey"))
    ctx.emit("Shape", [raw[1]], [n], {}, n, fmt="NCHW")
    if by_value:
        ctx.emit("Cast", [raw[0]], [key], {"dstT": "DT_FLOAT"}, key)
    else:
        ctx.emit("Cast", [raw[1]], [key], {"dstT": "DT_FLOAT"}, key)
    param = {"T": "DT_FLOAT", "sorted": True, "largest": False}
    ctx.emit("TopKV2", [key, n], [dummy, perm], param, perm)
    axis0 = ctx.int_const(name + "_axis0", [0])
    for k in (0, 1, 3):
        if want[k]:
            ctx.emit("GatherV2", [raw[k], perm, axis0], [want[k]], {}, want[k])
    if want[2]:
        pf, dummy2, rank = (ctx.tmp(f"{name}_{t}") for t in ("permf", "sortedperm", "rank"))
        ctx.emit("Cast", [perm], [pf], {"dstT": "DT_FLOAT"}, pf)
        ctx.emit("TopKV2", [pf, n], [dummy2, rank], param, rank)
        ctx.emit("GatherV2", [rank, raw[2], axis0], [want[2]], {}, want[2])


@converts("OneHot")
def one_hot(ctx, node, a):
    """EQUAL(indices on a new axis, Range(0, depth)) selecting on/off: MNN's own OneHot op kills the
    process (measured, MNN 3.6.1, also in files its converter writes). Negative indices count back."""
    idx, depth_in, values = node.input[:3]
    out, name = node.output[0], node.name
    rank = ctx.rank(idx)
    if rank is None:
        raise MnnToolError(f"{ctx.path}: OneHot '{name}': the indices' rank is unknown")
    axis = int(a.get("axis", -1)) % (rank + 1)
    dv = ctx.const(depth_in)
    depth = ctx.int_const(name + "_depth", int(np.asarray(dv).reshape(-1)[0])) if dv is not None else None
    if depth is None:
        flat = ctx.tmp(out + "_depthf")
        ctx.emit("Reshape", [depth_in, ctx.int_const(name + "_scalar", [])], [flat], {"dimType": "NCHW"}, flat)
        depth = ctx.tmp(out + "_depth")
        ctx.emit("Cast", [flat], [depth], {"dstT": "DT_INT32"}, depth)
    ii = ctx.tmp(out + "_i32")
    ctx.emit("Cast", [idx], [ii], {"dstT": "DT_INT32"}, ii)
    neg, shift, wrapped = (ctx.tmp(f"{out}_{t}") for t in ("neg", "shift", "wrapped"))
    binary(ctx, ctx.int_const(name + "_zero", 0), ii, neg, "GREATER", neg)
    binary(ctx, neg, depth, shift, "MUL", shift)
    binary(ctx, ii, shift, wrapped, "ADD", wrapped)
    classes, shaped, placed, hot = (ctx.tmp(f"{out}_{t}") for t in ("classes", "shaped", "placed", "hot"))
    ctx.emit("Range", [ctx.g.add_const(name + "_r0", np.array(0, np.int32)), depth,
                       ctx.g.add_const(name + "_r1", np.array(1, np.int32))], [classes], {}, classes)
    ctx.emit("Reshape", [classes, ctx.int_const(name + "_cshape", [-1] + [1] * (rank - axis))], [shaped],
             {"dimType": "NCHW"}, shaped)
    ctx.emit("Unsqueeze", [wrapped], [placed], {"squeezeDims": [axis]}, placed)
    binary(ctx, placed, shaped, hot, "EQUAL", hot)
    vv = ctx.const(values)
    if vv is not None:
        off, on = (ctx.float_const(f"{name}_{k}", float(np.asarray(vv).reshape(-1)[i])) for k, i in (("off", 0), ("on", 1)))
    else:
        off, on = ctx.tmp(out + "_off"), ctx.tmp(out + "_on")
        ctx.emit("Slice", [values], [off, on], {"axis": 0, "slicePoints": [1], "sourceType": "CAFFE"}, name + "_values")
    ctx.emit("Select", [hot, on, off], [out], {}, name)


@converts("EyeLike")
def eye_like(ctx, node, a):
    x = node.input[0]
    if "dtype" in a:
        dst = ir_dtype(int(a["dtype"]))
        if dst != ctx.g.info(x).dtype and dst is not None:
            cast = ctx.tmp(node.output[0] + "_like")
            ctx.emit("Cast", [x], [cast], {"dstT": "DT_FLOAT" if dst == "float32" else "DT_INT32"}, node.name + "_like")
            x = cast
    ctx.emit("EyeLike", [x, ctx.int_const(node.name + "_k", [int(a.get("k", 0))])], [node.output[0]], {}, node.name)


@converts("Tile")
def tile(ctx, node, a):
    reps = ctx.const(node.input[1])
    r = ctx.int_const(node.name + "_reps", reps.reshape(-1)) if reps is not None else node.input[1]
    ctx.emit("Tile", [node.input[0], r], [node.output[0]], {}, node.name)


@converts("Range")
def range_(ctx, node, a):
    ins = []
    for k, name in enumerate(node.input[:3]):
        v = ctx.const(name)
        ins.append(ctx.g.add_const(f"{node.name}_{k}", np.asarray(v).reshape(())) if v is not None else name)
    ctx.emit("Range", ins, [node.output[0]], {}, node.name)


@converts("Size")
def size(ctx, node, a):
    ctx.emit("Size", [node.input[0]], [node.output[0]], {}, node.name)


@converts("Trilu")
def trilu(ctx, node, a):
    """x where the (row, column) mask of the k-th diagonal holds, 0 elsewhere; the mask is a constant
    when the last two dims are known, else built from Range and a comparison at run time."""
    upper = int(a.get("upper", 1))
    shape = ctx.shape(node.input[0])
    kc = ctx.const(node.input[1]) if _opt(node, 1) else np.zeros(1, np.int32)
    x, out = node.input[0], node.output[0]
    zero = ctx.int_const(node.name + "_zero", 0) if ctx.dtype(x).startswith(("int", "uint", "bool")) \
        else ctx.float_const(node.name + "_zero", 0.0)
    if shape is not None and all(isinstance(d, int) for d in shape[-2:]) and kc is not None:
        n, m = shape[-2:]
        k = int(np.asarray(kc).reshape(-1)[0])
        rows, cols = np.arange(n)[:, None], np.arange(m)[None, :]
        mask = (cols - rows >= k) if upper else (cols - rows <= k)
        ctx.emit("Select", [ctx.int_const(node.name + "_mask", mask.astype(np.int32)), x, zero], [out], {}, node.name)
        return
    # run-time k or dims: the mask from Range over the last two dims' sizes and a comparison
    k_name = _opt(node, 1)
    if k_name is None:
        k_name = ctx.int_const(node.name + "_k", 0)
    elif kc is not None:
        k_name = ctx.int_const(node.name + "_k", int(np.asarray(kc).reshape(-1)[0]))
    else:
        flat_k = ctx.tmp(out + "_k")
        ctx.emit("Reshape", [k_name, ctx.int_const(node.name + "_kshape", [])], [flat_k], {"dimType": "NCHW"}, flat_k)
        k_name = flat_k
    shp = ctx.tmp(out + "_shape")
    ctx.emit("Shape", [x], [shp], {}, shp, fmt="NCHW")
    zero_i, one_i = ctx.int_const(node.name + "_z", 0), ctx.int_const(node.name + "_o", 1)
    dims = []
    rank = ctx.rank(x)
    if rank is None:
        raise MnnToolError(f"{ctx.path}: Trilu '{node.name}': needs an input of known rank")
    for tag, idx in (("n", rank - 2), ("m", rank - 1)):     # MNN's GatherV2 reads a negative index as 0
        d = ctx.tmp(f"{out}_{tag}")
        ctx.emit("GatherV2", [shp, ctx.int_const(f"{node.name}_{tag}i", idx), ctx.int_const(f"{node.name}_{tag}a", [0])],
                 [d], {}, d)
        dims.append(d)
    rows, cols, rows2, cols2, diff, mask = (ctx.tmp(f"{out}_{t}") for t in ("r", "c", "r2", "c2", "diff", "mask"))
    ctx.emit("Range", [zero_i, dims[0], one_i], [rows], {}, rows)
    ctx.emit("Range", [zero_i, dims[1], one_i], [cols], {}, cols)
    ctx.emit("Unsqueeze", [rows], [rows2], {"squeezeDims": [1]}, rows2)
    ctx.emit("Unsqueeze", [cols], [cols2], {"squeezeDims": [0]}, cols2)
    binary(ctx, cols2, rows2, diff, "SUB", diff)
    binary(ctx, diff, k_name, mask, "GREATER_EQUAL" if upper else "LESS_EQUAL", mask)
    ctx.emit("Select", [mask, x, zero], [out], {}, node.name)


@converts("GridSample")
def grid_sample(ctx, node, a):
    mode = a.get("mode", b"bilinear")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    pad = a.get("padding_mode", b"zeros")
    pad = pad.decode() if isinstance(pad, bytes) else pad
    if mode not in ("bilinear", "linear", "nearest") or ctx.rank(node.input[0]) not in (4, None):
        raise MnnToolError(f"{ctx.path}: GridSample '{node.name}': only 2-D bilinear and nearest sampling "
                           f"(not {mode}) have an MNN op")
    if pad == "reflection":
        raise MnnToolError(f"{ctx.path}: GridSample '{node.name}': MNN's reflection padding does not match "
                           "ONNX's (measured); only zeros and border convert")
    ctx.emit("GridSample", [node.input[0], node.input[1]], [node.output[0]],
             {"mode": "NEAREST" if mode == "nearest" else "BILINEAR",
              "paddingMode": {"zeros": "ZEROS", "border": "CLAMP", "reflection": "REFLECTION"}[pad],
              "alignCorners": bool(a.get("align_corners", 0))}, node.name)


# [x_centre, y_centre, w, h] @ this = [y1, x1, y2, x2]
_CENTRE_TO_CORNERS = np.array([[0, 1, 0, 1], [1, 0, 1, 0], [0, -0.5, 0, 0.5], [-0.5, 0, 0.5, 0]], np.float32)


@converts("NonMaxSuppression")
def non_max_suppression(ctx, node, a):
    """One MNN NonMaxSuppressionV2 per (batch, class), each one's kept indices given their batch and class
    columns, all stacked: [selected, 3] as ONNX has it. Batches and classes must be known."""
    boxes_shape, scores_shape = ctx.shape(node.input[0]), ctx.shape(node.input[1])
    if scores_shape is None or not all(isinstance(d, int) for d in scores_shape[:2]):
        raise MnnToolError(f"{ctx.path}: NonMaxSuppression '{node.name}': needs known batch and class counts")
    batches, classes = scores_shape[:2]
    name, out = node.name, node.output[0]
    boxes = node.input[0]
    if int(a.get("center_point_box", 0)):
        corners = ctx.tmp(out + "_corners")
        ctx.emit("MatMul", [boxes, ctx.float_const(name + "_c2c", _CENTRE_TO_CORNERS)], [corners],
                 {"T": "DT_FLOAT", "transposeA": False, "transposeB": False}, corners)
        boxes = corners
    opt = [node.input[k] if len(node.input) > k and node.input[k] else None for k in (2, 3, 4)]
    limit = opt[0] or ctx.int_const(name + "_none", [0])
    iou = opt[1] or (ctx.float_const(name + "_iou", [0.0]) if opt[2] else None)
    extra = [limit] + ([iou] if iou else []) + ([opt[2]] if opt[2] else [])
    parts = []
    for b in range(batches):
        bx, bs = ctx.tmp(f"{out}_b{b}"), ctx.tmp(f"{out}_s{b}")
        bi = ctx.g.add_const(f"{name}_b{b}", np.array(b, np.int32))
        ctx.emit("GatherV2", [boxes, bi, ctx.int_const(f"{name}_ax_b{b}", [0])], [bx], {}, bx)
        ctx.emit("GatherV2", [node.input[1], bi, ctx.int_const(f"{name}_ax_s{b}", [0])], [bs], {}, bs)
        for c in range(classes):
            tag = f"{b}_{c}"
            sc, sel, col, zeros = (ctx.tmp(f"{out}_{t}{tag}") for t in ("sc", "sel", "col", "z"))
            ctx.emit("GatherV2", [bs, ctx.g.add_const(f"{name}_c{tag}", np.array(c, np.int32)),
                                  ctx.int_const(f"{name}_ax_c{tag}", [0])], [sc], {}, sc)
            ctx.emit("NonMaxSuppressionV2", [bx, sc] + extra, [sel], {}, f"{name}/{tag}")
            ctx.emit("Unsqueeze", [sel], [col], {"squeezeDims": [1]}, col)
            binary(ctx, col, ctx.int_const(f"{name}_zero{tag}", 0), zeros, "MUL", zeros)
            cols = []
            for k, v in (("b", b), ("c", c)):
                filled = ctx.tmp(f"{out}_{k}{tag}")
                binary(ctx, zeros, ctx.int_const(f"{name}_{k}v{tag}", v), filled, "ADD", filled)
                cols.append(filled)
            row = ctx.tmp(f"{out}_rows{tag}")
            ctx.emit("Concat", cols + [col], [row], {"axis": 1}, row)
            parts.append(row)
    if len(parts) == 1:
        ctx.emit("Identity", parts, [out], {}, name)
    else:
        ctx.emit("Concat", parts, [out], {"axis": 0}, name)
