"""ONNX convolution, normalization, pooling and matmul ops -> IR."""
from __future__ import annotations

import numpy as np

from ...errors import MnnToolError
from ...ir.ops.nn import pool_param
from ...ir.ops.norm import batch_norm_param
from .cubic import cubic_resize, interp_on_padded, needs_decomposition, whole_factors
from .math import binary, unary
from .registry import converts
from .volumetric import conv3d, dilated_max_pool, pool3d
from .windows import _s, conv_common, lift_1d, spatial


def _window_op(ctx, node, a, kind: str):
    """Conv or ConvTranspose with constant weights in the table or run-time weights as inputs."""
    w_name = node.input[1]
    w = ctx.const(w_name)
    w_shape = tuple(w.shape) if w is not None else ctx.shape(w_name)
    if w_shape is None or not all(isinstance(d, int) for d in w_shape):
        raise MnnToolError(f"{ctx.path}: {node.op_type} '{node.name}': the weight's shape is unknown")
    rank = len(w_shape) - 2
    if rank == 3 and kind == "Convolution":
        conv3d(ctx, node, a)
        return
    group = int(a.get("group", 1))
    kernel = list(a.get("kernel_shape", w_shape[2:]))
    x, out = node.input[0], node.output[0]
    if kind == "Convolution":
        cout, cin = w_shape[0], w_shape[1] * group
    else:
        cin, cout = w_shape[0], w_shape[1] * group
    if kind == "Deconvolution":
        kernel_, strides, dil, pads, mode = spatial(ctx, node, {k: v for k, v in a.items() if k != "auto_pad"}, kernel)
        pads = _deconv_pads(ctx, node, a, kernel_, strides, dil, pads, rank)
    else:
        kernel_, strides, dil, pads, mode = spatial(ctx, node, a, kernel)
    common = conv_common(kernel_, strides, dil, pads, mode, cout, cin, group)
    if kind == "Deconvolution":
        op_pad = [int(v) for v in a.get("output_padding", [0] * rank)]
        common["outPads"] = op_pad + [0] if rank == 1 else op_pad
        extra = getattr(ctx, "_deconv_extra", None)
        if extra:
            common["outPads"] = [p + e for p, e in zip(common["outPads"], extra)]
    depthwise = group > 1 and group == cin == cout
    op = kind + ("Depthwise" if depthwise else "")
    b_name = node.input[2] if len(node.input) > 2 and node.input[2] else None
    b = ctx.const(b_name) if b_name else None
    x_in = lift_1d(ctx, node, x, "x") if rank == 1 else x
    y = ctx.tmp(out + "_4d") if rank == 1 else out
    if w is not None and (b_name is None or b is not None):
        wv = np.asarray(w, np.float32)
        if rank == 1:
            wv = wv[..., None]
        bias = np.asarray(b, np.float32).reshape(-1) if b is not None else np.zeros(cout, np.float32)
        ctx.emit(op, [x_in], [y], {"common": common, "weight": wv.reshape(-1), "bias": bias}, node.name)
    else:
        w_in = lift_1d(ctx, node, w_name, "w") if rank == 1 else w_name
        ins = [x_in, w_in] + ([b_name] if b_name else [])
        ctx.emit(op, ins, [y], {"common": common}, node.name)
    if rank == 1:
        ctx.emit("Squeeze", [y], [out], {"squeezeDims": [3]}, node.name + "_1d")


def _deconv_pads(ctx, node, a, kernel, strides, dil, pads, rank):
    """ConvTranspose's pads from auto_pad or output_shape where given (ONNX's formula); any output
    beyond what pads can give goes to output padding (ctx._deconv_extra)."""
    ctx._deconv_extra = None
    auto = _s(a.get("auto_pad", b"NOTSET"))
    out_shape = a.get("output_shape")
    if out_shape is None and auto not in ("SAME_UPPER", "SAME_LOWER"):
        return pads
    shape = ctx.shape(node.input[0])
    sizes = list(shape[2:]) if shape is not None else []
    if len(sizes) != rank or not all(isinstance(d, int) for d in sizes):
        raise MnnToolError(f"{ctx.path}: ConvTranspose '{node.name}': output_shape/auto_pad need a known input size")
    op_pad = [int(v) for v in a.get("output_padding", [0] * rank)]
    targets = list(out_shape)[-rank:] if out_shape is not None else [n * s for n, s in zip(sizes, strides)]
    begin, end, extra = [], [], []
    for i in range(rank):
        full = strides[i] * (sizes[i] - 1) + op_pad[i] + (kernel[i] - 1) * dil[i] + 1
        total = full - int(targets[i])
        if total < 0:
            begin.append(0), end.append(0), extra.append(-total)
            continue
        small, big = total // 2, total - total // 2
        b_, e_ = (small, big) if auto == "SAME_UPPER" else (big, small)
        begin.append(b_), end.append(e_), extra.append(0)
    if any(extra):
        ctx._deconv_extra = extra + ([0] if rank == 1 else [])
    if rank == 1:
        return begin[0], 0, end[0], 0
    return begin[0], begin[1], end[0], end[1]


@converts("Conv")
def conv(ctx, node, a):
    _window_op(ctx, node, a, "Convolution")


@converts("ConvTranspose")
def conv_transpose(ctx, node, a):
    _window_op(ctx, node, a, "Deconvolution")


@converts("BatchNormalization")
def batch_norm(ctx, node, a):
    """Scale (x * s + b per channel) with constant statistics; with run-time ones, the same arithmetic
    as BinaryOps on [C, 1, ...] views."""
    eps = float(a.get("epsilon", 1e-5))
    if int(a.get("training_mode", 0)) or len([o for o in node.output if o]) > 1:
        raise MnnToolError(f"{ctx.path}: BatchNormalization '{node.name}': training mode (batch statistics and "
                           "running-mean outputs) is not supported")
    values = [ctx.const(node.input[k]) for k in range(1, 5)]
    if any(v is None for v in values):
        _batch_norm_ops(ctx, node, eps)
        return
    scale, bias, mean, var = values
    ctx.emit("BatchNorm", [node.input[0]], [node.output[0]], batch_norm_param(mean, var, eps, scale, bias), node.name)


def _batch_norm_ops(ctx, node, eps):
    rank = ctx.rank(node.input[0])
    if rank is None:
        raise MnnToolError(f"{ctx.path}: BatchNormalization '{node.name}': the input's rank is unknown")
    shaped = []
    for k in range(1, 5):
        r = ctx.tmp(f"{node.output[0]}_p{k}")
        ctx.emit("Reshape", [node.input[k], ctx.int_const(f"{node.name}_pshape", [-1] + [1] * (rank - 2))], [r],
                 {"dimType": "NCHW"}, r)
        shaped.append(r)
    scale, bias, mean, var = shaped
    ve, inv, s, centred, y = (ctx.tmp(node.output[0] + t) for t in ("_ve", "_inv", "_s", "_c", "_y"))
    binary(ctx, var, ctx.float_const(node.name + "_eps", eps), ve, "ADD", ve)
    unary(ctx, ve, inv, "RSQRT", inv)
    binary(ctx, scale, inv, s, "MUL", s)
    binary(ctx, node.input[0], mean, centred, "SUB", centred)
    binary(ctx, centred, s, y, "MUL", y)
    binary(ctx, y, bias, node.output[0], "ADD", node.name)


def _explicit_pads(ctx, x, sizes, rank, kernel, strides, pads, ceil, full_windows, name):
    """An average counting padding, as a zero Padding op and an average over what it covers: MNN's
    INCLUDE_PADDING divides wrongly by windows on end padding (LpPool SAME_UPPER, 1.3 off) and keeps a
    ceil window that ONNX drops because it starts on the padding (measured, MNN 3.6). ONNX's output
    count decides how far the zeros reach; a ceil window overhanging them is padded more by the pooling,
    excluded from the divisor as ONNX excludes it, or (full_windows: LpPool's sum) by the zeros too.
    Returns (padded x, end pads left to the pooling)."""
    t, l, b, r = pads
    reach = []
    for n, kk, st, p0, p1 in zip(sizes[:2], kernel, strides, (t, l), (b, r)):
        span = n + p0 + p1 - kk
        o = (-(-span // st) if ceil else span // st) + 1
        if ceil and (o - 1) * st >= n + p0:         # ONNX drops a last window starting on the padding
            o -= 1
        need = (o - 1) * st + kk - n - p0            # end padding the last window reaches
        zeros, more = min(p1, max(need, 0)), max(need - p1, 0)
        reach.append((zeros + more, 0) if full_windows else (zeros, more))
    (b, eb), (r, er) = reach
    spatial_pads = [t, b] + ([l, r] if rank == 4 else [])
    padded = ctx.tmp(name + "_padded")
    ctx.emit("Padding", [x, ctx.int_const(name + "_pads", [0, 0, 0, 0] + spatial_pads)], [padded],
             {"mode": "CONSTANT"}, name + "_pad")
    return padded, (0, 0, eb, er)


def _pool(ctx, node, a, kind, x=None, out=None, name=None, full_windows=False):
    """Max/average pooling on 1-D or 2-D windows. ceil_mode becomes explicit end padding where the size is
    known (MNN and ONNX disagree on the last window's rule); an average counting padding gets its zeros
    from a Padding op (_explicit_pads)."""
    x, out, name = x or node.input[0], out or node.output[0], name or node.name
    k = list(a["kernel_shape"])
    if len(k) == 3 and x == node.input[0]:
        pool3d(ctx, node, a, kind)
        return
    if any(int(d) != 1 for d in a.get("dilations", [1] * len(k))):
        if kind != "MAXPOOL" or len(k) > 2:
            raise MnnToolError(f"{ctx.path}: {node.op_type} '{node.name}': dilated average pooling is not supported")
        dilated_max_pool(ctx, node, a, x, out, len(k))
        return
    kernel, strides, _, pads, mode = spatial(ctx, node, a, k, x)
    t, l, b, r = pads
    include = bool(a.get("count_include_pad", 0))
    ceil = bool(a.get("ceil_mode", 0))
    shape = ctx.shape(x)
    sizes = list(shape[2:]) + [1] * (4 - len(shape)) if shape is not None else None
    known = sizes is not None and all(isinstance(d, int) for d in sizes[:2]) and mode == "CAFFE"
    if include and mode == "SAME":
        raise MnnToolError(f"{ctx.path}: {node.op_type} '{node.name}': counting padding with auto_pad SAME_UPPER "
                           "needs the input's size at convert time (MNN's pooling divides the windows on the end "
                           "padding differently; give --input-shape)")
    if include and known and (ceil or any((t, l, b, r))):
        x, (t, l, b, r) = _explicit_pads(ctx, x, sizes, len(shape), kernel, strides, (t, l, b, r), ceil,
                                         full_windows, name)
        include = ceil = False
    if ceil and not include and sizes is not None and all(isinstance(d, int) for d in sizes[:2]) and mode == "CAFFE":
        ends = []
        for n, kk, st, p0, p1 in zip(sizes[:2], kernel, strides, (t, l), (b, r)):
            o = -(-(n + p0 + p1 - kk) // st) + 1
            if (o - 1) * st >= n + p0:
                o -= 1
            ends.append(max(p1, (o - 1) * st + kk - n - p0))
        b, r = ends
        ceil = False
    param = pool_param(kind, kernel, strides, (t, l, b, r), ceil,
                       "INCLUDE_PADDING" if include else ("EXCLUDE_PADDING" if any((t, l, b, r)) else "DEFAULT"), mode)
    if len(k) == 1:
        x4, y4 = lift_1d(ctx, node, x, "x"), ctx.tmp(out + "_4d")
        ctx.emit("Pooling", [x4], [y4], param, name)
        ctx.emit("Squeeze", [y4], [out], {"squeezeDims": [3]}, name + "_1d")
    else:
        ctx.emit("Pooling", [x], [out], param, name)


@converts("MaxPool")
def max_pool(ctx, node, a):
    if len(node.output) > 1 and node.output[1]:
        raise MnnToolError(f"{ctx.path}: MaxPool '{node.name}': the Indices output is not supported")
    _pool(ctx, node, a, "MAXPOOL")


@converts("AveragePool")
def avg_pool(ctx, node, a):
    _pool(ctx, node, a, "AVEPOOL")


@converts("LpPool")
def lp_pool(ctx, node, a):
    """(sum over the window of |x|^p)^(1/p): an average pool counting padding, times the window size."""
    p = float(a.get("p", 2))
    x, out, name = node.input[0], node.output[0], node.name
    absx, powx, avg, total = (ctx.tmp(out + s) for s in ("_abs", "_pow", "_avg", "_sum"))
    unary(ctx, x, absx, "ABS", name + "_abs")
    binary(ctx, absx, ctx.float_const(name + "_p", p), powx, "POW", name + "_pow")
    if ctx.shape(x) is not None:      # |x|^p keeps x's shape: auto_pad and the padding need its size
        ctx.shapes[powx] = ctx.shape(x)
    _pool(ctx, node, dict(a, count_include_pad=1), "AVEPOOL", powx, avg, name + "_avg", full_windows=True)
    binary(ctx, avg, ctx.float_const(name + "_n", float(np.prod(a["kernel_shape"]))), total, "MUL", name + "_sum")
    binary(ctx, total, ctx.float_const(name + "_inv", 1.0 / p), out, "POW", name)


@converts("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool")
def global_pool(ctx, node, a):
    rank = ctx.rank(node.input[0])
    if rank == 4 and node.op_type != "GlobalLpPool":
        kind = "AVEPOOL" if node.op_type == "GlobalAveragePool" else "MAXPOOL"
        ctx.emit("Pooling", [node.input[0]], [node.output[0]], pool_param(kind, is_global=True), node.name)
        return
    if rank is None:
        raise MnnToolError(f"{ctx.path}: {node.op_type} '{node.name}': the input's rank is unknown")
    axes = list(range(2, rank))
    if node.op_type == "GlobalLpPool":
        p = float(a.get("p", 2))
        absx, powx, total = (ctx.tmp(node.output[0] + s) for s in ("_abs", "_pow", "_sum"))
        unary(ctx, node.input[0], absx, "ABS", node.name + "_abs")
        binary(ctx, absx, ctx.float_const(node.name + "_p", p), powx, "POW", node.name + "_pow")
        ctx.emit("Reduction", [powx], [total], {"operation": "SUM", "dim": axes, "keepDims": True}, node.name + "_sum")
        binary(ctx, total, ctx.float_const(node.name + "_inv", 1.0 / p), node.output[0], "POW", node.name)
        return
    op = "MEAN" if node.op_type == "GlobalAveragePool" else "MAXIMUM"
    ctx.emit("Reduction", [node.input[0]], [node.output[0]], {"operation": op, "dim": axes, "keepDims": True}, node.name)


@converts("MaxRoiPool")
def max_roi_pool(ctx, node, a):
    """Fast R-CNN's max pooling of regions: MNN's ROIPooling, which reads the regions as (R, 5, 1, 1)."""
    ph, pw = (int(v) for v in a["pooled_shape"])
    rois = ctx.tmp(node.output[0] + "_rois")
    ctx.emit("Reshape", [node.input[1], ctx.int_const(node.name + "_rois_shape", [-1, 5, 1, 1])], [rois],
             {"dimType": "NCHW"}, rois)
    ctx.emit("ROIPooling", [node.input[0], rois], [node.output[0]],
             {"pooledWidth": pw, "pooledHeight": ph, "spatialScale": float(a.get("spatial_scale", 1.0)),
              "poolType": "MAXPOOL"}, node.name)


@converts("MatMul")
def matmul(ctx, node, a):
    a_, b_ = node.input[:2]
    if ctx.rank(a_) == 1 and ctx.rank(b_) == 1:     # a dot product: MNN's MatMul crashes on two vectors
        ra, rb, mm = (ctx.tmp(node.output[0] + t) for t in ("_row", "_col", "_mm"))
        ctx.emit("Reshape", [a_, ctx.int_const(node.name + "_rs", [1, -1])], [ra], {"dimType": "NCHW"}, ra)
        ctx.emit("Reshape", [b_, ctx.int_const(node.name + "_cs", [-1, 1])], [rb], {"dimType": "NCHW"}, rb)
        ctx.emit("MatMul", [ra, rb], [mm], {"T": "DT_FLOAT", "transposeA": False, "transposeB": False}, mm)
        ctx.emit("Reshape", [mm, ctx.int_const(node.name + "_scalar", [])], [node.output[0]], {"dimType": "NCHW"},
                 node.name)
        return
    ctx.emit("MatMul", [a_, b_], [node.output[0]], {"T": "DT_FLOAT", "transposeA": False,
                                                    "transposeB": False}, node.name)


def _scaled(ctx, node, name, factor, tag):
    """name times factor: folded into the constant, or a MUL at run time; name itself for 1."""
    if factor == 1.0:
        return name
    v = ctx.const(name)
    if v is not None:
        return ctx.float_const(f"{name}_{tag}", v * factor)
    scaled = ctx.tmp(f"{node.output[0]}_{tag}")
    ctx.emit("BinaryOp", [name, ctx.float_const(f"{node.name}_{tag}", factor)], [scaled],
             {"opType": "MUL", "T": "DT_FLOAT"}, scaled)
    return scaled


@converts("Gemm")
def gemm(ctx, node, a):
    alpha, beta = float(a.get("alpha", 1.0)), float(a.get("beta", 1.0))
    ta, tb = bool(a.get("transA", 0)), bool(a.get("transB", 0))
    b_name = _scaled(ctx, node, node.input[1], alpha, "alpha")
    has_c = len(node.input) > 2 and node.input[2]
    out = ctx.tmp(node.output[0] + "_mm") if has_c else node.output[0]
    ctx.emit("MatMul", [node.input[0], b_name], [out], {"T": "DT_FLOAT", "transposeA": ta, "transposeB": tb},
             node.name)
    if has_c:
        c_name = _scaled(ctx, node, node.input[2], beta, "beta")
        ctx.emit("BinaryOp", [out, c_name], [node.output[0]], {"opType": "ADD", "T": "DT_FLOAT"},
                 node.name + "_bias")


@converts("Resize", "Upsample")
def resize(ctx, node, a):
    mode = a.get("mode", b"nearest")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    ctm = a.get("coordinate_transformation_mode", b"half_pixel")
    ctm = ctm.decode() if isinstance(ctm, bytes) else ctm
    nearest_mode = a.get("nearest_mode", b"round_prefer_floor")
    nearest_mode = nearest_mode.decode() if isinstance(nearest_mode, bytes) else nearest_mode
    if node.op_type == "Upsample":
        ctm, nearest_mode = "asymmetric", "floor"
    if mode == "nearest":
        rtype = 1 if (ctm == "asymmetric" and nearest_mode == "floor") else 4
    elif mode == "linear":
        rtype = 2
    elif mode == "cubic":
        rtype = 3
    else:
        raise MnnToolError(f"{ctx.path}: Resize '{node.name}': mode {mode} is not supported")
    ctm_enum = {"align_corners": "AlignCorners", "half_pixel": "HalfPixels", "pytorch_half_pixel": "PytorchHalfPixels",
                "asymmetric": "Asymmetric", "tf_half_pixel_for_nn": "TensorflowHalfPixels",
                "tf_crop_and_resize": "TensorflowCropAndResize"}.get(ctm, "NotSet")
    param = {"resizeType": rtype, "alignCorners": ctm == "align_corners",
             "halfPixelCenters": ctm in ("half_pixel", "pytorch_half_pixel"), "ctm": ctm_enum,
             "cubicCoeffA": float(a.get("cubic_coeff_a", -0.75))}
    coeff_a, exclude = float(a.get("cubic_coeff_a", -0.75)), bool(int(a.get("exclude_outside", 0)))
    cubic_ops = mode == "cubic" and not int(a.get("antialias", 0)) and ctm != "tf_crop_and_resize"
    for flag in ("antialias", "exclude_outside"):
        if int(a.get(flag, 0)) and not (cubic_ops and flag == "exclude_outside"):
            raise MnnToolError(f"{ctx.path}: Resize '{node.name}': {flag}=1 has no MNN equivalent")
    if ctm == "tf_crop_and_resize":
        raise MnnToolError(f"{ctx.path}: Resize '{node.name}': tf_crop_and_resize is not supported")
    inputs = list(node.input)
    x, out = inputs[0], node.output[0]
    rank = ctx.rank(x)
    axes = a.get("axes")
    if rank is not None and rank != 4:
        raise MnnToolError(f"{ctx.path}: Resize '{node.name}': only 4-D (NCHW) inputs are supported (rank {rank})")
    if node.op_type == "Upsample":
        operand = inputs[1] if len(inputs) > 1 else None
        is_scales = True
        if operand is None:
            scales_attr = a.get("scales")
            operand = ctx.float_const(node.name + "_scales", scales_attr)
    else:
        sizes_in = inputs[3] if len(inputs) > 3 and inputs[3] else None
        scales_in = inputs[2] if len(inputs) > 2 and inputs[2] else None
        if sizes_in is not None and (ctx.const(sizes_in) is None or ctx.const(sizes_in).size):
            operand, is_scales = sizes_in, False
        elif scales_in is not None:
            operand, is_scales = scales_in, True
        else:
            raise MnnToolError(f"{ctx.path}: Resize '{node.name}': neither scales nor sizes given")
    value = ctx.const(operand)
    if value is not None and axes is not None:      # opset 18 axes: the rest stay as they are
        full = np.ones(4, np.float32) if is_scales else np.array(ctx.shape(x), np.int64)
        for ax, v in zip(axes, np.asarray(value).reshape(-1)):
            full[int(ax) % 4] = v
        value = full
    elif axes is not None:
        raise MnnToolError(f"{ctx.path}: Resize '{node.name}': axes with run-time scales/sizes are not supported")
    policy = _s(a.get("keep_aspect_ratio_policy", b"stretch"))
    if value is not None and not is_scales and policy != "stretch":
        shape = ctx.shape(x)
        if shape is None or not all(isinstance(d, int) for d in shape[2:]):
            raise MnnToolError(f"{ctx.path}: Resize '{node.name}': keep_aspect_ratio_policy needs known sizes")
        ratio = [float(v) / d for v, d in zip(np.asarray(value).reshape(-1)[2:], shape[2:])]
        r = min(ratio) if policy == "not_larger" else max(ratio)
        value = np.array(list(shape[:2]) + [int(np.floor(d * r + 0.5)) for d in shape[2:]], np.int64)
    cubic_ops = cubic_ops and needs_decomposition(ctm, coeff_a, exclude, value, is_scales, ctx.shape(x))
    if cubic_ops:     # MNN's cubic Interp differs from ONNX here (frontends/onnx/cubic.py)
        factors = whole_factors(ctm, coeff_a, exclude, value, is_scales, ctx.shape(x))
        if factors:
            interp_on_padded(ctx, node, x, out, param, factors, ctx.shape(x))
        else:
            cubic_resize(ctx, node, x, out, ctm, coeff_a, exclude, value, operand, is_scales)
        return
    if value is not None and not is_scales:
        sz = np.asarray(value).reshape(-1)
        param.update(outputHeight=int(sz[-2]), outputWidth=int(sz[-1]))
        ctx.emit("Interp", [x], [out], param, node.name, fmt="NCHW")
    elif value is not None:
        sc = np.asarray(value, np.float32).reshape(-1)
        param.update(heightScale=float(sc[-2]), widthScale=float(sc[-1]))
        ctx.emit("Interp", [x, ctx.float_const(node.name + "_scales", sc)], [out], param, node.name, fmt="NCHW")
    else:
        ctx.emit("Interp", [x, operand], [out], param, node.name, fmt="NCHW")
