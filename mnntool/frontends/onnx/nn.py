"""ONNX convolution, normalization, pooling and matmul ops -> IR."""
from __future__ import annotations

import numpy as np

from ...errors import MnnToolError
from ...registry import registrar

CONVERTERS = {}


converts = registrar(CONVERTERS)


def _common(ctx, node, a, kh, kw, cout, cin, group):
    pads = list(a.get("pads", [0, 0, 0, 0]))
    strides = list(a.get("strides", [1, 1]))
    dil = list(a.get("dilations", [1, 1]))
    auto = a.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    mode = {"SAME_UPPER": "SAME", "SAME_LOWER": "SAME", "VALID": "VALID"}.get(auto, "CAFFE")
    if mode == "SAME" and auto == "SAME_LOWER":
        raise MnnToolError(f"{ctx.path}: {node.op_type} '{node.name}': auto_pad SAME_LOWER is not supported")
    if len(pads) != 4:
        raise MnnToolError(f"{ctx.path}: {node.op_type} '{node.name}': only 2-D convolutions are supported")
    return {"padX": int(pads[1]), "padY": int(pads[0]), "kernelX": int(kw), "kernelY": int(kh),
            "strideX": int(strides[1]), "strideY": int(strides[0]), "dilateX": int(dil[1]),
            "dilateY": int(dil[0]), "padMode": mode, "group": int(group), "outputCount": int(cout),
            "inputCount": int(cin), "relu": False, "relu6": False, "pads": [int(p) for p in pads]}


@converts("Conv")
def conv(ctx, node, a):
    w = ctx.need_const(node, 1, "the weight").astype(np.float32)
    if w.ndim != 4:
        raise MnnToolError(f"{ctx.path}: Conv '{node.name}': only 2-D convolutions are supported (weight rank {w.ndim})")
    cout, cin_g, kh, kw = w.shape
    group = int(a.get("group", 1))
    bias = ctx.need_const(node, 2, "the bias").astype(np.float32) if len(node.input) > 2 and node.input[2] \
        else np.zeros(cout, np.float32)
    cin = cin_g * group
    depthwise = group > 1 and group == cin == cout
    common = _common(ctx, node, a, kh, kw, cout, cin, group)
    ctx.emit("ConvolutionDepthwise" if depthwise else "Convolution", [node.input[0]], [node.output[0]],
             {"common": common, "weight": w.reshape(-1), "bias": bias.reshape(-1)}, node.name)


@converts("ConvTranspose")
def conv_transpose(ctx, node, a):
    w = ctx.need_const(node, 1, "the weight").astype(np.float32)
    if w.ndim != 4:
        raise MnnToolError(f"{ctx.path}: ConvTranspose '{node.name}': only 2-D is supported")
    if "output_shape" in a:
        raise MnnToolError(f"{ctx.path}: ConvTranspose '{node.name}': output_shape is not supported; use pads")
    cin, cout_g, kh, kw = w.shape
    group = int(a.get("group", 1))
    cout = cout_g * group
    bias = ctx.need_const(node, 2, "the bias").astype(np.float32) if len(node.input) > 2 and node.input[2] \
        else np.zeros(cout, np.float32)
    common = _common(ctx, node, a, kh, kw, cout, cin, group)
    common["outPads"] = [int(p) for p in a.get("output_padding", [0, 0])]
    depthwise = group > 1 and group == cin == cout
    ctx.emit("DeconvolutionDepthwise" if depthwise else "Deconvolution", [node.input[0]], [node.output[0]],
             {"common": common, "weight": w.reshape(-1), "bias": bias.reshape(-1)}, node.name)


@converts("BatchNormalization")
def batch_norm(ctx, node, a):
    scale, bias, mean, var = (ctx.need_const(node, k, what).astype(np.float64)
                              for k, what in ((1, "scale"), (2, "bias"), (3, "mean"), (4, "variance")))
    s = scale / np.sqrt(var + float(a.get("epsilon", 1e-5)))
    ctx.emit("Scale", [node.input[0]], [node.output[0]],
             {"channels": int(s.size), "scaleData": s.astype(np.float32),
              "biasData": (bias - mean * s).astype(np.float32)}, node.name)


def _pool(ctx, node, a, kind):
    k = list(a["kernel_shape"])
    if len(k) != 2:
        raise MnnToolError(f"{ctx.path}: {node.op_type} '{node.name}': only 2-D pooling is supported")
    pads = [int(p) for p in a.get("pads", [0, 0, 0, 0])]
    strides = list(a.get("strides", [1, 1]))
    auto = a.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if list(a.get("dilations", [1, 1])) != [1, 1]:
        raise MnnToolError(f"{ctx.path}: {node.op_type} '{node.name}': dilated pooling is not supported")
    include = bool(a.get("count_include_pad", 0))
    param = {"padX": pads[1], "padY": pads[0], "isGlobal": False, "kernelX": int(k[1]), "kernelY": int(k[0]),
             "strideX": int(strides[1]), "strideY": int(strides[0]), "type": kind,
             "padType": {"SAME_UPPER": "SAME", "VALID": "VALID"}.get(auto, "CAFFE"), "dataType": "DT_FLOAT",
             "ceilModel": bool(a.get("ceil_mode", 0)), "pads": pads,
             "countType": "INCLUDE_PADDING" if include else ("EXCLUDE_PADDING" if any(pads) else "DEFAULT")}
    ctx.emit("Pooling", [node.input[0]], [node.output[0]], param, node.name)


@converts("MaxPool")
def max_pool(ctx, node, a):
    if len(node.output) > 1 and node.output[1]:
        raise MnnToolError(f"{ctx.path}: MaxPool '{node.name}': the Indices output is not supported")
    _pool(ctx, node, a, "MAXPOOL")


@converts("AveragePool")
def avg_pool(ctx, node, a):
    _pool(ctx, node, a, "AVEPOOL")


@converts("GlobalAveragePool", "GlobalMaxPool")
def global_pool(ctx, node, a):
    kind = "AVEPOOL" if node.op_type == "GlobalAveragePool" else "MAXPOOL"
    ctx.emit("Pooling", [node.input[0]], [node.output[0]],
             {"isGlobal": True, "type": kind, "padType": "CAFFE", "kernelX": 1, "kernelY": 1, "strideX": 1,
              "strideY": 1, "ceilModel": False}, node.name)


@converts("MatMul")
def matmul(ctx, node, a):
    ctx.emit("MatMul", node.input[:2], [node.output[0]], {"T": "DT_FLOAT", "transposeA": False,
                                                          "transposeB": False}, node.name)


@converts("Gemm")
def gemm(ctx, node, a):
    alpha, beta = float(a.get("alpha", 1.0)), float(a.get("beta", 1.0))
    ta, tb = bool(a.get("transA", 0)), bool(a.get("transB", 0))
    b_name = node.input[1]
    if alpha != 1.0:
        b = ctx.need_const(node, 1, "B (when alpha != 1)")
        b_name = ctx.float_const(b_name + "_alpha", b * alpha)
    has_c = len(node.input) > 2 and node.input[2]
    out = ctx.tmp(node.output[0] + "_mm") if has_c else node.output[0]
    ctx.emit("MatMul", [node.input[0], b_name], [out], {"T": "DT_FLOAT", "transposeA": ta, "transposeB": tb},
             node.name)
    if has_c:
        c_name = node.input[2]
        if beta != 1.0:
            c_name = ctx.float_const(c_name + "_beta", ctx.need_const(node, 2, "C (when beta != 1)") * beta)
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
    inputs = list(node.input)
    scales = sizes = None
    if node.op_type == "Upsample":
        scales = ctx.need_const(node, 1, "scales")
    else:
        if len(inputs) > 2 and inputs[2]:
            scales = ctx.const(inputs[2])
        if len(inputs) > 3 and inputs[3]:
            sizes = ctx.const(inputs[3])
    if sizes is not None and sizes.size:
        param.update(outputHeight=int(sizes[-2]), outputWidth=int(sizes[-1]))
        ctx.emit("Interp", [inputs[0]], [node.output[0]], param, node.name, fmt="NCHW")
    elif scales is not None and scales.size:
        param.update(heightScale=float(scales[-2]), widthScale=float(scales[-1]))
        ctx.emit("Interp", [inputs[0], ctx.float_const(node.name + "_scales", scales)], [node.output[0]], param,
                 node.name, fmt="NCHW")
    else:
        raise MnnToolError(f"{ctx.path}: Resize '{node.name}': scales or sizes must be constants")
