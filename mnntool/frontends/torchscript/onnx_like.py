"""aten ops whose meaning is an ONNX op's: converted by the ONNX frontend's own converter on a node built
here (one lowering per meaning), plus the attention, indexing and shape-building ops transformers and
timm models trace to. Shapes are static in this frontend, so sizes and ranges fold to constants."""
from __future__ import annotations

import numpy as np

from ..shape_tracking import T, emit_onnx
from .context import aten, is_bool
from .prim import SCALAR_TYPES


def onnx_op(ctx, node, op_type: str, inputs: list, attrs: dict | None = None, outputs: int = 1) -> list[T]:
    """Emit what the ONNX converter of `op_type` emits for these operands; returns the output tensors."""
    base = ctx.out(node)
    return emit_onnx(ctx, op_type, inputs, [base] + [ctx.g.fresh_name(f"{base}_{k}") for k in range(1, outputs)],
                     attrs)


@aten("aten::hardsigmoid")
def hardsigmoid(ctx, node, args):
    return onnx_op(ctx, node, "HardSigmoid", [args[0]], {"alpha": 1.0 / 6, "beta": 0.5})


@aten("aten::sin", "aten::cos", "aten::reciprocal", "aten::floor", "aten::ceil", "aten::sign", "aten::round")
def unary(ctx, node, args):
    name = node.kind().split("::")[1]
    if not isinstance(args[0], T):     # scripted code's math on numbers (math.ceil -> an int, as in Python)
        import math
        fn = {"sin": math.sin, "cos": math.cos, "reciprocal": lambda v: 1 / v, "floor": math.floor,
              "ceil": math.ceil, "sign": lambda v: (v > 0) - (v < 0), "round": round}[name]
        return [fn(args[0]) if np.ndim(args[0]) == 0 else getattr(np, name if name != "round" else "rint")(args[0])]
    return onnx_op(ctx, node, name.capitalize(), [args[0]])


@aten("aten::rsqrt")
def rsqrt(ctx, node, args):
    return ctx.emit("UnaryOp", [args[0]], [ctx.out(node)], {"opType": "RSQRT", "T": "DT_FLOAT"})


@aten("aten::group_norm")
def group_norm(ctx, node, args):
    x, groups, w, b, eps = args[:5]
    c = ctx.shape_of(x)[1]
    w = np.ones(c, np.float32) if w is None else w
    b = np.zeros(c, np.float32) if b is None else b
    return onnx_op(ctx, node, "GroupNormalization", [x, w, b], {"num_groups": int(groups), "epsilon": float(eps)})


@aten("aten::upsample_bilinear2d", "aten::upsample_nearest2d")
def upsample(ctx, node, args):
    x, size = args[0], args[1]
    bilinear = node.kind() == "aten::upsample_bilinear2d"
    align = bool(args[2]) if bilinear else False
    scales = args[3] if bilinear and len(args) == 4 else (args[2] if not bilinear and len(args) == 3 else None)
    shape = ctx.shape_of(x)
    if size is None:
        scales = list(scales) if isinstance(scales, (list, tuple)) else [scales, scales]
        size = [int(np.floor(d * s)) for d, s in zip(shape[2:], scales)]
    sizes = np.array(list(shape[:2]) + [int(s) for s in size], np.int64)
    mode = "linear" if bilinear else "nearest"
    ctm = "align_corners" if align else ("pytorch_half_pixel" if bilinear else "asymmetric")
    attrs = {"mode": mode, "coordinate_transformation_mode": ctm}
    if not bilinear:
        attrs["nearest_mode"] = "floor"
    return onnx_op(ctx, node, "Resize", [x, None, None, sizes], attrs)


@aten("aten::unsqueeze")
def unsqueeze(ctx, node, args):
    x, dim = args
    if not isinstance(x, T):
        return [np.expand_dims(np.asarray(x), int(dim))]
    rank = len(ctx.shape_of(x)) + 1
    return ctx.emit("Unsqueeze", [x], [ctx.out(node)], {"squeezeDims": [int(dim) % rank]})


@aten("aten::expand")
def expand(ctx, node, args):
    x, size = args[0], [int(s) for s in args[1]]
    src = ctx.shape_of(x) if isinstance(x, T) else np.shape(x)
    lead = len(size) - len(src)
    target = [s if s != -1 else src[k - lead] for k, s in enumerate(size)]
    if not isinstance(x, T):
        return [np.broadcast_to(np.asarray(x), target).copy()]
    return ctx.emit("BroadcastTo", [x, ctx.tensor(np.array(target, np.int32))], [ctx.out(node)], {})


@aten("aten::expand_as")
def expand_as(ctx, node, args):
    return ctx.emit("BroadcastTo", [args[0], ctx.tensor(np.array(ctx.shape_of(args[1]), np.int32))],
                    [ctx.out(node)], {})


@aten("aten::unbind")
def unbind(ctx, node, args):
    x, dim = args[0], int(args[1])
    shape = ctx.shape_of(x)
    dim %= len(shape)
    base = ctx.out(node)
    parts = [T(ctx.tmp(f"{base}_{k}")) for k in range(shape[dim])]
    if len(parts) > 1:
        ctx.emit("Slice", [x], parts, {"axis": dim, "slicePoints": list(range(1, shape[dim])), "sourceType": "CAFFE"})
    else:
        ctx.emit("Identity", [x], parts, {})
    return [[ctx.emit("Squeeze", [p], [ctx.tmp(f"{p}_sq")], {"squeezeDims": [dim]})[0] for p in parts]]


@aten("aten::stack")
def stack(ctx, node, args):
    parts, dim = args[0], int(args[1])
    if not any(isinstance(p, T) for p in parts):
        return [np.stack([np.asarray(p) for p in parts], dim)]
    rank = len(ctx.shape_of(next(p for p in parts if isinstance(p, T)))) + 1
    return ctx.emit("Pack", [ctx.tensor(p) for p in parts], [ctx.out(node)], {"axis": dim % rank})


@aten("aten::gather")
def gather(ctx, node, args):
    x, dim, index = args[0], int(args[1]), args[2]
    if not isinstance(x, T) and not isinstance(index, T):
        return [np.take_along_axis(np.asarray(x), np.asarray(index), dim)]
    return onnx_op(ctx, node, "GatherElements", [x, index], {"axis": dim})


@aten("aten::arange")
def arange(ctx, node, args):
    """arange(end, ...), arange(start, end, ...) or arange(start, end, step, ...): the trailing four are
    dtype, layout, device and pin_memory; with static shapes the bounds are numbers."""
    nums = [a for a in args[:-4]] if len(args) > 4 else [args[0]]
    if any(isinstance(a, T) for a in nums):
        return onnx_op(ctx, node, "Range", [nums[0] if len(nums) > 1 else 0, nums[1] if len(nums) > 1 else nums[0],
                                            nums[2] if len(nums) > 2 else 1])
    dtype = args[-4]
    values = np.arange(*[float(np.asarray(a)) if isinstance(a, float) else int(np.asarray(a)) for a in nums])
    floating = dtype in SCALAR_TYPES and np.dtype(SCALAR_TYPES[dtype]).kind == "f"
    return [values.astype(np.float32 if floating or values.dtype.kind == "f" else np.int64)]


@aten("aten::cumsum")
def cumsum(ctx, node, args):
    return onnx_op(ctx, node, "CumSum", [args[0], np.array(int(args[1]), np.int64)])


@aten("aten::scaled_dot_product_attention")
def sdpa(ctx, node, args):
    """softmax(q k^T * scale + mask) v: the mask a float bias or a boolean keep-mask, or causal."""
    q, k, v = args[:3]
    mask = args[3] if len(args) > 3 else None
    causal = bool(args[5]) if len(args) > 5 else False
    scale = args[6] if len(args) > 6 else None
    if len(args) > 7 and args[7]:
        from ...errors import MnnToolError
        raise MnnToolError(f"{ctx.path}: scaled_dot_product_attention with enable_gqa is not supported")
    qs, ks = ctx.shape_of(q), ctx.shape_of(k)
    scale = float(scale) if scale is not None else 1.0 / float(np.sqrt(qs[-1]))
    base = ctx.out(node)
    rank = len(ks)
    kt = ctx.emit("Permute", [k], [ctx.tmp(base + "_kt")], {"dims": list(range(rank - 2)) + [rank - 1, rank - 2]})[0]
    mm = {"T": "DT_FLOAT", "transposeA": False, "transposeB": False}
    scores = ctx.emit("MatMul", [q, kt], [ctx.tmp(base + "_scores")], mm)[0]
    scores = ctx.emit("BinaryOp", [scores, ctx.tensor(np.array(scale, np.float32))], [ctx.tmp(base + "_scaled")],
                      {"opType": "MUL", "T": "DT_FLOAT"})[0]
    bias = None
    if causal:
        lq, lk = qs[-2], ks[-2]
        bias = np.where(np.tril(np.ones((lq, lk), bool), lk - lq), 0.0, -np.inf).astype(np.float32)
    if mask is not None:
        if not isinstance(mask, T):
            m = np.asarray(mask)
            m = np.where(m, 0.0, -np.inf).astype(np.float32) if m.dtype == np.bool_ else m.astype(np.float32)
            bias = m if bias is None else bias + m
        else:
            if ctx.val(mask).dtype == "int32" and _is_bool(node):     # a keep-mask computed at run time
                neg = ctx.tensor(np.array(-np.inf, np.float32))
                zero = ctx.tensor(np.array(0.0, np.float32))
                mask = ctx.emit("Select", [mask, zero, neg], [ctx.tmp(base + "_bias")], {})[0]
            scores = ctx.emit("BinaryOp", [scores, mask], [ctx.tmp(base + "_masked")],
                              {"opType": "ADD", "T": "DT_FLOAT"})[0]
    if bias is not None:
        scores = ctx.emit("BinaryOp", [scores, ctx.tensor(bias)], [ctx.tmp(base + "_biased")],
                          {"opType": "ADD", "T": "DT_FLOAT"})[0]
    probs = ctx.emit("Softmax", [scores], [ctx.tmp(base + "_probs")], {"axis": -1})[0]
    return ctx.emit("MatMul", [probs, v], [base], mm)


def _is_bool(node) -> bool:
    inputs = list(node.inputs())
    if len(inputs) <= 3:
        return False
    return "Bool" in str(inputs[3].type()) or (hasattr(inputs[3], "node") and is_bool(inputs[3]))
