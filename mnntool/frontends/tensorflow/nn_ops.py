"""TensorFlow's layout-sensitive ops beyond the basic convolution and pools: transposed and 3-D
convolutions, 3-D pools, LRN, bicubic resize, depth/space and batch/space rearrangements. 4-D results
are NCHW and marked; 5-D ones are computed on an NCDHW copy and handed back as NDHWC."""
from __future__ import annotations

import numpy as np

from ..shape_tracking import conv_param, emit_onnx
from .ops import OPS, _const, _fail, _nhwc_attr, _same_pads, _spatial_in, attr, bias_add, op, pool_2d


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
    dims = ctx.shape_of(x)[2:]
    pads = _pads_3d(ctx, node, dims, k, stride, (1, 1, 1))
    p = {"kernel_shape": k, "strides": stride, "pads": pads}
    if node.op == "MaxPool3D":
        return _ndhwc(ctx, node, emit_onnx(ctx, "MaxPool", [x], [_tmp(ctx, node, "y")], p)[0])
    # TF averages over the window's part inside the input: the padded average times window / part
    total = emit_onnx(ctx, "AveragePool", [x], [_tmp(ctx, node, "sum")], {**p, "count_include_pad": 1})[0]
    if any(pads):
        out_dims = ctx.shape_of(total)[2:]
        counts = [np.asarray([min(o * st - pb + kk, d) - max(o * st - pb, 0) for o in range(od)], np.float32)
                  for od, st, pb, kk, d in zip(out_dims, stride, pads[:3], k, dims)]
        part = counts[0][:, None, None] * counts[1][None, :, None] * counts[2][None, None, :]
        total = emit_onnx(ctx, "Mul", [total, (np.prod(k) / part)[None, None].astype(np.float32)],
                          [_tmp(ctx, node, "avg")])[0]
    return _ndhwc(ctx, node, total)


@op("MaxPoolV2")
def max_pool_v2(ctx, node, args):
    """MaxPool with ksize and strides as operands: the same op once they are known."""
    ksize, strides = (_const(ctx, node, v, key).reshape(-1).tolist() for v, key in ((args[1], "ksize"),
                                                                                     (args[2], "strides")))
    return pool_2d(ctx, node, args[0], ksize, strides, "MAXPOOL")


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


def _keys_cubic(d: np.ndarray, a: float) -> np.ndarray:
    d = np.abs(d)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def cubic_matrix(n_in: int, n_out: int, align: bool, half: bool) -> np.ndarray:
    """(n_out, n_in) weights of TensorFlow's bicubic resize along one axis: Keys' kernel with a = -0.75 and
    edge taps repeated (legacy), or a = -0.5 with taps outside the input dropped and the rest renormalised
    (half-pixel centers)."""
    scale = (n_in - 1) / (n_out - 1) if align and n_out > 1 else n_in / n_out
    a = -0.5 if half else -0.75
    m = np.zeros((n_out, n_in), np.float64)
    for o in range(n_out):
        x = (o + 0.5) * scale - 0.5 if half else o * scale
        i0 = int(np.floor(x))
        taps = np.arange(i0 - 1, i0 + 3)
        w = _keys_cubic(x - taps, a)
        if half:
            inside = (taps >= 0) & (taps < n_in)
            taps, w = taps[inside], w[inside] / w[inside].sum()
        np.add.at(m[o], np.clip(taps, 0, n_in - 1), w)
    return m.astype(np.float32)


@op("ResizeBicubic")
def resize_bicubic(ctx, node, args):
    """Separable with weights fixed by the sizes: two MatMuls with constant matrices, exact in both runtimes."""
    x = ctx.as_nchw(args[0])
    oh, ow = (int(v) for v in _const(ctx, node, args[1], "the size").reshape(-1))
    align, half = bool(attr(node, "align_corners", False)), bool(attr(node, "half_pixel_centers", False))
    h, w = ctx.shape_of(x)[2:]
    rows = emit_onnx(ctx, "MatMul", [x, np.ascontiguousarray(cubic_matrix(w, ow, align, half).T)],
                     [_tmp(ctx, node, "w")])[0]
    return ctx.mark(emit_onnx(ctx, "MatMul", [cubic_matrix(h, oh, align, half), rows], [ctx.out(node)]), True)


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
