"""TFLite builtin ops -> IR. Each converter gets (ctx, op, args, outs): op is the decoded Operator (its
`opts` the builtin options table), args IR tensors or numpy constants, outs the output tensor names.

TFLite tensors are NHWC like TensorFlow's, so the TensorFlow frontend's layout context does the same
job here: convolutions, pools and resizes make NCHW tensors marked as such, elementwise ops keep the
mark, and everything else sees NHWC again through one Permute. Ops with an ONNX twin are lowered by the
ONNX frontend's converter (frontends.shape_tracking.emit_onnx), so one lowering serves every frontend."""
from __future__ import annotations

import numpy as np

from ...ir.ops.nn import pool_param
from ...registry import registrar
from ..shape_tracking import T, conv_op, conv_param, emit_onnx
from ..tensorflow.context import NHWC_AXIS_IN_NCHW, TfCtx
from ..tensorflow.array_ops import slice_begin_size, split_sizes, unstack
from ..tensorflow.nn_ops import deconv, depth_space, lrn
from ..tensorflow.ops import _align, _axes, _const, _fail, interp_param, same_pads_2d

OPS = {}
op = registrar(OPS)


def activation(ctx, o, x: T, out: str) -> list[T]:
    """The op's fused activation, applied to its raw result `x` (or x renamed to `out` when none)."""
    act = o.opts.get("fused_activation_function", 0)
    nchw = ctx.is_nchw(x)
    if act == 0:
        ys = ctx.emit("Identity", [x], [out], {}) if x != out else [x]
    elif act == 1:
        ys = ctx.emit("ReLU", [x], [out], {"slope": 0.0})
    elif act in (2, 3):
        lo, hi = (-1.0, 1.0) if act == 2 else (0.0, 6.0)
        ys = ctx.emit("ReLU6", [x], [out], {"minValue": lo, "maxValue": hi})
    elif act == 4:
        ys = ctx.emit("TanH", [x], [out], {})
    else:
        _fail(ctx, o, f"fused activation {act} is not supported")
    return ctx.mark(ys, nchw)


def _raw(ctx, o, outs) -> str:
    """Where an op with a fused activation writes before the activation."""
    return outs[0] if o.opts.get("fused_activation_function", 0) == 0 else ctx.tmp(outs[0] + "_raw")


def _pads(o, hw, k, stride, dil):
    return (0, 0, 0, 0) if o.opts.get("padding", 0) == 1 else same_pads_2d(hw, k, stride, dil)     # 1: VALID


def _bias(ctx, o, args, k, cout):
    if len(args) <= k or args[k] is None:
        return np.zeros(cout, np.float32)
    return _const(ctx, o, args[k], "the bias").astype(np.float32).reshape(-1)


# ---- layout-sensitive ops ------------------------------------------------------------------------------

@op("CONV_2D", "DEPTHWISE_CONV_2D")
def conv2d(ctx: TfCtx, o, args, outs):
    x = ctx.as_nchw(args[0])
    w = _const(ctx, o, args[1], "the filter").astype(np.float32)
    n, cin, h, wd = ctx.shape_of(x)
    opts = o.opts
    stride, dil = (opts["stride_h"], opts["stride_w"]), (opts["dilation_h_factor"], opts["dilation_w_factor"])
    if o.code == "CONV_2D":             # OHWI
        cout, kh, kw, cin_g = w.shape
        group = cin // cin_g

        def to_mnn(a):
            return a.transpose(0, 3, 1, 2)
    else:                               # 1, H, W, C*multiplier
        _, kh, kw, cout = w.shape
        group = cin

        def to_mnn(a):
            return a[0].transpose(2, 0, 1)[:, None]
    weight = to_mnn(w)
    pads = _pads(o, (h, wd), (kh, kw), stride, dil)
    common = conv_param(kh, kw, cout, cin, group, stride, dil, pads)
    raw = ctx.emit(conv_op("Convolution", group, cin, cout), [x], [_raw(ctx, o, outs)],
                   {"common": common, "weight": np.ascontiguousarray(weight, np.float32).reshape(-1),
                    "bias": _bias(ctx, o, args, 2, cout)}, o.name)
    ctx.mark(raw, True)
    ctx.int8_plan(o, ctx.g.nodes[-1], to_mnn)
    return activation(ctx, o, raw[0], outs[0])


@op("TRANSPOSE_CONV")
def transpose_conv(ctx: TfCtx, o, args, outs):
    shape = _const(ctx, o, args[0], "the output shape").astype(np.int64).reshape(-1)
    w = _const(ctx, o, args[1], "the filter").astype(np.float32)     # O, H, W, I
    x = ctx.as_nchw(args[2])
    stride = (o.opts["stride_h"], o.opts["stride_w"])
    raw = deconv(ctx, x, w.transpose(3, 0, 1, 2), (int(shape[1]), int(shape[2])), stride, (1, 1),
                 _bias(ctx, o, args, 3, w.shape[0]), _raw(ctx, o, outs), o.name)
    ctx.mark(raw, True)
    return activation(ctx, o, raw[0], outs[0])


@op("AVERAGE_POOL_2D", "MAX_POOL_2D")
def pool(ctx: TfCtx, o, args, outs):
    x = ctx.as_nchw(args[0])
    k, stride = (o.opts["filter_height"], o.opts["filter_width"]), (o.opts["stride_h"], o.opts["stride_w"])
    pads = _pads(o, ctx.shape_of(x)[2:], k, stride, (1, 1))
    param = pool_param("MAXPOOL" if o.code == "MAX_POOL_2D" else "AVEPOOL", k, stride, pads, count="EXCLUDE_PADDING")
    raw = ctx.mark(ctx.emit("Pooling", [x], [_raw(ctx, o, outs)], param, o.name), True)
    return activation(ctx, o, raw[0], outs[0])


@op("RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR")
def resize(ctx: TfCtx, o, args, outs):
    x = ctx.as_nchw(args[0])
    size = _const(ctx, o, args[1], "the size").reshape(-1)
    param = interp_param(o.code == "RESIZE_BILINEAR", bool(o.opts.get("align_corners")),
                         bool(o.opts.get("half_pixel_centers")), size)
    return ctx.mark(ctx.emit("Interp", [x], outs, param, o.name, fmt="NCHW"), True)


@op("DEPTH_TO_SPACE", "SPACE_TO_DEPTH")
def depth_space_op(ctx: TfCtx, o, args, outs):
    return depth_space(ctx, ctx.as_nchw(args[0]), o.code == "DEPTH_TO_SPACE", o.opts["block_size"], outs)


@op("LOCAL_RESPONSE_NORMALIZATION")
def lrn_op(ctx: TfCtx, o, args, outs):
    return lrn(ctx, ctx.as_nchw(args[0]), o.opts["radius"], o.opts["alpha"], o.opts["beta"], o.opts["bias"], outs)


# ---- elementwise: keep the layout mark -----------------------------------------------------------------

BINARY = {"ADD": "Add", "SUB": "Sub", "MUL": "Mul", "DIV": "Div", "MAXIMUM": "Max", "MINIMUM": "Min", "POW": "Pow",
          "LESS": "Less", "GREATER": "Greater", "GREATER_EQUAL": "GreaterOrEqual",
          "EQUAL": "Equal", "LOGICAL_AND": "And", "LOGICAL_OR": "Or", "FLOOR_MOD": "Mod"}
UNARY = {"ABS": "Abs", "NEG": "Neg", "EXP": "Exp", "LOG": "Log", "SQRT": "Sqrt", "SIN": "Sin", "COS": "Cos",
         "FLOOR": "Floor", "CEIL": "Ceil", "ROUND": "Round", "LOGISTIC": "Sigmoid", "TANH": "Tanh", "RELU": "Relu",
         "ELU": "Elu", "HARD_SWISH": "HardSwish"}


@op(*BINARY)
def binary(ctx: TfCtx, o, args, outs):
    ins, nchw = _align(ctx, args[:2])
    if o.code == "FLOOR_MOD":
        attrs = {"fmod": 0}
    else:
        attrs = {}
    raw = ctx.mark(emit_onnx(ctx, BINARY[o.code], ins, [_raw(ctx, o, outs)], attrs), nchw)
    return activation(ctx, o, raw[0], outs[0])


@op("SQUARED_DIFFERENCE", "FLOOR_DIV", "NOT_EQUAL")
def binary_composite(ctx: TfCtx, o, args, outs):
    ins, nchw = _align(ctx, args[:2])
    first = {"SQUARED_DIFFERENCE": "Sub", "FLOOR_DIV": "Div", "NOT_EQUAL": "Equal"}[o.code]
    then = {"SQUARED_DIFFERENCE": None, "FLOOR_DIV": "Floor", "NOT_EQUAL": "Not"}[o.code]
    t = emit_onnx(ctx, first, ins, [ctx.tmp(outs[0] + "_a")])[0]
    if o.code == "SQUARED_DIFFERENCE":
        return ctx.mark(emit_onnx(ctx, "Mul", [t, t], outs), nchw)
    if o.code == "FLOOR_DIV" and ctx.val(t).dtype not in ("float32", None):
        t = emit_onnx(ctx, "Div", [emit_onnx(ctx, "Cast", [ins[0]], [ctx.tmp(outs[0] + "_fa")], {"to": 1})[0],
                                   emit_onnx(ctx, "Cast", [ins[1]], [ctx.tmp(outs[0] + "_fb")], {"to": 1})[0]],
                      [ctx.tmp(outs[0] + "_fd")])[0]
        f = emit_onnx(ctx, "Floor", [t], [ctx.tmp(outs[0] + "_ff")])[0]
        return ctx.mark(emit_onnx(ctx, "Cast", [f], outs, {"to": 6}), nchw)
    return ctx.mark(emit_onnx(ctx, then, [t], outs), nchw)


@op(*UNARY)
def unary(ctx: TfCtx, o, args, outs):
    return ctx.mark(emit_onnx(ctx, UNARY[o.code], [ctx.tensor(args[0])], outs), ctx.is_nchw(args[0]))


@op("RSQRT", "SQUARE", "LEAKY_RELU", "GELU")
def unary_other(ctx: TfCtx, o, args, outs):
    x = ctx.tensor(args[0])
    nchw = ctx.is_nchw(x)
    if o.code == "RSQRT":
        ys = ctx.emit("UnaryOp", [x], outs, {"opType": "RSQRT", "T": "DT_FLOAT"})
    elif o.code == "SQUARE":
        ys = ctx.emit("UnaryOp", [x], outs, {"opType": "SQUARE", "T": "DT_FLOAT"})
    elif o.code == "LEAKY_RELU":
        ys = emit_onnx(ctx, "LeakyRelu", [x], outs, {"alpha": float(o.opts["alpha"])})
    else:
        ys = emit_onnx(ctx, "Gelu", [x], outs, {"approximate": "tanh" if o.opts.get("approximate") else "none"})
    return ctx.mark(ys, nchw)



@op("ADD_N")
def add_n(ctx: TfCtx, o, args, outs):
    ins, nchw = _align(ctx, args)
    return ctx.mark(emit_onnx(ctx, "Sum", ins, outs), nchw)


@op("QUANTIZE", "DEQUANTIZE")
def requantize(ctx: TfCtx, o, args, outs):
    """In the float IR a (de)quantization is the value itself; the int8 grids travel in the int8 plan."""
    x = ctx.tensor(args[0])
    return ctx.mark(ctx.emit("Identity", [x], outs, {}), ctx.is_nchw(x))


# ---- axis-sensitive ops, computed in TFLite's own layout -------------------------------------------------

def _nhwc(ctx, args):
    return [ctx.tensor(ctx.as_nhwc(a)) if isinstance(a, T) else a for a in args]


def _axis_in_nchw(ctx, x, axis) -> int | None:
    """The NCHW axis for a TFLite axis of a marked 4-D tensor."""
    return NHWC_AXIS_IN_NCHW[axis % 4] if ctx.is_nchw(x) else None


@op("CONCATENATION")
def concat(ctx: TfCtx, o, args, outs):
    axis = int(o.opts["axis"])
    if all(isinstance(a, T) and ctx.is_nchw(a) for a in args):
        raw = ctx.mark(emit_onnx(ctx, "Concat", args, [_raw(ctx, o, outs)], {"axis": _axis_in_nchw(ctx, args[0], axis)}),
                       True)
    else:
        raw = emit_onnx(ctx, "Concat", _nhwc(ctx, args), [_raw(ctx, o, outs)], {"axis": axis})
    return activation(ctx, o, raw[0], outs[0])


REDUCE = {"MEAN": "ReduceMean", "SUM": "ReduceSum", "REDUCE_MAX": "ReduceMax", "REDUCE_MIN": "ReduceMin",
          "REDUCE_PROD": "ReduceProd", "REDUCE_ANY": "ReduceMax", "REDUCE_ALL": "ReduceMin"}


@op(*REDUCE)
def reduce(ctx: TfCtx, o, args, outs):
    keep = bool(o.opts.get("keep_dims"))
    x, axes, nchw = ctx.reduction_layout(args[0], _axes(ctx, o, args[0], _const(ctx, o, args[1], "the axes")), keep)
    return ctx.mark(emit_onnx(ctx, REDUCE[o.code], [ctx.tensor(x), np.asarray(axes, np.int64)], outs,
                              {"keepdims": int(keep)}), nchw)


@op("ARG_MAX", "ARG_MIN")
def arg(ctx: TfCtx, o, args, outs):
    x = ctx.tensor(ctx.as_nhwc(args[0]))
    axis = int(_const(ctx, o, args[1], "the axis").reshape(-1)[0])
    y = emit_onnx(ctx, "ArgMax" if o.code == "ARG_MAX" else "ArgMin", [x], [ctx.tmp(outs[0] + "_i")],
                  {"axis": axis, "keepdims": 0})
    to = 7 if o.opts.get("output_type", 4) == 4 else 6
    return emit_onnx(ctx, "Cast", y, outs, {"to": to})


@op("SOFTMAX", "LOG_SOFTMAX")
def softmax(ctx: TfCtx, o, args, outs):
    x = args[0]
    beta = float(o.opts.get("beta", 1.0) or 1.0)
    nchw = ctx.is_nchw(x)
    axis = 1 if nchw else -1
    if beta != 1.0:
        x = emit_onnx(ctx, "Mul", [x, np.float32(beta)], [ctx.tmp(outs[0] + "_beta")])[0]
        ctx.mark([x], nchw)
    return ctx.mark(emit_onnx(ctx, "Softmax" if o.code == "SOFTMAX" else "LogSoftmax", [x], outs, {"axis": axis}),
                    nchw)


@op("L2_NORMALIZATION")
def l2_norm(ctx: TfCtx, o, args, outs):
    x = ctx.tensor(ctx.as_nhwc(args[0]))
    sq = emit_onnx(ctx, "ReduceSumSquare", [x, np.asarray([-1], np.int64)], [ctx.tmp(outs[0] + "_ss")],
                   {"keepdims": 1})[0]
    eps = emit_onnx(ctx, "Max", [sq, np.float32(1e-12)], [ctx.tmp(outs[0] + "_eps")])[0]
    r = ctx.emit("UnaryOp", [eps], [ctx.tmp(outs[0] + "_r")], {"opType": "RSQRT", "T": "DT_FLOAT"})[0]
    raw = emit_onnx(ctx, "Mul", [x, r], [_raw(ctx, o, outs)])
    return activation(ctx, o, raw[0], outs[0])


@op("FULLY_CONNECTED")
def fully_connected(ctx: TfCtx, o, args, outs):
    x = ctx.tensor(ctx.as_nhwc(args[0]))
    w = args[1]
    shape = ctx.shape_of(x)
    if isinstance(w, T):
        wt = emit_onnx(ctx, "Transpose", [w], [ctx.tmp(outs[0] + "_wt")], {"perm": [1, 0]})[0]
        k = ctx.shape_of(w)[1]
    else:
        wt = np.ascontiguousarray(np.asarray(w, np.float32).T)
        k = wt.shape[0]
    keep = bool(o.opts.get("keep_num_dims"))
    flat = x if len(shape) == 2 else ctx.reshape(x, [-1, k], ctx.tmp(outs[0] + "_2d"))[0]
    y = emit_onnx(ctx, "MatMul", [flat, wt], [ctx.tmp(outs[0] + "_mm")])[0]
    if len(args) > 2 and args[2] is not None:
        y = emit_onnx(ctx, "Add", [y, np.asarray(args[2], np.float32)], [ctx.tmp(outs[0] + "_b")])[0]
    if keep and len(shape) != 2:
        y = ctx.reshape(y, list(shape[:-1]) + [ctx.shape_of(y)[-1]], ctx.tmp(outs[0] + "_nd"))[0]
    return activation(ctx, o, y, outs[0])


@op("BATCH_MATMUL")
def batch_matmul(ctx: TfCtx, o, args, outs):
    a, b = _nhwc(ctx, args[:2])
    a, b = ctx.tensor(a), ctx.tensor(b)

    def adj(t, flag):
        if not flag:
            return t
        r = len(ctx.shape_of(t))
        return emit_onnx(ctx, "Transpose", [t], [ctx.tmp(outs[0] + "_adj")],
                         {"perm": list(range(r - 2)) + [r - 1, r - 2]})[0]
    return emit_onnx(ctx, "MatMul", [adj(a, o.opts.get("adj_x")), adj(b, o.opts.get("adj_y"))], outs)


@op("RESHAPE")
def reshape(ctx: TfCtx, o, args, outs):
    x = ctx.tensor(ctx.as_nhwc(args[0]))
    if len(args) > 1 and args[1] is not None:
        shape = args[1]
    else:
        shape = np.asarray(o.opts.get("new_shape", []), np.int64)
    if not isinstance(shape, T):
        shape = np.asarray(shape, np.int64).reshape(-1)
    return emit_onnx(ctx, "Reshape", [x, shape], outs)




@op("TRANSPOSE")
def transpose(ctx: TfCtx, o, args, outs):
    x = ctx.tensor(ctx.as_nhwc(args[0]))
    perm = [int(p) for p in _const(ctx, o, args[1], "the permutation").reshape(-1)]
    return emit_onnx(ctx, "Transpose", [x], outs, {"perm": perm})


@op("PACK")
def pack(ctx: TfCtx, o, args, outs):
    axis = int(o.opts["axis"])
    rank = len(ctx.shape_of(args[0]) if isinstance(args[0], T) else np.shape(args[0]))
    axis = axis + rank + 1 if axis < 0 else axis
    parts = [emit_onnx(ctx, "Unsqueeze", [a, np.asarray([axis], np.int64)], [ctx.tmp(f"{outs[0]}_u{k}")])[0]
             for k, a in enumerate(_nhwc(ctx, args))]
    return emit_onnx(ctx, "Concat", parts, outs, {"axis": axis})


@op("UNPACK")
def unpack(ctx: TfCtx, o, args, outs):
    x = ctx.tensor(ctx.as_nhwc(args[0]))
    return unstack(ctx, x, int(o.opts["axis"]) % len(ctx.shape_of(x)), outs)


@op("SPLIT", "SPLIT_V")
def split(ctx: TfCtx, o, args, outs):
    if o.code == "SPLIT":
        axis, x, sizes = args[0], args[1], None
    else:
        x, sizes, axis = args
        sizes = _const(ctx, o, sizes, "the sizes").astype(np.int64).reshape(-1)
    x = ctx.tensor(ctx.as_nhwc(x))
    return split_sizes(ctx, x, int(_const(ctx, o, axis, "the axis").reshape(-1)[0]), sizes, outs)


@op("SLICE")
def slice_(ctx: TfCtx, o, args, outs):
    x = ctx.tensor(ctx.as_nhwc(args[0]))
    begin = _const(ctx, o, args[1], "the begin").astype(np.int64).reshape(-1)
    size = _const(ctx, o, args[2], "the size").astype(np.int64).reshape(-1)
    return slice_begin_size(ctx, x, begin, size, outs)


@op("STRIDED_SLICE")
def strided_slice(ctx: TfCtx, o, args, outs):
    x = ctx.tensor(ctx.as_nhwc(args[0]))
    begin, end, strides = (_const(ctx, o, a, "begin/end/strides").astype(np.int64).reshape(-1) for a in args[1:4])
    opts = o.opts
    if opts.get("ellipsis_mask") or opts.get("new_axis_mask") or opts.get("offset"):
        _fail(ctx, o, "ellipsis, new-axis and offset masks are not supported")
    starts, ends, shrink = [], [], []
    big = np.iinfo(np.int32).max       # constants are stored as int32
    for k in range(len(begin)):
        s, e, st = int(begin[k]), int(end[k]), int(strides[k])
        if opts.get("begin_mask", 0) >> k & 1:
            s = 0 if st > 0 else big
        if opts.get("end_mask", 0) >> k & 1:
            e = big if st > 0 else -big
        if opts.get("shrink_axis_mask", 0) >> k & 1:
            e = s + 1 if s != -1 else big
            shrink.append(k)
        starts.append(s)
        ends.append(e)
    n = len(begin)
    y = emit_onnx(ctx, "Slice", [x, np.asarray(starts, np.int64), np.asarray(ends, np.int64),
                                 np.arange(n, dtype=np.int64), strides],
                  [outs[0] if not shrink else ctx.tmp(outs[0] + "_sl")])[0]
    if shrink:
        y = emit_onnx(ctx, "Squeeze", [y, np.asarray(shrink, np.int64)], outs)[0]
    return [y]


@op("PAD", "MIRROR_PAD")
def pad(ctx: TfCtx, o, args, outs):
    x = args[0]
    pads = _const(ctx, o, args[1], "the paddings").astype(np.int64)
    mode = "constant" if o.code != "MIRROR_PAD" else ("reflect" if o.opts.get("mode", 0) == 0 else "edge")
    if o.code == "MIRROR_PAD" and o.opts.get("mode", 0) == 1:
        _fail(ctx, o, "SYMMETRIC mirror padding is not supported")
    if ctx.is_nchw(x) and pads.shape[0] == 4:
        p = pads[[0, 3, 1, 2]]
        ys = emit_onnx(ctx, "Pad", [x, np.concatenate([p[:, 0], p[:, 1]])], outs, {"mode": mode})
        return ctx.mark(ys, True)
    x = ctx.tensor(ctx.as_nhwc(x))
    return emit_onnx(ctx, "Pad", [x, np.concatenate([pads[:, 0], pads[:, 1]])], outs, {"mode": mode})


@op("TILE", "BROADCAST_TO")
def tile(ctx: TfCtx, o, args, outs):
    x = ctx.tensor(ctx.as_nhwc(args[0]))
    reps = _const(ctx, o, args[1], "the multiples/shape").astype(np.int64).reshape(-1)
    return emit_onnx(ctx, "Tile" if o.code == "TILE" else "Expand", [x, reps], outs)


@op("GATHER")
def gather(ctx: TfCtx, o, args, outs):
    if o.opts.get("batch_dims"):
        _fail(ctx, o, "batch_dims is not supported")
    x, idx = _nhwc(ctx, args[:2])
    return emit_onnx(ctx, "Gather", [x, idx], outs, {"axis": int(o.opts.get("axis", 0))})


@op("GATHER_ND")
def gather_nd(ctx: TfCtx, o, args, outs):
    x, idx = _nhwc(ctx, args[:2])
    return emit_onnx(ctx, "GatherND", [x, idx], outs)


@op("SELECT", "SELECT_V2")
def select(ctx: TfCtx, o, args, outs):
    return emit_onnx(ctx, "Where", _nhwc(ctx, args[:3]), outs)



CAST_TO = {"float32": 1, "int32": 6, "int64": 7, "bool": 9, "int8": 3, "uint8": 2}


@op("CAST")
def cast(ctx: TfCtx, o, args, outs):
    to = ctx.tflite_dtype(o.outputs[0])
    if to not in CAST_TO:
        _fail(ctx, o, f"cast to {to} is not supported")
    x = ctx.tensor(args[0])
    return ctx.mark(emit_onnx(ctx, "Cast", [x], outs, {"to": CAST_TO[to]}), ctx.is_nchw(x))


@op("CUMSUM")
def cumsum(ctx: TfCtx, o, args, outs):
    x = ctx.tensor(ctx.as_nhwc(args[0]))
    axis = _const(ctx, o, args[1], "the axis").astype(np.int32).reshape(())
    return emit_onnx(ctx, "CumSum", [x, axis], outs, {"exclusive": int(bool(o.opts.get("exclusive"))),
                                                      "reverse": int(bool(o.opts.get("reverse")))})


