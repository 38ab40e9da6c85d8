"""3-D convolution and pooling, and dilated pooling, written with MNN's 2-D ops.

A 3-D convolution is kD 2-D convolutions: for each depth tap kd, the depth planes it reads (a strided
slice of the depth-padded input) become the batch of a 2-D convolution with that tap's weights, and
the kD results add up. 3-D max pooling is 2-D pooling of each plane, then the maximum over the depth
window's planes; a dilated max pool is the maximum of its kernel taps, each a strided slice of the
padded input. All need the spatial sizes at convert time.
"""
from __future__ import annotations

import numpy as np

from ...errors import MnnToolError
from ...ir.ops.nn import pool_param
from .math import binary
from .windows import conv_common


def _static(ctx, node, name, rank):
    shape = ctx.shape(name)
    if shape is None or len(shape) != rank or not all(isinstance(d, int) for d in shape[1:]):
        raise MnnToolError(f"{ctx.path}: {node.op_type} '{node.name}': a {rank - 2}-D window op needs its input's "
                           "sizes at convert time (give --input-shape)")
    return shape


def _pads_3d(a, k, s, d, sizes):
    auto = a.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    pads = [int(v) for v in a.get("pads", [0] * 6)]
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pads = [0] * 6
        for i in range(3):
            out = -(-sizes[i] // s[i])
            total = max((out - 1) * s[i] + (k[i] - 1) * d[i] + 1 - sizes[i], 0)
            small, big = total // 2, total - total // 2
            pads[i], pads[i + 3] = (small, big) if auto == "SAME_UPPER" else (big, small)
    elif auto == "VALID":
        pads = [0] * 6
    return pads


def _slice(ctx, x, axis, start, stop, step, out):
    ins = [x] + [ctx.int_const(f"{out}_{t}", [v]) for t, v in (("s", start), ("e", stop), ("a", axis), ("st", step))]
    ctx.emit("StridedSlice", ins, [out], {"fromType": 1}, out)
    return out


def _pad(ctx, x, pads_interleaved, out, value=None):
    ins = [x, ctx.int_const(out + "_pads", pads_interleaved)]
    if value is not None:
        ins.append(ctx.float_const(out + "_value", np.float32(value)))
    ctx.emit("Padding", ins, [out], {"mode": "CONSTANT"}, out)
    return out


def _planes_as_batch(ctx, x, c, h, w, out):
    """[N, C, D, H, W] -> [N*D, C, H, W]."""
    t = ctx.tmp(out + "_t")
    ctx.emit("Permute", [x], [t], {"dims": [0, 2, 1, 3, 4]}, t)
    ctx.emit("Reshape", [t, ctx.int_const(out + "_shape", [-1, c, h, w])], [out], {"dimType": "NCHW"}, out)
    return out


def _batch_as_planes(ctx, x, d, c, h, w, out):
    """[N*D, C, H, W] -> [N, C, D, H, W]."""
    r = ctx.tmp(out + "_r")
    ctx.emit("Reshape", [x, ctx.int_const(out + "_shape", [-1, d, c, h, w])], [r], {"dimType": "NCHW"}, r)
    ctx.emit("Permute", [r], [out], {"dims": [0, 2, 1, 3, 4]}, out)
    return out


def conv3d(ctx, node, a):
    x, out, name = node.input[0], node.output[0], node.name
    w = ctx.const(node.input[1])
    if w is None:
        raise MnnToolError(f"{ctx.path}: Conv '{name}': 3-D convolution needs constant weights")
    w = np.asarray(w, np.float32)
    b = ctx.const(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    n, c, dd, hh, ww = _static(ctx, node, x, 5)
    cout, group = w.shape[0], int(a.get("group", 1))
    k = list(a.get("kernel_shape", w.shape[2:]))
    s = [int(v) for v in a.get("strides", [1, 1, 1])]
    dil = [int(v) for v in a.get("dilations", [1, 1, 1])]
    pads = _pads_3d(a, k, s, dil, [dd, hh, ww])
    dp = dd + pads[0] + pads[3]
    do = (dp - dil[0] * (k[0] - 1) - 1) // s[0] + 1
    ho = (hh + pads[1] + pads[4] - dil[1] * (k[1] - 1) - 1) // s[1] + 1
    wo = (ww + pads[2] + pads[5] - dil[2] * (k[2] - 1) - 1) // s[2] + 1
    xp = _pad(ctx, x, [0, 0, 0, 0, pads[0], pads[3], 0, 0, 0, 0], ctx.tmp(out + "_dpad")) if pads[0] or pads[3] else x
    common = conv_common(k[1:], s[1:], dil[1:], (pads[1], pads[2], pads[4], pads[5]), "CAFFE", cout, c, group)
    depthwise = group > 1 and group == c == cout
    acc = None
    for kd in range(k[0]):
        start = kd * dil[0]
        planes = _slice(ctx, xp, 2, start, start + s[0] * (do - 1) + 1, s[0], ctx.tmp(f"{out}_d{kd}"))
        batch = _planes_as_batch(ctx, planes, c, hh, ww, ctx.tmp(f"{out}_b{kd}"))
        y = ctx.tmp(f"{out}_y{kd}")
        bias = np.asarray(b, np.float32).reshape(-1) if (b is not None and kd == 0) else np.zeros(cout, np.float32)
        ctx.emit("ConvolutionDepthwise" if depthwise else "Convolution", [batch], [y],
                 {"common": dict(common), "weight": w[:, :, kd].reshape(-1).copy(), "bias": bias}, f"{name}_k{kd}")
        if acc is None:
            acc = y
        else:
            total = ctx.tmp(f"{out}_sum{kd}")
            binary(ctx, acc, y, total, "ADD", total)
            acc = total
    _batch_as_planes(ctx, acc, do, cout, ho, wo, out)


def pool3d(ctx, node, a, kind):
    """Max pooling (any padding) and average pooling (count_include_pad, or no padding) over 3-D windows."""
    x, out, name = node.input[0], node.output[0], node.name
    n, c, dd, hh, ww = _static(ctx, node, x, 5)
    k = [int(v) for v in a["kernel_shape"]]
    s = [int(v) for v in a.get("strides", [1, 1, 1])]
    if any(int(v) != 1 for v in a.get("dilations", [1, 1, 1])) or int(a.get("ceil_mode", 0)):
        raise MnnToolError(f"{ctx.path}: {node.op_type} '{name}': dilated or ceil-mode 3-D pooling is not supported")
    pads = _pads_3d(a, k, s, [1, 1, 1], [dd, hh, ww])
    include = bool(a.get("count_include_pad", 0))
    if kind == "AVEPOOL" and any(pads) and not include:
        raise MnnToolError(f"{ctx.path}: AveragePool '{name}': 3-D averages that exclude padding are not supported")
    fill = -np.inf if kind == "MAXPOOL" else 0.0
    xp = _pad(ctx, x, [0, 0, 0, 0, pads[0], pads[3], pads[1], pads[4], pads[2], pads[5]], ctx.tmp(out + "_pad"),
              fill if kind == "MAXPOOL" else None) if any(pads) else x
    dp, hp, wp = dd + pads[0] + pads[3], hh + pads[1] + pads[4], ww + pads[2] + pads[5]
    do, ho, wo = ((dp - k[0]) // s[0] + 1, (hp - k[1]) // s[1] + 1, (wp - k[2]) // s[2] + 1)
    batch = _planes_as_batch(ctx, xp, c, hp, wp, ctx.tmp(out + "_b"))
    pooled = ctx.tmp(out + "_p2d")
    ctx.emit("Pooling", [batch], [pooled], pool_param(kind, k[1:], s[1:], count="INCLUDE_PADDING"), out + "_p2d")
    planes = _batch_as_planes(ctx, pooled, dp, c, ho, wo, ctx.tmp(out + "_planes"))
    acc = None
    for kd in range(k[0]):
        sl = _slice(ctx, planes, 2, kd, kd + s[0] * (do - 1) + 1, s[0], ctx.tmp(f"{out}_d{kd}"))
        if acc is None:
            acc = sl
            continue
        nxt = ctx.tmp(f"{out}_m{kd}")
        binary(ctx, acc, sl, nxt, "MAXIMUM" if kind == "MAXPOOL" else "ADD", nxt)
        acc = nxt
    if kind == "AVEPOOL":
        binary(ctx, acc, ctx.float_const(name + "_inv", 1.0 / k[0]), out, "MUL", name)
    else:
        ctx.emit("Identity", [acc], [out], {}, name)


def dilated_max_pool(ctx, node, a, x, out, rank):
    """Max over the kernel's taps, each a strided slice of the -inf padded input (1-D or 2-D)."""
    name = node.name
    shape = _static(ctx, node, x, rank + 2)
    k = [int(v) for v in a["kernel_shape"]]
    s = [int(v) for v in a.get("strides", [1] * rank)]
    d = [int(v) for v in a.get("dilations", [1] * rank)]
    pads = [int(v) for v in a.get("pads", [0] * (2 * rank))]
    if int(a.get("ceil_mode", 0)) or a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        raise MnnToolError(f"{ctx.path}: MaxPool '{name}': dilated pooling with ceil_mode or auto_pad is not supported")
    sizes = shape[2:]
    outs = [(sizes[i] + pads[i] + pads[i + rank] - d[i] * (k[i] - 1) - 1) // s[i] + 1 for i in range(rank)]
    inter = [0, 0, 0, 0] + [p for i in range(rank) for p in (pads[i], pads[i + rank])]
    if sum(k) > 512:
        raise MnnToolError(f"{ctx.path}: MaxPool '{name}': a dilated window of {k} taps is too large to unroll")
    cur = _pad(ctx, x, inter, ctx.tmp(out + "_pad"), -np.inf) if any(pads) else x
    for i in reversed(range(rank)):          # the window's max is separable: one axis at a time
        acc = None
        for t in range(k[i]):
            start = t * d[i]
            sl = _slice(ctx, cur, 2 + i, start, start + s[i] * (outs[i] - 1) + 1, s[i], ctx.tmp(f"{out}_a{i}t{t}"))
            if acc is None:
                acc = sl
                continue
            nxt = ctx.tmp(f"{out}_a{i}m{t}")
            binary(ctx, acc, sl, nxt, "MAXIMUM", nxt)
            acc = nxt
        cur = acc
    ctx.emit("Identity", [cur], [out], {}, name)
