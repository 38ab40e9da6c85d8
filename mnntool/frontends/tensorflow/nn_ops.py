"""TensorFlow's layout-sensitive ops beyond the basic convolution and pools: transposed and 3-D
convolutions, 3-D pools, LRN, bicubic resize, depth/space and batch/space rearrangements. 4-D results
are NCHW and marked; 5-D ones are computed on an NCDHW copy and handed back as NDHWC."""
from __future__ import annotations

import numpy as np

from ..shaped import conv_param, emit_onnx
from .ops import OPS, _const, _fail, _nhwc_attr, _same_pads, _spatial_in, attr, bias_add, op, pool


def _tmp(ctx, node, tag):
    return ctx.tmp(f"{node.name}_{tag}")


def deconv(ctx, x, w_io_hw: np.ndarray, out_hw, stride, dil, bias, out: str, name: str):
    """A transposed convolution of NCHW x to the declared output size, TensorFlow-style: the full result
    cropped with the extra row/column at the end. Weights are (in, out, kh, kw)."""
    cin, cout, kh, kw = w_io_hw.shape
    h, wd = ctx.shape_of(x)[2:]
    oh, ow = out_hw
    eh, ew = (kh - 1) * dil[0] + 1, (kw - 1) * dil[1] + 1
    th, tw = max((h - 1) * stride[0] + eh - oh, 0), max((wd - 1) * stride[1] + ew - ow, 0)
    pads = (th // 2, tw // 2, th - th // 2, tw - tw // 2)
    common = conv_param(kh, kw, cout, cin, 1, stride, dil, pads)
    y = ctx.emit("Deconvolution", [x], [out], {"common": common, "bias": bias,
                                                "weight": np.ascontiguousarray(w_io_hw, np.float32).reshape(-1)}, name)
    got = ctx.shape_of(y[0])
    if (got[2], got[3]) != (oh, ow):
        raise ValueError(f"output size {got[2]}x{got[3]} differs from the declared {oh}x{ow}")
    return y


@op("Conv2DBackpropInput")
def conv2d_backprop_input(ctx, node, args):
    sizes = _const(ctx, node, args[0], "input_sizes").reshape(-1)
    w = _const(ctx, node, args[1], "the filter").astype(np.float32)       # kh, kw, out(deconv), in(deconv)
    x, native = _spatial_in(ctx, node, args[2])
    if attr(node, "padding", "VALID") not in ("SAME", "VALID"):
        _fail(ctx, node, "explicit padding is not supported")
    oh, ow = (sizes[2], sizes[3]) if native else (sizes[1], sizes[2])
    stride, dil = _nhwc_attr(ctx, node, "strides", [1] * 4), _nhwc_attr(ctx, node, "dilations", [1] * 4)
    y = deconv(ctx, x, w.transpose(3, 2, 0, 1), (int(oh), int(ow)), stride, dil, np.zeros(w.shape[2], np.float32),
               ctx.out(node), node.name)
    return ctx.mark(y, not native)


def _ncdhw(ctx, node, x):
    return emit_onnx(ctx, "Transpose", [ctx.tensor(ctx.as_nhwc(x))], [_tmp(ctx, node, "ncdhw")],
                     {"perm": [0, 4, 1, 2, 3]})[0]


def _ndhwc(ctx, node, y):
    return emit_onnx(ctx, "Transpose", [y], [ctx.out(node)], {"perm": [0, 2, 3, 4, 1]})


def _pads_3d(ctx, node, dims, k, stride, dil):
    if attr(node, "padding", "VALID") == "VALID":
        return [0] * 6
    if attr(node, "padding") != "SAME":
        _fail(ctx, node, "explicit padding is not supported")
    p = [_same_pads(d, kk, s, dd) for d, kk, s, dd in zip(dims, k, stride, dil)]
    return [a for a, _ in p] + [b for _, b in p]


def _attr5(ctx, node, key):
    if attr(node, "data_format", "NDHWC") != "NDHWC":
        _fail(ctx, node, "only NDHWC is supported")
    return [int(v) for v in attr(node, key, [1] * 5)[1:4]]


@op("Conv3D")
def conv3d(ctx, node, args):
    w = _const(ctx, node, args[1], "the filter").astype(np.float32)         # kd, kh, kw, cin/group, cout
    x = _ncdhw(ctx, node, args[0])
    stride, dil = _attr5(ctx, node, "strides"), _attr5(ctx, node, "dilations")
    dims = ctx.shape_of(x)[2:]
    group = ctx.shape_of(x)[1] // w.shape[3]
    y = emit_onnx(ctx, "Conv", [x, np.ascontiguousarray(w.transpose(4, 3, 0, 1, 2))], [_tmp(ctx, node, "y")],
                  {"strides": stride, "dilations": dil, "group": group,
                   "pads": _pads_3d(ctx, node, dims, w.shape[:3], stride, dil)})[0]
    return _ndhwc(ctx, node, y)


@op("MaxPool3D", "AvgPool3D")
def pool3d(ctx, node, args):
    x = _ncdhw(ctx, node, args[0])
    k, stride = _attr5(ctx, node, "ksize"), _attr5(ctx, node, "strides")
    pads = _pads_3d(ctx, node, ctx.shape_of(x)[2:], k, stride, (1, 1, 1))
    kind = "MaxPool" if node.op == "MaxPool3D" else "AveragePool"
    extra = {} if kind == "MaxPool" else {"count_include_pad": 0}
    y = emit_onnx(ctx, kind, [x], [_tmp(ctx, node, "y")], {"kernel_shape": k, "strides": stride, "pads": pads,
                                                            **extra})[0]
    return _ndhwc(ctx, node, y)


@op("MaxPoolV2")
def max_pool_v2(ctx, node, args):
    """MaxPool with ksize and strides as operands: the same op once they are known."""
    for key, v in (("ksize", args[1]), ("strides", args[2])):
        node.attr[key].list.i[:] = [int(i) for i in _const(ctx, node, v, key).reshape(-1)]
    node.op = "MaxPool"
    try:
        return pool(ctx, node, args[:1])
    finally:
        node.op = "MaxPoolV2"


OPS["BiasAddV1"] = bias_add


def lrn(ctx, x, radius: int, alpha: float, beta: float, bias: float, outs):
    """TensorFlow's LRN on NCHW x: sum over [c-r, c+r] of x^2 times alpha (ONNX divides alpha by the size)."""
    size = 2 * int(radius) + 1
    return ctx.mark(emit_onnx(ctx, "LRN", [x], outs, {"size": size, "alpha": float(alpha) * size,
                                                      "beta": float(beta), "bias": float(bias)}), True)


@op("LRN")
def lrn_op(ctx, node, args):
    return lrn(ctx, ctx.as_nchw(args[0]), attr(node, "depth_radius", 5), attr(node, "alpha", 1.0),
               attr(node, "beta", 0.5), attr(node, "bias", 1.0), [ctx.out(node)])


def depth_space(ctx, x, to_space: bool, block: int, outs):
    """DepthToSpace / SpaceToDepth of NCHW x in TensorFlow's channel order (DCR)."""
    return ctx.mark(ctx.emit("DepthToSpace" if to_space else "SpaceToDepth", [x], outs,
                             {"blockSize": int(block), "mode": "DCR"}), True)


@op("DepthToSpace", "SpaceToDepth")
def depth_space_op(ctx, node, args):
    if attr(node, "data_format", "NHWC") != "NHWC":
        _fail(ctx, node, "only NHWC is supported")
    return depth_space(ctx, ctx.as_nchw(args[0]), node.op == "DepthToSpace", attr(node, "block_size"),
                       [ctx.out(node)])


@op("ResizeBicubic")
def resize_bicubic(ctx, node, args):
    x = ctx.as_nchw(args[0])
    size = _const(ctx, node, args[1], "the size").astype(np.int64).reshape(-1)
    align, half = bool(attr(node, "align_corners", False)), bool(attr(node, "half_pixel_centers", False))
    n, c = ctx.shape_of(x)[:2]
    ctm = "align_corners" if align else "half_pixel" if half else "asymmetric"
    y = emit_onnx(ctx, "Resize", [x, None, None, np.asarray([n, c, size[0], size[1]], np.int64)], [ctx.out(node)],
                  {"mode": "cubic", "coordinate_transformation_mode": ctm,
                   "cubic_coeff_a": -0.5 if half else -0.75})
    return ctx.mark(y, True)


@op("SpaceToBatchND", "BatchToSpaceND")
def space_batch(ctx, node, args):
    """Blocks of H and W moved to and from the batch (TF's dilated-convolution wrapping), as pad/crop,
    reshape and transpose in NHWC."""
    x = ctx.tensor(ctx.as_nhwc(args[0]))
    block = _const(ctx, node, args[1], "the block shape").astype(np.int64).reshape(-1)
    pads = _const(ctx, node, args[2], "the paddings/crops").astype(np.int64).reshape(-1, 2)
    shape = ctx.shape_of(x)
    if len(block) != 2 or len(shape) != 4:
        _fail(ctx, node, "only 2 spatial dims of a 4-D tensor are supported")
    bh, bw = (int(b) for b in block)
    if node.op == "SpaceToBatchND":
        if pads.any():
            full = np.zeros((4, 2), np.int64)
            full[1:3] = pads
            x = emit_onnx(ctx, "Pad", [x, np.concatenate([full[:, 0], full[:, 1]])], [_tmp(ctx, node, "pad")])[0]
        n, h, w, c = ctx.shape_of(x)
        y = ctx.reshape(x, [n, h // bh, bh, w // bw, bw, c], _tmp(ctx, node, "6d"))[0]
        y = emit_onnx(ctx, "Transpose", [y], [_tmp(ctx, node, "t")], {"perm": [2, 4, 0, 1, 3, 5]})[0]
        return ctx.reshape(y, [bh * bw * n, h // bh, w // bw, c], ctx.out(node))
    b, h, w, c = shape
    n = b // (bh * bw)
    y = ctx.reshape(x, [bh, bw, n, h, w, c], _tmp(ctx, node, "6d"))[0]
    y = emit_onnx(ctx, "Transpose", [y], [_tmp(ctx, node, "t")], {"perm": [2, 3, 0, 4, 1, 5]})[0]
    full = [n, h * bh, w * bw, c]
    if not pads.any():
        return ctx.reshape(y, full, ctx.out(node))
    y = ctx.reshape(y, full, _tmp(ctx, node, "4d"))[0]
    return emit_onnx(ctx, "Slice", [y, pads[:, 0], np.asarray(full[1:3]) - pads[:, 1], np.asarray([1, 2], np.int64)],
                     [ctx.out(node)])
