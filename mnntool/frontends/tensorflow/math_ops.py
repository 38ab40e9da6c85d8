"""TensorFlow's elementwise, logical, reduction and scan ops, lowered by the ONNX frontend's converters
(frontends.shape_tracking.emit_onnx) so each meaning has one lowering. Elementwise ops keep the NCHW mark of
their operands; reductions go through the layout context's reduction_layout."""
from __future__ import annotations

import numpy as np

from ..shape_tracking import T, emit_onnx
from .ops import _align, _axes, _const, attr, op

UNARY = {"Acos": "Acos", "Acosh": "Acosh", "Asin": "Asin", "Asinh": "Asinh", "Atan": "Atan", "Atanh": "Atanh",
         "Cosh": "Cosh", "Sinh": "Sinh", "Tan": "Tan", "Round": "Round", "Rint": "Round", "Sign": "Sign",
         "Selu": "Selu", "Softsign": "Softsign", "IsNan": "IsNaN", "IsInf": "IsInf", "LogicalNot": "Not",
         "Inv": "Reciprocal", "Invert": "BitwiseNot"}


def _tmp(ctx, node, tag):
    return ctx.tmp(f"{node.name}_{tag}")


def _keep(ctx, ys, like) -> list:
    return ctx.mark(ys, ctx.is_nchw(like))


@op(*UNARY)
def unary(ctx, node, args):
    x = ctx.tensor(args[0])
    return _keep(ctx, emit_onnx(ctx, UNARY[node.op], [x], [ctx.out(node)]), x)


@op("IsFinite", "Expm1", "Erfc")
def unary_composite(ctx, node, args):
    x = ctx.tensor(args[0])
    if node.op == "IsFinite":
        bad = emit_onnx(ctx, "Or", [emit_onnx(ctx, "IsNaN", [x], [_tmp(ctx, node, "nan")])[0],
                                    emit_onnx(ctx, "IsInf", [x], [_tmp(ctx, node, "inf")])[0]], [_tmp(ctx, node, "bad")])
        ys = emit_onnx(ctx, "Not", bad, [ctx.out(node)])
    elif node.op == "Expm1":
        ys = emit_onnx(ctx, "Sub", [emit_onnx(ctx, "Exp", [x], [_tmp(ctx, node, "e")])[0], np.float32(1)],
                       [ctx.out(node)])
    else:
        ys = emit_onnx(ctx, "Sub", [np.float32(1), emit_onnx(ctx, "Erf", [x], [_tmp(ctx, node, "e")])[0]],
                       [ctx.out(node)])
    return _keep(ctx, ys, x)


@op("ZerosLike", "OnesLike")
def fill_like(ctx, node, args):
    """Shapes are static here, so the result is a constant."""
    dtype = ctx.val(args[0]).dtype if isinstance(args[0], T) else np.asarray(args[0]).dtype
    return [np.full(ctx.tf_shape(args[0]), 0 if node.op == "ZerosLike" else 1, np.dtype(dtype or "float32"))]


@op("LogSoftmax")
def log_softmax(ctx, node, args):
    x = args[0]
    axis = 1 if ctx.is_nchw(x) else ctx.rank(x) - 1
    return _keep(ctx, emit_onnx(ctx, "LogSoftmax", [x], [ctx.out(node)], {"axis": axis}), x)


BINARY = {"GreaterEqual": "GreaterOrEqual", "LessEqual": "LessOrEqual", "LogicalAnd": "And", "LogicalOr": "Or",
          "BitwiseAnd": "BitwiseAnd", "BitwiseOr": "BitwiseOr", "BitwiseXor": "BitwiseXor"}


@op(*BINARY)
def binary(ctx, node, args):
    ins, nchw = _align(ctx, args[:2])
    return ctx.mark(emit_onnx(ctx, BINARY[node.op], ins, [ctx.out(node)]), nchw)


@op("FloorMod", "Mod", "TruncateMod")
def mod(ctx, node, args):
    ins, nchw = _align(ctx, args[:2])
    return ctx.mark(emit_onnx(ctx, "Mod", ins, [ctx.out(node)], {"fmod": int(node.op != "FloorMod")}), nchw)


def _float(ctx, node, x, tag):
    if ctx.val(x).dtype in ("float32", None):
        return x
    return emit_onnx(ctx, "Cast", [x], [_tmp(ctx, node, tag)], {"to": 1})[0]


@op("TruncateDiv")
def truncate_div(ctx, node, args):
    (a, b), nchw = _align(ctx, args[:2])
    integer = ctx.val(a).dtype not in ("float32", None)
    q = emit_onnx(ctx, "Div", [_float(ctx, node, a, "fa"), _float(ctx, node, b, "fb")], [_tmp(ctx, node, "q")])[0]
    neg = emit_onnx(ctx, "Less", [q, np.float32(0)], [_tmp(ctx, node, "neg")])[0]
    t = emit_onnx(ctx, "Where", [neg, emit_onnx(ctx, "Ceil", [q], [_tmp(ctx, node, "c")])[0],
                                 emit_onnx(ctx, "Floor", [q], [_tmp(ctx, node, "f")])[0]],
                  [ctx.out(node) if not integer else _tmp(ctx, node, "t")])
    if integer:
        t = emit_onnx(ctx, "Cast", t, [ctx.out(node)], {"to": 6})
    return ctx.mark(t, nchw)


@op("NotEqual")
def not_equal(ctx, node, args):
    ins, nchw = _align(ctx, args[:2])
    eq = emit_onnx(ctx, "Equal", ins, [_tmp(ctx, node, "eq")])
    return ctx.mark(emit_onnx(ctx, "Not", eq, [ctx.out(node)]), nchw)


@op("DivNoNan", "MulNoNan", "Xdivy", "Xlogy")
def no_nan(ctx, node, args):
    """x op y, and 0 where the named operand is 0 (y for DivNoNan/MulNoNan, x for Xdivy/Xlogy)."""
    (x, y), nchw = _align(ctx, args[:2])
    if node.op == "Xlogy":
        r = emit_onnx(ctx, "Mul", [x, emit_onnx(ctx, "Log", [y], [_tmp(ctx, node, "log")])[0]], [_tmp(ctx, node, "r")])
    else:
        r = emit_onnx(ctx, "Mul" if node.op == "MulNoNan" else "Div", [x, y], [_tmp(ctx, node, "r")])
    zero = emit_onnx(ctx, "Equal", [y if node.op in ("DivNoNan", "MulNoNan") else x, np.float32(0)],
                     [_tmp(ctx, node, "zero")])[0]
    return ctx.mark(emit_onnx(ctx, "Where", [zero, np.float32(0), r[0]], [ctx.out(node)]), nchw)


@op("ApproximateEqual")
def approximate_equal(ctx, node, args):
    ins, nchw = _align(ctx, args[:2])
    d = emit_onnx(ctx, "Abs", emit_onnx(ctx, "Sub", ins, [_tmp(ctx, node, "d")]), [_tmp(ctx, node, "ad")])
    return ctx.mark(emit_onnx(ctx, "Less", [d[0], np.float32(attr(node, "tolerance", 1e-5))], [ctx.out(node)]), nchw)


@op("Atan2")
def atan2(ctx, node, args):
    """atan(y/x), moved by ±pi where x < 0, and ±pi/2 where x == 0 (TF's atan2(0, 0) is 0)."""
    (y, x), nchw = _align(ctx, args[:2])

    def e(op_type, ins, tag, **kw):
        return emit_onnx(ctx, op_type, ins, [_tmp(ctx, node, tag)], kw)[0]
    base = e("Atan", [e("Div", [y, x], "q")], "atan")
    y_neg = e("Less", [y, np.float32(0)], "yneg")
    shift = e("Where", [y_neg, np.float32(-np.pi), np.float32(np.pi)], "shift")
    x_neg = e("Less", [x, np.float32(0)], "xneg")
    r = e("Where", [x_neg, e("Add", [base, shift], "moved"), base], "r")
    half = e("Mul", [e("Sign", [y], "sy"), np.float32(np.pi / 2)], "half")
    x_zero = e("Equal", [x, np.float32(0)], "xzero")
    return ctx.mark(emit_onnx(ctx, "Where", [x_zero, half, r], [ctx.out(node)]), nchw)


@op("ClipByValue")
def clip_by_value(ctx, node, args):
    ins, nchw = _align(ctx, args[:3])
    lo = emit_onnx(ctx, "Min", [ins[0], ins[2]], [_tmp(ctx, node, "hi")])
    return ctx.mark(emit_onnx(ctx, "Max", [lo[0], ins[1]], [ctx.out(node)]), nchw)


@op("Select", "SelectV2")
def select(ctx, node, args):
    c, t, e = args[:3]
    if node.op == "Select" and ctx.rank(c) == 1 and ctx.rank(t) > 1:     # TF1: a condition per row
        c = ctx.reshape(ctx.tensor(c), [-1] + [1] * (ctx.rank(t) - 1), _tmp(ctx, node, "rows"))[0]
    ins, nchw = _align(ctx, [c, t, e])
    return ctx.mark(emit_onnx(ctx, "Where", ins, [ctx.out(node)]), nchw)


# ---- reductions and scans -------------------------------------------------------------------------------

REDUCE = {"All": "ReduceMin", "Any": "ReduceMax", "EuclideanNorm": "ReduceL2"}


@op(*REDUCE)
def reduce(ctx, node, args):
    keep = bool(attr(node, "keep_dims", False))
    x, axes, nchw = ctx.reduction_layout(args[0], _axes(ctx, node, args[0], _const(ctx, node, args[1], "the axes")),
                                         keep)
    x = ctx.tensor(x)
    logical = node.op in ("All", "Any")
    if logical:
        x = emit_onnx(ctx, "Cast", [x], [_tmp(ctx, node, "i")], {"to": 6})[0]
    y = emit_onnx(ctx, REDUCE[node.op], [x, np.asarray(axes, np.int64)],
                  [_tmp(ctx, node, "r") if logical else ctx.out(node)], {"keepdims": int(keep)})
    if logical:
        y = emit_onnx(ctx, "Cast", y, [ctx.out(node)], {"to": 9})
    return ctx.mark(y, nchw)


@op("ArgMax", "ArgMin")
def arg(ctx, node, args):
    x = ctx.tensor(ctx.as_nhwc(args[0]))
    axis = int(_const(ctx, node, args[1], "the axis").reshape(-1)[0])
    y = emit_onnx(ctx, node.op, [x], [_tmp(ctx, node, "i")], {"axis": axis, "keepdims": 0})
    import tensorflow as tf
    to = 7 if tf.dtypes.as_dtype(attr(node, "output_type", 9)) == tf.int64 else 6
    return emit_onnx(ctx, "Cast", y, [ctx.out(node)], {"to": to})


@op("Cumsum", "Cumprod")
def cumulative(ctx, node, args):
    x = ctx.tensor(ctx.as_nhwc(args[0]))
    axis = _const(ctx, node, args[1], "the axis").astype(np.int32).reshape(())
    return emit_onnx(ctx, "CumSum" if node.op == "Cumsum" else "CumProd", [x, axis], [ctx.out(node)],
                     {"exclusive": int(bool(attr(node, "exclusive", False))),
                      "reverse": int(bool(attr(node, "reverse", False)))})


@op("L2Loss")
def l2_loss(ctx, node, args):
    x = ctx.tensor(ctx.as_nhwc(args[0]))
    ss = emit_onnx(ctx, "ReduceSumSquare", [x], [_tmp(ctx, node, "ss")], {"keepdims": 0})
    return emit_onnx(ctx, "Mul", [ss[0], np.float32(0.5)], [ctx.out(node)])


@op("FakeQuantWithMinMaxArgs", "FakeQuantWithMinMaxVars")
def fake_quant(ctx, node, args):
    """TensorFlow's nudged grid: min/max moved so that zero is on it, then x snapped to the grid (rounding
    half up, as TF does)."""
    x = ctx.tensor(args[0])
    if node.op == "FakeQuantWithMinMaxArgs":
        lo, hi = float(attr(node, "min", -6.0)), float(attr(node, "max", 6.0))
    else:
        lo, hi = (float(_const(ctx, node, a, "min/max").reshape(-1)[0]) for a in args[1:3])
    bits, narrow = int(attr(node, "num_bits", 8)), bool(attr(node, "narrow_range", False))
    qmin, qmax = (1 if narrow else 0), (1 << bits) - 1
    scale = np.float32((hi - lo) / (qmax - qmin))
    zero = np.float32(qmin) - np.float32(lo) / scale
    nudged = np.float32(qmin if zero < qmin else qmax if zero > qmax else np.floor(zero + np.float32(0.5)))
    nlo, nhi = (np.float32(qmin) - nudged) * scale, (np.float32(qmax) - nudged) * scale

    def e(op_type, ins, tag):
        return emit_onnx(ctx, op_type, ins, [_tmp(ctx, node, tag)])[0]
    c = e("Clip", [x, np.float32(nlo), np.float32(nhi)], "clip")
    q = e("Floor", [e("Add", [e("Div", [e("Sub", [c, np.float32(nlo)], "s"), scale], "d"), np.float32(0.5)], "h")],
          "q")
    return _keep(ctx, emit_onnx(ctx, "Add", [e("Mul", [q, scale], "m"), np.float32(nlo)], [ctx.out(node)]), x)

