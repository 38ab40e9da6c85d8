"""Caffe layers -> IR ops. Each converter gets (ctx, layer, blobs, bottoms, tops) and returns the tensors
for the layer's tops."""
from __future__ import annotations

import numpy as np

from ...errors import MnnToolError
from ...ir.ops.nn import pool_param
from ...ir.ops.norm import batch_norm_param
from ...registry import registrar
from ..shape_tracking import conv_op, conv_param

LAYERS = {}


layer = registrar(LAYERS)


def _fail(ctx, lay, what):
    raise MnnToolError(f"{ctx.path}: {lay.type} layer '{lay.name}': {what}")


def _blob(ctx, lay, blobs, k, what):
    if len(blobs) <= k:
        _fail(ctx, lay, f"the caffemodel has no {what} blob for it")
    return blobs[k]


def _pair(rep, h, w, default):
    """Caffe's kernel/stride/pad/dilation: *_h/*_w fields win, else one or two repeated values."""
    if h or w:
        return int(h), int(w)
    vals = list(rep)
    if not vals:
        return default, default
    return (int(vals[0]), int(vals[1])) if len(vals) > 1 else (int(vals[0]), int(vals[0]))


def _conv_geometry(lay):
    p = lay.convolution_param
    kh, kw = _pair(p.kernel_size, p.kernel_h, p.kernel_w, 0)
    sh, sw = _pair(p.stride, p.stride_h, p.stride_w, 1)
    ph, pw = _pair(p.pad, p.pad_h, p.pad_w, 0)
    dh, dw = _pair(p.dilation, 0, 0, 1)
    return (kh, kw), (sh, sw), (ph, pw, ph, pw), (dh, dw)


@layer("Convolution", "Deconvolution", "DepthwiseConvolution", "ConvolutionDepthwise")
def convolution(ctx, lay, blobs, bottoms, tops):
    p = lay.convolution_param
    if p.axis != 1:
        _fail(ctx, lay, "only axis 1 is supported")
    (kh, kw), stride, pads, dil = _conv_geometry(lay)
    cin = ctx.shape_of(bottoms[0])[1]
    cout, group = int(p.num_output), int(p.group)
    deconv = lay.type == "Deconvolution"
    if lay.type in ("DepthwiseConvolution", "ConvolutionDepthwise"):
        group = cin
    w = _blob(ctx, lay, blobs, 0, "weight")
    shape = (cin, cout // group, kh, kw) if deconv else (cout, cin // group, kh, kw)
    if w.size != int(np.prod(shape)):
        _fail(ctx, lay, f"weight has {w.size} values, expected {shape}")
    bias = _blob(ctx, lay, blobs, 1, "bias").reshape(-1) if p.bias_term else np.zeros(cout, np.float32)
    common = conv_param(kh, kw, cout, cin, group, stride, dil, (pads[0], pads[1], pads[2], pads[3]))
    if deconv:
        common["outPads"] = [0, 0]
    op = conv_op("Deconvolution" if deconv else "Convolution", group, cin, cout)
    return ctx.emit(op, [bottoms[0]], [tops[0]], {"common": common, "weight": w.reshape(-1).astype(np.float32),
                                                  "bias": bias.astype(np.float32)}, lay.name)


def _scale_op(ctx, lay, x, scale, bias, out):
    c = ctx.shape_of(x)[1] if len(ctx.shape_of(x)) > 1 else 0
    if scale.size != c:
        _fail(ctx, lay, f"{scale.size} scale values for {c} channels (only per-channel scales are supported)")
    return ctx.emit("Scale", [x], [out], {"channels": int(c), "scaleData": scale.astype(np.float32),
                                          "biasData": bias.astype(np.float32)}, lay.name)


@layer("BatchNorm")
def batch_norm(ctx, lay, blobs, bottoms, tops):
    mean, var = _blob(ctx, lay, blobs, 0, "mean").reshape(-1), _blob(ctx, lay, blobs, 1, "variance").reshape(-1)
    factor = float(blobs[2].reshape(-1)[0]) if len(blobs) > 2 else 1.0
    factor = 0.0 if factor == 0 else 1.0 / factor
    mean, var = mean.astype(np.float64) * factor, var.astype(np.float64) * factor
    c = ctx.shape_of(bottoms[0])[1] if len(ctx.shape_of(bottoms[0])) > 1 else 0
    if mean.size != c:
        _fail(ctx, lay, f"{mean.size} statistics for {c} channels")
    return ctx.emit("BatchNorm", [bottoms[0]], [tops[0]], batch_norm_param(mean, var, lay.batch_norm_param.eps), lay.name)


@layer("Scale")
def scale(ctx, lay, blobs, bottoms, tops):
    p = lay.scale_param
    if len(bottoms) > 1:
        _fail(ctx, lay, "a scale taken from a second bottom is not supported")
    if p.axis != 1 or p.num_axes != 1:
        _fail(ctx, lay, "only axis 1 with num_axes 1 (per-channel) is supported")
    s = _blob(ctx, lay, blobs, 0, "scale").reshape(-1)
    b = _blob(ctx, lay, blobs, 1, "bias").reshape(-1) if p.bias_term else np.zeros_like(s)
    return _scale_op(ctx, lay, bottoms[0], s, b, tops[0])


@layer("Bias")
def bias(ctx, lay, blobs, bottoms, tops):
    b = _blob(ctx, lay, blobs, 0, "bias").reshape(-1)
    if lay.bias_param.axis != 1 or len(bottoms) > 1:
        _fail(ctx, lay, "only a learned per-channel bias (axis 1) is supported")
    return _scale_op(ctx, lay, bottoms[0], np.ones_like(b), b, tops[0])


@layer("ReLU")
def relu(ctx, lay, blobs, bottoms, tops):
    return ctx.emit("ReLU", [bottoms[0]], [tops[0]], {"slope": float(lay.relu_param.negative_slope)}, lay.name)


@layer("ReLU6")
def relu6(ctx, lay, blobs, bottoms, tops):
    return ctx.emit("ReLU6", [bottoms[0]], [tops[0]], {"minValue": 0.0, "maxValue": 6.0}, lay.name)


@layer("PReLU")
def prelu(ctx, lay, blobs, bottoms, tops):
    slope = _blob(ctx, lay, blobs, 0, "slope").reshape(-1).astype(np.float32)
    return ctx.emit("PReLU", [bottoms[0]], [tops[0]], {"slopeCount": int(slope.size), "slope": slope}, lay.name)


@layer("ELU")
def elu(ctx, lay, blobs, bottoms, tops):
    return ctx.emit("ELU", [bottoms[0]], [tops[0]], {"alpha": float(lay.elu_param.alpha)}, lay.name)


@layer("Sigmoid")
def sigmoid(ctx, lay, blobs, bottoms, tops):
    return ctx.emit("Sigmoid", [bottoms[0]], [tops[0]], {}, lay.name)


@layer("TanH")
def tanh(ctx, lay, blobs, bottoms, tops):
    return ctx.emit("TanH", [bottoms[0]], [tops[0]], {}, lay.name)


@layer("AbsVal")
def absval(ctx, lay, blobs, bottoms, tops):
    return ctx.emit("UnaryOp", [bottoms[0]], [tops[0]], {"opType": "ABS", "T": "DT_FLOAT"}, lay.name)


@layer("Power")
def power(ctx, lay, blobs, bottoms, tops):
    p = lay.power_param
    x = bottoms[0]
    steps = [("MUL", p.scale, p.scale != 1), ("ADD", p.shift, p.shift != 0), ("POW", p.power, p.power != 1)]
    steps = [(op, v) for op, v, needed in steps if needed]
    if not steps:
        return [x]
    for k, (op, v) in enumerate(steps):
        out = tops[0] if k == len(steps) - 1 else ctx.tmp(f"{lay.name}_{op.lower()}")
        x = ctx.emit("BinaryOp", [x, ctx.tensor(np.float32(v))], [out], {"opType": op, "T": "DT_FLOAT"},
                     f"{lay.name}_{op.lower()}")[0]
    return [x]


@layer("Pooling")
def pooling(ctx, lay, blobs, bottoms, tops):
    p = lay.pooling_param
    if p.pool not in (0, 1):
        _fail(ctx, lay, "only MAX and AVE pooling are supported")
    kind = "MAXPOOL" if p.pool == 0 else "AVEPOOL"
    if p.global_pooling:
        return ctx.emit("Pooling", [bottoms[0]], [tops[0]], pool_param(kind, is_global=True), lay.name)
    kh, kw = _pair([p.kernel_size] if p.HasField("kernel_size") else [], p.kernel_h, p.kernel_w, 0)
    sh, sw = _pair([p.stride], p.stride_h, p.stride_w, 1)
    ph, pw = _pair([p.pad], p.pad_h, p.pad_w, 0)
    if not kh or not kw:
        _fail(ctx, lay, "kernel size missing")
    ceil = p.ceil_mode and p.round_mode == 0
    param = caffe_pool_param(kind, ctx.shape_of(bottoms[0])[2:], (kh, kw), (sh, sw), (ph, pw), bool(ceil))
    return ctx.emit("Pooling", [bottoms[0]], [tops[0]], param, lay.name)


def caffe_pool_param(kind, hw, k, s, pads, ceil: bool) -> dict:
    """Caffe's pooling: in ceil mode a last window that would start in the end padding is dropped. MNN's
    ceil mode keeps it, so where the rule drops one the end pad is made explicit (floor mode) instead:
    the same windows and, for averages, the same divisors."""
    outs, dropped = [], False
    for size, kk, ss, p in zip(hw, k, s, pads):
        out = -(-(size + 2 * p - kk) // ss) + 1 if ceil else (size + 2 * p - kk) // ss + 1
        if ceil and (out - 1) * ss >= size + p:
            out, dropped = out - 1, True
        outs.append(out)
    if not dropped:
        return pool_param(kind, k, s, (pads[0], pads[1], pads[0], pads[1]), ceil, "INCLUDE_PADDING")
    # floor mode in every dim, each end pad what makes Caffe's count of windows
    ends = [max((o - 1) * ss + kk - size - p, 0) for o, size, kk, ss, p in zip(outs, hw, k, s, pads)]
    return pool_param(kind, k, s, (pads[0], pads[1], ends[0], ends[1]), False, "INCLUDE_PADDING")


@layer("InnerProduct")
def inner_product(ctx, lay, blobs, bottoms, tops):
    p = lay.inner_product_param
    shape = ctx.shape_of(bottoms[0])
    axis = p.axis % len(shape)
    k = int(np.prod(shape[axis:]))
    n = int(p.num_output)
    w = _blob(ctx, lay, blobs, 0, "weight")
    if w.size != n * k:
        _fail(ctx, lay, f"weight has {w.size} values, expected {n}x{k}")
    w = w.reshape(k, n) if p.transpose else w.reshape(n, k).T
    x = bottoms[0]
    if len(shape) != axis + 1:
        x = ctx.reshape(x, list(shape[:axis]) + [k], ctx.tmp(lay.name + "_flat"))[0]
    mm = tops[0] if not p.bias_term else ctx.tmp(lay.name + "_mm")
    out = ctx.emit("MatMul", [x, ctx.tensor(np.ascontiguousarray(w, np.float32), lay.name + "_weight")], [mm],
                   {"T": "DT_FLOAT", "transposeA": False, "transposeB": False}, lay.name)
    if not p.bias_term:
        return out
    b = _blob(ctx, lay, blobs, 1, "bias").reshape(-1)
    return ctx.emit("BinaryOp", [mm, ctx.tensor(b.astype(np.float32), lay.name + "_bias")], [tops[0]],
                    {"opType": "ADD", "T": "DT_FLOAT"}, lay.name + "_bias")


@layer("Eltwise")
def eltwise(ctx, lay, blobs, bottoms, tops):
    p = lay.eltwise_param
    op = {0: "MUL", 1: "ADD", 2: "MAXIMUM"}[p.operation]
    coeffs = list(p.coeff)
    if coeffs and (op != "ADD" or len(coeffs) != len(bottoms)):
        _fail(ctx, lay, "coeff needs the SUM operation and one value per bottom")
    ins = list(bottoms)
    for k, c in enumerate(coeffs):
        if c != 1:
            ins[k] = ctx.emit("BinaryOp", [ins[k], ctx.tensor(np.float32(c))], [ctx.tmp(f"{lay.name}_coeff{k}")],
                              {"opType": "MUL", "T": "DT_FLOAT"}, f"{lay.name}_coeff{k}")[0]
    x = ins[0]
    for k, y in enumerate(ins[1:], 1):
        out = tops[0] if k == len(ins) - 1 else ctx.tmp(f"{lay.name}_{k}")
        x = ctx.emit("BinaryOp", [x, y], [out], {"opType": op, "T": "DT_FLOAT"}, lay.name if out == tops[0]
                     else out)[0]
    return [x]


@layer("Concat")
def concat(ctx, lay, blobs, bottoms, tops):
    p = lay.concat_param
    axis = p.axis if p.HasField("axis") or not p.HasField("concat_dim") else p.concat_dim
    rank = len(ctx.shape_of(bottoms[0]))
    return ctx.emit("Concat", bottoms, [tops[0]], {"axis": int(axis) % rank}, lay.name)


@layer("Softmax")
def softmax(ctx, lay, blobs, bottoms, tops):
    rank = len(ctx.shape_of(bottoms[0]))
    return ctx.emit("Softmax", [bottoms[0]], [tops[0]], {"axis": int(lay.softmax_param.axis) % rank}, lay.name)


@layer("Dropout", "Split", "Silence")
def passthrough(ctx, lay, blobs, bottoms, tops):
    return [bottoms[0]] * len(tops)


@layer("Flatten")
def flatten(ctx, lay, blobs, bottoms, tops):
    shape = ctx.shape_of(bottoms[0])
    a, e = lay.flatten_param.axis % len(shape), lay.flatten_param.end_axis % len(shape)
    dims = list(shape[:a]) + [int(np.prod(shape[a:e + 1]))] + list(shape[e + 1:])
    return ctx.reshape(bottoms[0], dims, tops[0])


@layer("Reshape")
def reshape(ctx, lay, blobs, bottoms, tops):
    p = lay.reshape_param
    shape = list(ctx.shape_of(bottoms[0]))
    axis = p.axis % (len(shape) + 1) if p.axis < 0 else p.axis
    if p.axis < 0:
        axis = len(shape) + 1 + p.axis
    end = len(shape) if p.num_axes == -1 else axis + p.num_axes
    spec = [int(d) for d in p.shape.dim]
    dims = [shape[axis + k] if d == 0 else d for k, d in enumerate(spec)]
    full = shape[:axis] + dims + shape[end:]
    if full.count(-1) == 1:
        known = int(np.prod([d for d in full if d != -1]))
        full[full.index(-1)] = int(np.prod(shape)) // max(known, 1)
    if int(np.prod(full)) != int(np.prod(shape)):
        _fail(ctx, lay, f"cannot reshape {tuple(shape)} to {tuple(full)}")
    return ctx.reshape(bottoms[0], full, tops[0])


@layer("Permute")
def permute(ctx, lay, blobs, bottoms, tops):
    rank = len(ctx.shape_of(bottoms[0]))
    order = [int(o) for o in lay.permute_param.order]
    order += [d for d in range(rank) if d not in order]
    if sorted(order) != list(range(rank)):
        _fail(ctx, lay, f"order {order} is not a permutation of {rank} axes")
    return ctx.emit("Permute", [bottoms[0]], [tops[0]], {"dims": order}, lay.name)


@layer("Slice")
def slice_(ctx, lay, blobs, bottoms, tops):
    p = lay.slice_param
    shape = ctx.shape_of(bottoms[0])
    axis = (p.axis if p.HasField("axis") or not p.HasField("slice_dim") else p.slice_dim) % len(shape)
    points = [int(s) for s in p.slice_point]
    if not points:
        if shape[axis] % len(tops):
            _fail(ctx, lay, f"axis {axis} of size {shape[axis]} does not split into {len(tops)} equal parts")
        step = shape[axis] // len(tops)
        points = [step * k for k in range(1, len(tops))]
    if len(points) != len(tops) - 1:
        _fail(ctx, lay, f"{len(points)} slice points for {len(tops)} tops")
    return ctx.emit("Slice", [bottoms[0]], list(tops), {"axis": axis, "slicePoints": points,
                                                        "sourceType": "CAFFE"}, lay.name)


@layer("Interp")
def interp(ctx, lay, blobs, bottoms, tops):
    p = lay.interp_param
    n, c, h, w = ctx.shape_of(bottoms[0])
    if p.pad_beg or p.pad_end:
        _fail(ctx, lay, "pad_beg/pad_end are not supported")
    if p.height and p.width:
        oh, ow = p.height, p.width
    elif p.shrink_factor != 1 and p.zoom_factor == 1:
        oh, ow = (h - 1) // p.shrink_factor + 1, (w - 1) // p.shrink_factor + 1
    else:
        oh, ow = h + (h - 1) * (p.zoom_factor - 1), w + (w - 1) * (p.zoom_factor - 1)
    param = {"resizeType": 2, "alignCorners": True, "halfPixelCenters": False, "ctm": "AlignCorners",
             "outputHeight": int(oh), "outputWidth": int(ow)}
    return ctx.emit("Interp", [bottoms[0]], [tops[0]], param, lay.name, fmt="NCHW")


@layer("Upsample")
def upsample(ctx, lay, blobs, bottoms, tops):
    n, c, h, w = ctx.shape_of(bottoms[0])
    s = int(lay.upsample_param.scale)
    param = {"resizeType": 1, "alignCorners": False, "halfPixelCenters": False, "ctm": "Asymmetric",
             "outputHeight": h * s, "outputWidth": w * s}
    return ctx.emit("Interp", [bottoms[0]], [tops[0]], param, lay.name, fmt="NCHW")
