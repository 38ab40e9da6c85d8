"""TensorFlow ops (of a frozen GraphDef) -> IR ops. Each converter gets (ctx, node, args) where args are IR
tensors (T) or numpy constants, and returns one value per output. Ops whose inputs are all constants are
evaluated here with numpy (shape arithmetic, Keras' batch-norm math on its variables)."""
from __future__ import annotations

import numpy as np

from ...errors import MnnToolError
from ...ir.ops.nn import pool_param
from ...ir.ops.norm import batch_norm_param
from ...registry import registrar
from ..shape_tracking import T, conv_op, conv_param
from .context import NHWC_AXIS_IN_NCHW, TfCtx

OPS = {}
CONST_EVAL = {}


op = registrar(OPS)


def attr(node, key, default=None):
    if key not in node.attr:
        return default
    a = node.attr[key]
    kind = a.WhichOneof("value")
    if kind == "list":
        lst = a.list
        return list(lst.i) or list(lst.f) or [s.decode() for s in lst.s] or []
    if kind == "s":
        return a.s.decode()
    if kind == "tensor":
        import tensorflow as tf
        return tf.make_ndarray(a.tensor)
    if kind == "shape":
        return None if a.shape.unknown_rank else [d.size for d in a.shape.dim]
    return getattr(a, kind) if kind else default


def _fail(ctx, node, what):
    raise MnnToolError(f"{ctx.path}: {node.op} '{node.name}': {what}")


def _const(ctx, node, v, what):
    if isinstance(v, T):
        _fail(ctx, node, f"{what} must be a constant")
    return np.asarray(v)


# ---- layout-sensitive ops: outputs are NCHW in the IR -------------------------------------------------------

def _nhwc_attr(ctx, node, key, default):
    return _hw(node, attr(node, key, default))


def _same_pads(size, k, s, d=1):
    out = -(-size // s)
    total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
    return total // 2, total - total // 2


def same_pads_2d(x_hw, k, stride, dil) -> tuple:
    """TensorFlow's SAME padding of a 2-D window as (top, left, bottom, right): the extra one at the end."""
    (t, b), (l, r) = _same_pads(x_hw[0], k[0], stride[0], dil[0]), _same_pads(x_hw[1], k[1], stride[1], dil[1])
    return (t, l, b, r)


def _pads(ctx, node, x_hw, k, stride, dil):
    padding = attr(node, "padding", "VALID")
    if padding == "VALID":
        return (0, 0, 0, 0)
    if padding == "SAME":
        return same_pads_2d(x_hw, k, stride, dil)
    if padding == "EXPLICIT":
        e = attr(node, "explicit_paddings")
        hw = (4, 6) if attr(node, "data_format", "NHWC") == "NCHW" else (2, 4)
        return (e[hw[0]], e[hw[1]], e[hw[0] + 1], e[hw[1] + 1])
    _fail(ctx, node, f"padding {padding} is not supported")


def _spatial_in(ctx, node, x):
    """x as an NCHW IR tensor (permuting an NHWC one) and whether the op's data_format was NCHW."""
    if attr(node, "data_format", "NHWC") == "NCHW":
        return ctx.tensor(x), True
    return ctx.as_nchw(x), False


@op("Conv2D", "DepthwiseConv2dNative")
def conv2d(ctx: TfCtx, node, args):
    x, native = _spatial_in(ctx, node, args[0])
    w = _const(ctx, node, args[1], "the filter").astype(np.float32)
    n, cin, h, wd = ctx.shape_of(x)
    kh, kw = w.shape[:2]
    stride, dil = _nhwc_attr(ctx, node, "strides", [1] * 4), _nhwc_attr(ctx, node, "dilations", [1] * 4)
    pads = _pads(ctx, node, (h, wd), (kh, kw), stride, dil)
    if node.op == "Conv2D":
        cin_g, cout = w.shape[2], w.shape[3]
        group = cin // cin_g
        weight = w.transpose(3, 2, 0, 1)
    else:
        mult = w.shape[3]
        cout, group = cin * mult, cin
        weight = w.reshape(kh, kw, cout).transpose(2, 0, 1)[:, None]
    common = conv_param(kh, kw, cout, cin, group, stride, dil, pads)
    out = ctx.emit(conv_op("Convolution", group, cin, cout), [x], [ctx.out(node)],
                   {"common": common, "weight": np.ascontiguousarray(weight).reshape(-1),
                    "bias": np.zeros(cout, np.float32)}, node.name)
    return ctx.mark(out, not native)


@op("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")
def fused_batch_norm(ctx, node, args):
    if attr(node, "is_training", False):
        _fail(ctx, node, "is_training=True (export the model for inference)")
    x, native = _spatial_in(ctx, node, args[0])
    scale, offset, mean, var = (_const(ctx, node, a, "scale/offset/mean/variance") for a in args[1:5])
    out = ctx.emit("BatchNorm", [x], [ctx.out(node)],
                   batch_norm_param(mean, var, attr(node, "epsilon", 1e-3), scale, offset), node.name)
    return ctx.mark(out, not native) + [None] * 5


def _hw(node, v):
    """The H, W entries of a 4-vector in the op's data format."""
    return (v[2], v[3]) if attr(node, "data_format", "NHWC") == "NCHW" else (v[1], v[2])


def pool_2d(ctx, node, x, ksize, strides, kind: str):
    x, native = _spatial_in(ctx, node, x)
    k, stride = _hw(node, ksize), _hw(node, strides)
    h, w = ctx.shape_of(x)[2:]
    t, l, b, r = _pads(ctx, node, (h, w), k, stride, (1, 1))
    param = pool_param(kind, k, stride, (t, l, b, r), count="EXCLUDE_PADDING")
    return ctx.mark(ctx.emit("Pooling", [x], [ctx.out(node)], param, node.name), not native)


@op("MaxPool", "AvgPool")
def pool(ctx, node, args):
    return pool_2d(ctx, node, args[0], attr(node, "ksize", [1] * 4), attr(node, "strides", [1] * 4),
                   "MAXPOOL" if node.op == "MaxPool" else "AVEPOOL")


def interp_param(bilinear: bool, align: bool, half: bool, size) -> dict:
    """MNN's Interp for TensorFlow's (and TFLite's) resize flags: bilinear or nearest, corner alignment."""
    if bilinear:
        rtype, ctm = 2, "AlignCorners" if align else ("HalfPixels" if half else "Asymmetric")
    elif align:
        rtype, ctm = 4, "AlignCorners"
    else:
        rtype, ctm = 1, "TensorflowHalfPixels" if half else "Asymmetric"
    return {"resizeType": rtype, "alignCorners": align, "halfPixelCenters": half, "ctm": ctm,
            "outputHeight": int(size[0]), "outputWidth": int(size[1])}


@op("ResizeBilinear", "ResizeNearestNeighbor")
def resize(ctx, node, args):
    x = ctx.as_nchw(args[0])
    size = _const(ctx, node, args[1], "the size").reshape(-1)
    param = interp_param(node.op == "ResizeBilinear", bool(attr(node, "align_corners", False)),
                         bool(attr(node, "half_pixel_centers", False)), size)
    return ctx.mark(ctx.emit("Interp", [x], [ctx.out(node)], param, node.name, fmt="NCHW"), True)


# ---- elementwise: keep the layout mark ------------------------------------------------------------------------

UNARY = {"Rsqrt": "RSQRT", "Sqrt": "SQRT", "Square": "SQUARE", "Exp": "EXP", "Log": "LOG", "Neg": "NEG",
         "Abs": "ABS", "Erf": "ERF", "Floor": "FLOOR", "Ceil": "CEIL", "Reciprocal": "RECIPROCAL", "Sin": "SIN",
         "Cos": "COS", "Softplus": "BNLL", "Log1p": "LOG1P"}
NP_UNARY = {"Rsqrt": lambda a: 1 / np.sqrt(a), "Sqrt": np.sqrt, "Square": np.square, "Exp": np.exp, "Log": np.log,
            "Neg": np.negative, "Abs": np.abs, "Floor": np.floor, "Ceil": np.ceil, "Reciprocal": lambda a: 1 / a}
BINARY = {"Add": "ADD", "AddV2": "ADD", "Sub": "SUB", "Mul": "MUL", "RealDiv": "REALDIV", "Div": "REALDIV",
          "Maximum": "MAXIMUM", "Minimum": "MINIMUM", "SquaredDifference": "SquaredDifference", "Pow": "POW",
          "FloorDiv": "FLOORDIV", "Greater": "GREATER", "Less": "LESS", "Equal": "EQUAL"}
NP_BINARY = {"Add": np.add, "AddV2": np.add, "Sub": np.subtract, "Mul": np.multiply, "RealDiv": np.true_divide,
             "Div": np.true_divide, "Maximum": np.maximum, "Minimum": np.minimum, "Pow": np.power,
             "SquaredDifference": lambda a, b: np.square(a - b), "FloorDiv": np.floor_divide}


def _unary(ctx, node, args):
    x = args[0]
    return ctx.mark(ctx.emit("UnaryOp", [x], [ctx.out(node)], {"opType": UNARY[node.op], "T": "DT_FLOAT"},
                             node.name), ctx.is_nchw(x))


for _n in UNARY:
    OPS[_n] = _unary
    if _n in NP_UNARY:
        CONST_EVAL[_n] = lambda node, args, _f=NP_UNARY[_n]: [_f(args[0])]


def _simple(ir_op, **param):
    def fn(ctx, node, args):
        p = {k: (v(node) if callable(v) else v) for k, v in param.items()}
        return ctx.mark(ctx.emit(ir_op, [args[0]], [ctx.out(node)], p, node.name), ctx.is_nchw(args[0]))
    return fn


OPS["Relu"] = _simple("ReLU", slope=0.0)
OPS["LeakyRelu"] = _simple("ReLU", slope=lambda n: float(attr(n, "alpha", 0.2)))
OPS["Relu6"] = _simple("ReLU6", minValue=0.0, maxValue=6.0)
OPS["Sigmoid"] = _simple("Sigmoid")
OPS["Tanh"] = _simple("TanH")
OPS["Elu"] = _simple("ELU", alpha=1.0)


def _align(ctx, args):
    """Bring binary-op operands to one layout: NCHW when a 4-D operand already is, else TF's own."""
    nchw = any(ctx.is_nchw(a) for a in args) and all(ctx.rank(a) <= 4 for a in args)
    out = []
    for a in args:
        if not nchw:
            out.append(ctx.tensor(ctx.as_nhwc(a)))
        elif ctx.is_nchw(a):
            out.append(a)
        elif not isinstance(a, T):
            out.append(ctx.tensor(ctx.const_for_nchw(a).astype(np.asarray(a).dtype)))
        elif ctx.rank(a) == 4:
            out.append(ctx.as_nchw(a))
        elif all(d == 1 for d in ctx.shape_of(a)):
            out.append(a)
        else:
            return [ctx.tensor(ctx.as_nhwc(b)) for b in args], False
    return out, nchw


@op(*BINARY)
def binary(ctx, node, args):
    ins, nchw = _align(ctx, args[:2])
    return ctx.mark(ctx.emit("BinaryOp", ins, [ctx.out(node)], {"opType": BINARY[node.op], "T": "DT_FLOAT"},
                             node.name), nchw)


for _n, _f in NP_BINARY.items():
    CONST_EVAL[_n] = lambda node, args, _f=_f: [_f(args[0], args[1])]


@op("BiasAdd")
def bias_add(ctx, node, args):
    if attr(node, "data_format", "NHWC") == "NCHW":
        b = ctx.tensor(np.asarray(args[1]).reshape(-1, 1, 1))
        return ctx.emit("BinaryOp", [ctx.tensor(args[0]), b], [ctx.out(node)], {"opType": "ADD", "T": "DT_FLOAT"},
                        node.name)
    ins, nchw = _align(ctx, args[:2])
    return ctx.mark(ctx.emit("BinaryOp", ins, [ctx.out(node)], {"opType": "ADD", "T": "DT_FLOAT"}, node.name), nchw)


CONST_EVAL["BiasAdd"] = lambda node, args: [np.add(args[0], args[1])]


@op("AddN")
def add_n(ctx, node, args):
    ins, nchw = _align(ctx, args)
    x = ins[0]
    for k, y in enumerate(ins[1:], 1):
        out = ctx.out(node) if k == len(ins) - 1 else ctx.tmp(f"{node.name}_{k}")
        x = ctx.emit("BinaryOp", [x, y], [out], {"opType": "ADD", "T": "DT_FLOAT"}, out)[0]
    return ctx.mark([x], nchw)


@op("Softmax")
def softmax(ctx, node, args):
    x = args[0]
    axis = 1 if ctx.is_nchw(x) else ctx.rank(x) - 1
    return ctx.mark(ctx.emit("Softmax", [x], [ctx.out(node)], {"axis": axis}, node.name), ctx.is_nchw(x))


# ---- axis ops: remap axes for NCHW inputs when the result's order allows it ---------------------------------

def _axes(ctx, node, x, axes):
    rank = ctx.rank(x)
    return sorted(int(a) % rank for a in np.asarray(axes).reshape(-1))


REDUCE = {"Mean": "MEAN", "Sum": "SUM", "Max": "MAXIMUM", "Min": "MINIMUM", "Prod": "PROD"}


@op(*REDUCE)
def reduce(ctx, node, args):
    x = args[0]
    axes = _axes(ctx, node, x, _const(ctx, node, args[1], "the axes"))
    keep = bool(attr(node, "keep_dims", False))
    x, axes, nchw = ctx.reduction_layout(x, axes, keep)
    out = ctx.emit("Reduction", [x], [ctx.out(node)], {"operation": REDUCE[node.op], "dim": axes, "keepDims": keep,
                                                       "dType": "DT_FLOAT"}, node.name)
    return ctx.mark(out, nchw)


CONST_EVAL.update({k: (lambda node, args, _f=f: [_f(args[0], axis=tuple(np.asarray(args[1]).reshape(-1).tolist()),
                                                     keepdims=bool(attr(node, "keep_dims", False)))])
                   for k, f in {"Mean": np.mean, "Sum": np.sum, "Max": np.max, "Min": np.min, "Prod": np.prod}.items()})


@op("Squeeze")
def squeeze(ctx, node, args):
    x = args[0]
    shape = ctx.tf_shape(x)
    dims = attr(node, "squeeze_dims", []) or [i for i, d in enumerate(shape) if d == 1]
    axes = sorted(int(d) % len(shape) for d in dims)
    x, axes, _ = ctx.reduction_layout(x, axes, False)     # squeezing drops dims as a reduction does
    return ctx.emit("Squeeze", [x], [ctx.out(node)], {"squeezeDims": axes}, node.name)


CONST_EVAL["Squeeze"] = lambda node, args: [np.squeeze(args[0], axis=tuple(attr(node, "squeeze_dims", [])) or None)]


@op("ConcatV2", "Concat")
def concat(ctx, node, args):
    if node.op == "Concat":
        args = args[1:] + args[:1]
    values, axis = args[:-1], int(_const(ctx, node, args[-1], "the axis"))
    rank = ctx.rank(values[0])
    axis %= rank
    if rank == 4 and any(ctx.is_nchw(v) for v in values):
        ins = [ctx.as_nchw(v) if isinstance(v, T) else ctx.tensor(ctx.const_for_nchw(v)) for v in values]
        return ctx.mark(ctx.emit("Concat", ins, [ctx.out(node)], {"axis": NHWC_AXIS_IN_NCHW[axis]}, node.name), True)
    ins = [ctx.tensor(ctx.as_nhwc(v)) for v in values]
    return ctx.emit("Concat", ins, [ctx.out(node)], {"axis": axis}, node.name)


CONST_EVAL["ConcatV2"] = lambda node, args: [np.concatenate([np.asarray(a) for a in args[:-1]], int(args[-1]))]


@op("Pad", "PadV2", "MirrorPad")
def pad(ctx, node, args):
    x = args[0]
    pads = _const(ctx, node, args[1], "the paddings").astype(np.int64).reshape(-1, 2)
    if node.op == "PadV2" and float(_const(ctx, node, args[2], "the value")) != 0.0:
        _fail(ctx, node, "a non-zero pad value is not supported")
    mode = "CONSTANT" if node.op != "MirrorPad" else {"REFLECT": "REFLECT", "SYMMETRIC": "SYMMETRIC"}[
        attr(node, "mode", "REFLECT")]
    nchw = ctx.is_nchw(x) and len(pads) == 4
    if nchw:
        pads = pads[[0, 3, 1, 2]]
    else:
        x = ctx.as_nhwc(x)
    pads_t = ctx.tensor(pads.reshape(-1).astype(np.int32), node.name + "_pads")
    return ctx.mark(ctx.emit("Padding", [ctx.tensor(x), pads_t], [ctx.out(node)], {"mode": mode}, node.name), nchw)


@op("Transpose")
def transpose(ctx, node, args):
    x, perm = args[0], [int(p) for p in _const(ctx, node, args[1], "the permutation").reshape(-1)]
    if ctx.is_nchw(x):
        perm = [NHWC_AXIS_IN_NCHW[p] for p in perm]
    return ctx.emit("Permute", [x], [ctx.out(node)], {"dims": perm}, node.name)


CONST_EVAL["Transpose"] = lambda node, args: [np.transpose(args[0], np.asarray(args[1]).reshape(-1))]


# ---- shape-defined ops: computed in TF's own layout ----------------------------------------------------------

@op("Reshape")
def reshape(ctx, node, args):
    x = ctx.as_nhwc(args[0])
    shape = [int(d) for d in _const(ctx, node, args[1], "the shape").reshape(-1)]
    return ctx.reshape(x, shape, ctx.out(node))


CONST_EVAL["Reshape"] = lambda node, args: [np.reshape(args[0], np.asarray(args[1]).reshape(-1))]


@op("ExpandDims")
def expand_dims(ctx, node, args):
    x = ctx.as_nhwc(args[0])
    axis = int(_const(ctx, node, args[1], "the axis"))
    shape = list(ctx.shape_of(x))
    shape.insert(axis % (len(shape) + 1), 1)
    return ctx.reshape(x, shape, ctx.out(node))


CONST_EVAL["ExpandDims"] = lambda node, args: [np.expand_dims(args[0], int(args[1]))]


@op("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3")
def matmul(ctx, node, args):
    a, b = (ctx.tensor(ctx.as_nhwc(v)) for v in args[:2])
    ta = bool(attr(node, "transpose_a", False) or attr(node, "adj_x", False))
    tb = bool(attr(node, "transpose_b", False) or attr(node, "adj_y", False))
    return ctx.emit("MatMul", [a, b], [ctx.out(node)], {"T": "DT_FLOAT", "transposeA": ta, "transposeB": tb},
                    node.name)


@op("StridedSlice")
def strided_slice(ctx, node, args):
    x = ctx.as_nhwc(args[0])
    begin, end, strides = (list(_const(ctx, node, a, "begin/end/strides").reshape(-1)) for a in args[1:4])
    if attr(node, "ellipsis_mask", 0) or attr(node, "new_axis_mask", 0):
        _fail(ctx, node, "ellipsis and new-axis masks are not supported")
    bm, em, sm = attr(node, "begin_mask", 0), attr(node, "end_mask", 0), attr(node, "shrink_axis_mask", 0)
    shape = ctx.shape_of(x)
    starts, ends, axes, steps, shrink = [], [], [], [], []
    for i, (b, e, s) in enumerate(zip(begin, end, strides)):
        b, e, s = int(b), int(e), int(s)
        if bm >> i & 1:
            b = 0 if s > 0 else shape[i] - 1
        if sm >> i & 1:
            e, s = (b + 1 if b != -1 else shape[i]), 1
            shrink.append(i)
        elif em >> i & 1:
            e = shape[i] if s > 0 else -shape[i] - 1
        starts.append(b), ends.append(e), axes.append(i), steps.append(s)
    name = ctx.out(node)
    sliced = name if not shrink else ctx.tmp(name + "_slice")
    ins = [x] + [ctx.tensor(np.asarray(v, np.int32)) for v in (starts, ends, axes, steps)]
    out = ctx.emit("StridedSlice", ins, [sliced], {"fromType": 1, "T": "DT_FLOAT"}, node.name)
    if shrink:
        out = ctx.emit("Squeeze", out, [name], {"squeezeDims": shrink}, node.name + "_shrink")
    return out


def _np_strided_slice(node, args):
    x, begin, end, strides = (np.asarray(a) for a in args[:4])
    bm, em, sm = attr(node, "begin_mask", 0), attr(node, "end_mask", 0), attr(node, "shrink_axis_mask", 0)
    index = []
    for i, (b, e, s) in enumerate(zip(begin, end, strides)):
        if sm >> i & 1:
            index.append(int(b))
        else:
            index.append(slice(None if bm >> i & 1 else int(b), None if em >> i & 1 else int(e), int(s)))
    return [x[tuple(index)]]


CONST_EVAL["StridedSlice"] = _np_strided_slice


@op("Cast")
def cast(ctx, node, args):
    from ...ir.dtypes import to_mnn
    import tensorflow as tf
    dst = tf.dtypes.as_dtype(attr(node, "DstT")).as_numpy_dtype
    if np.dtype(dst) == np.float32 and ctx.val(args[0]).dtype == "float32":
        return [args[0]]            # float64 and half are float32 in the IR already
    return ctx.emit("Cast", [args[0]], [ctx.out(node)], {"dstT": to_mnn(str(np.dtype(dst)))}, node.name)


def _np_cast(node, args):
    import tensorflow as tf
    return [np.asarray(args[0]).astype(tf.dtypes.as_dtype(attr(node, "DstT")).as_numpy_dtype)]


CONST_EVAL["Cast"] = _np_cast
CONST_EVAL["Pack"] = lambda node, args: [np.stack([np.asarray(a) for a in args], attr(node, "axis", 0))]
CONST_EVAL["Fill"] = lambda node, args: [np.full(np.asarray(args[0]).reshape(-1), args[1])]
CONST_EVAL["Range"] = lambda node, args: [np.arange(args[0], args[1], args[2])]
CONST_EVAL["Shape"] = lambda node, args: [np.asarray(np.shape(args[0]), np.int32)]
CONST_EVAL["Rank"] = lambda node, args: [np.asarray(np.ndim(args[0]), np.int32)]
CONST_EVAL["Size"] = lambda node, args: [np.asarray(np.size(args[0]), np.int32)]


@op("Shape", "Rank", "Size")
def shape(ctx, node, args):
    """Static here: every shape is known once the input shapes are."""
    s = ctx.tf_shape(args[0])
    v = {"Shape": s, "Rank": len(s), "Size": int(np.prod(s))}[node.op]
    return [np.asarray(v, np.int32)]


@op("Pack")
def pack(ctx, node, args):
    axis = attr(node, "axis", 0)
    rank = ctx.rank(args[0]) + 1
    axis %= rank
    ins = []
    for k, a in enumerate(args):
        a = ctx.tensor(ctx.as_nhwc(a))
        s = list(ctx.shape_of(a))
        s.insert(axis, 1)
        ins.append(ctx.reshape(a, s, ctx.tmp(f"{node.name}_{k}"))[0])
    return ctx.emit("Concat", ins, [ctx.out(node)], {"axis": axis}, node.name)


@op("Identity", "IdentityN", "StopGradient", "Snapshot", "PreventGradient", "EnsureShape", "CheckNumerics")
def identity(ctx, node, args):
    return list(args) if node.op == "IdentityN" else [args[0]]
