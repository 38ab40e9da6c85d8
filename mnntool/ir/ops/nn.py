"""Ops with arithmetic-heavy kernels: convolutions, pooling, matmul, reductions, resize.

`compute` here is the plain numpy meaning of each op (the runtime's kernels are faster); it folds
constants and runs the variants no fast kernel covers.
"""
from __future__ import annotations

import math

import numpy as np

from ...errors import InvalidModel
from . import Val, as_table, define, ints, numel, params


def pads_of(common: dict):
    """(top, left, bottom, right) from MNN's `pads` (begin dims then end dims) or padX/padY, of a
    convolution's common table or a Pool table (the pads read alike)."""
    common = as_table(common, "Convolution2DCommon")
    pads = common.get("pads")
    if pads is not None and len(pads) == 4:
        return int(pads[0]), int(pads[1]), int(pads[2]), int(pads[3])
    py, px = int(common["padY"]), int(common["padX"])
    return py, px, py, px


def conv_out(size, k, s, d, p0, p1, mode="CAFFE"):
    if not isinstance(size, int):
        return size
    if mode == "SAME":
        return -(-size // s)
    if mode == "VALID":
        return (size - d * (k - 1) - 1) // s + 1
    return (size + p0 + p1 - d * (k - 1) - 1) // s + 1


def same_pads(size, out, k, s, d):
    """TensorFlow SAME padding (the extra pixel at the end), as (begin, end)."""
    total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
    return total // 2, total - total // 2


def _geometry(c: dict, h: int, w: int):
    """(kh, kw, sh, sw, dh, dw, (t, l, b, r), oh, ow) of a convolution on an h x w input."""
    kh, kw = c["kernelY"], c["kernelX"]
    sh, sw = c["strideY"], c["strideX"]
    dh, dw = c["dilateY"], c["dilateX"]
    mode = c["padMode"]
    t, l, b, r = pads_of(c)
    oh, ow = conv_out(h, kh, sh, dh, t, b, mode), conv_out(w, kw, sw, dw, l, r, mode)
    if mode == "SAME":
        (t, b), (l, r) = same_pads(h, oh, kh, sh, dh), same_pads(w, ow, kw, sw, dw)
    elif mode == "VALID":
        t = l = b = r = 0
    return kh, kw, sh, sw, dh, dw, (t, l, b, r), oh, ow


def _weights(node, xs, shape):
    w = xs[1] if len(xs) > 1 and xs[1] is not None else node.param.get("weight")
    if w is None:
        raise ValueError(f"{node.op} '{node.name}': no float weights (quantized weights run on the int8 kernels)")
    w = np.asarray(w, np.float32).reshape(shape)
    b = xs[2] if len(xs) > 2 and xs[2] is not None else node.param.get("bias")
    b = np.zeros(shape[0] if node.op.startswith("Conv") else 0, np.float32) if b is None else np.asarray(b, np.float32)
    return w, b.reshape(-1)


def _activate(c: dict, out):
    if c["relu6"]:
        return np.clip(out, 0, 6)
    if c["relu"]:
        return np.maximum(out, 0)
    return out


def _windows(xp, kh, kw, sh, sw, dh, dw, oh, ow):
    """[n, c, kh, kw, oh, ow] views of the padded input under each kernel tap."""
    taps = [[xp[:, :, i * dh:i * dh + sh * (oh - 1) + 1:sh, j * dw:j * dw + sw * (ow - 1) + 1:sw]
             for j in range(kw)] for i in range(kh)]
    return np.stack([np.stack(row, axis=2) for row in taps], axis=2)


def _check_groups(node, cin, cout) -> None:
    """A group that does not divide the channels, or weights of another size, make a file that no
    runtime can run: refused with the node's name (MNN's resize refuses it too)."""
    c = params(node)["common"]
    group = c["group"] or 1
    if not (isinstance(cin, int) and isinstance(cout, int)):
        return
    if group < 1 or cin % group or cout % group:
        raise InvalidModel(f"{node.op} '{node.name}': group {group} does not divide {cin} input and {cout} "
                           "output channels")
    w = node.param.get("weight")
    want = cout * (cin // group) * c["kernelX"] * c["kernelY"]
    if w is not None and len(w) and np.size(w) != want:
        raise InvalidModel(f"{node.op} '{node.name}': {np.size(w)} weights, {want} expected")


@define("Convolution", "ConvolutionDepthwise", param="Convolution2D", inputs=("x", "weight?", "bias?"),
        kind="convolution", layout="NC4HW4", int8="weights")
class Convolution:
    """2-D convolution, NCHW; weight [outputCount, inputCount / group, kH, kW] and bias in the parameter
    table, or as the 2nd and 3rd inputs when they are computed at run time."""
    def infer(node, ins):
        c = params(node)["common"]
        n, cin, h, w = ins[0].shape
        *_, oh, ow = _geometry(c, h, w) if isinstance(h, int) and isinstance(w, int) else (None,) * 7 + (h, w)
        cout = c["outputCount"] or (ins[1].shape[0] if len(ins) > 1 else None)
        _check_groups(node, cin, cout)
        return [Val((n, cout, oh, ow), "float32")]

    def flops(node, ins, outs):
        c = params(node)["common"]
        cin = c["inputCount"] or (ins[0].shape[1] if ins[0].shape else 0)
        group = c["group"] or 1
        return 2 * numel(outs[0].shape) * (cin // group) * c["kernelX"] * c["kernelY"]

    def compute(node, xs):
        c = params(node)["common"]
        x = xs[0].astype(np.float32)
        n, cin, h, w = x.shape
        kh, kw, sh, sw, dh, dw, (t, l, b, r), oh, ow = _geometry(c, h, w)
        group = c["group"] or 1
        cout = c["outputCount"] or xs[1].shape[0]
        wt, bias = _weights(node, xs, (cout, cin // group, kh, kw))
        xp = np.pad(x, ((0, 0), (0, 0), (t, max(b, 0)), (l, max(r, 0))))
        win = _windows(xp, kh, kw, sh, sw, dh, dw, oh, ow)       # n, cin, kh, kw, oh, ow
        win = win.reshape(n, group, cin // group, kh, kw, oh, ow)
        wg = wt.reshape(group, cout // group, cin // group, kh, kw)
        out = np.einsum("ngckhyx,gockh->ngoyx", win, wg, optimize=True).reshape(n, cout, oh, ow)
        out = out + (bias.reshape(1, -1, 1, 1) if bias.size else 0)
        return _activate(c, out).astype(np.float32)


@define("Deconvolution", "DeconvolutionDepthwise", param="Convolution2D", inputs=("x", "weight?", "bias?"),
        kind="deconvolution", layout="NC4HW4")
class Deconvolution:
    """Transposed 2-D convolution; weight [inputCount, outputCount / group, kH, kW] (ONNX's layout);
    outPads adds rows and columns at the end."""
    def infer(node, ins):
        c = params(node)["common"]
        n, _, h, w = ins[0].shape
        t, l, b, r = pads_of(c)
        op = list(c.get("outPads") if c.get("outPads") is not None else [0, 0])

        def out(size, k, s, d, p0, p1, extra):
            if not isinstance(size, int):
                return size
            if c["padMode"] == "SAME":
                return size * s
            return (size - 1) * s - p0 - p1 + d * (k - 1) + 1 + extra
        oh = out(h, c["kernelY"], c["strideY"], c["dilateY"], t, b, int(op[0]))
        ow = out(w, c["kernelX"], c["strideX"], c["dilateX"], l, r, int(op[-1]))
        return [Val((n, c["outputCount"], oh, ow), "float32")]

    def flops(node, ins, outs):
        c = params(node)["common"]
        group = c["group"] or 1
        return 2 * numel(ins[0].shape) * (c["outputCount"] // group) * c["kernelX"] * c["kernelY"]

    def compute(node, xs):
        c = params(node)["common"]
        x = xs[0].astype(np.float32)
        n, cin, h, w = x.shape
        (_, cout, oh, ow), = [v.shape for v in Deconvolution.infer(node, [Val(x.shape)])]
        kh, kw = c["kernelY"], c["kernelX"]
        sh, sw = c["strideY"], c["strideX"]
        dh, dw = c["dilateY"], c["dilateX"]
        group = c["group"] or 1
        wt, bias = _weights(node, xs, (cin, cout // group, kh, kw))
        t, l, _, _ = pads_of(c)
        if c["padMode"] == "SAME":
            th, tw = (h - 1) * sh + (kh - 1) * dh + 1 - oh, (w - 1) * sw + (kw - 1) * dw + 1 - ow
            t, l = max(th, 0) // 2, max(tw, 0) // 2
        full_h, full_w = (h - 1) * sh + (kh - 1) * dh + 1, (w - 1) * sw + (kw - 1) * dw + 1
        canvas = np.zeros((n, cout, max(full_h, t + oh), max(full_w, l + ow)), np.float32)
        xg = x.reshape(n, group, cin // group, h, w)
        wg = wt.reshape(group, cin // group, cout // group, kh, kw)
        for i in range(kh):
            for j in range(kw):
                contrib = np.einsum("ngchw,gco->ngohw", xg, wg[:, :, :, i, j]).reshape(n, cout, h, w)
                canvas[:, :, i * dh:i * dh + sh * (h - 1) + 1:sh, j * dw:j * dw + sw * (w - 1) + 1:sw] += contrib
        out = canvas[:, :, t:t + oh, l:l + ow]
        out = out + (bias.reshape(1, -1, 1, 1) if bias.size else 0)
        return _activate(c, out).astype(np.float32)


def pool_param(kind: str, kernel=(1, 1), strides=(1, 1), pads=(0, 0, 0, 0), ceil: bool = False,
               count: str = "DEFAULT", pad_mode: str = "CAFFE", is_global: bool = False) -> dict:
    """MNN's Pool table, the one way every frontend spells it: kind MAXPOOL/AVEPOOL, (kH, kW), (sH, sW),
    pads (top, left, bottom, right), countType DEFAULT/INCLUDE_PADDING/EXCLUDE_PADDING."""
    t, l, b, r = (int(v) for v in pads)
    return {"isGlobal": bool(is_global), "type": kind, "kernelX": int(kernel[1]), "kernelY": int(kernel[0]),
            "strideX": int(strides[1]), "strideY": int(strides[0]), "padX": l, "padY": t, "pads": [t, l, b, r],
            "padType": pad_mode, "ceilModel": bool(ceil), "countType": count, "dataType": "DT_FLOAT"}


def pool_out(size, k, s, p0, p1, mode, ceil):
    if not isinstance(size, int):
        return size
    if mode == "SAME":
        return -(-size // s)
    if mode == "VALID":
        return (size - k) // s + 1
    span = (size + p0 + p1 - k) / s
    out = int(math.ceil(span) if ceil else math.floor(span)) + 1
    if ceil and (out - 1) * s >= size + p0:    # the last window must start inside the input or the begin pad
        out -= 1
    return out


@define("Pooling", param="Pool", kind="pooling", layout="NC4HW4", int8="values", spreads_grid=True)
class Pooling:
    """Max or average pooling, NCHW; countType says whether padding counts in the average."""
    def infer(node, ins):
        p = params(node)
        n, c, h, w = ins[0].shape
        if p["isGlobal"]:
            return [Val((n, c, 1, 1), ins[0].dtype)]
        t, l, b, r = pads_of(p)
        mode, ceil = p["padType"], p["ceilModel"]
        return [Val((n, c, pool_out(h, p["kernelY"], p["strideY"], t, b, mode, ceil),
                     pool_out(w, p["kernelX"], p["strideX"], l, r, mode, ceil)), ins[0].dtype)]

    def flops(node, ins, outs):
        return numel(ins[0].shape)

    def compute(node, xs):
        p = params(node)
        x = xs[0]
        is_max = p["type"] == "MAXPOOL"
        if p["isGlobal"]:
            return (x.max(axis=(2, 3), keepdims=True) if is_max else x.mean(axis=(2, 3), keepdims=True)).astype(x.dtype)
        n, c, h, w = x.shape
        (_, _, oh, ow), = [v.shape for v in Pooling.infer(node, [Val(x.shape, str(x.dtype))])]
        kh, kw, sh, sw = p["kernelY"], p["kernelX"], p["strideY"], p["strideX"]
        t, l, b, r = pads_of(p)
        if p["padType"] == "SAME":
            (t, b), (l, r) = same_pads(h, oh, kh, sh, 1), same_pads(w, ow, kw, sw, 1)
        elif p["padType"] == "VALID":
            t = l = b = r = 0
        eh, ew = max((oh - 1) * sh + kh - h - t, 0), max((ow - 1) * sw + kw - w - l, 0)
        fill = -np.inf if is_max else 0.0
        xp = np.pad(x.astype(np.float32), ((0, 0), (0, 0), (t, eh), (l, ew)), constant_values=fill)
        win = _windows(xp, kh, kw, sh, sw, 1, 1, oh, ow)
        if is_max:
            return win.max(axis=(2, 3)).astype(x.dtype)
        count = p["countType"]
        include = count == "INCLUDE_PADDING" or (count == "DEFAULT" and p["padType"] == "CAFFE")
        ys, xs_ = np.arange(oh) * sh - t, np.arange(ow) * sw - l
        if include:
            hy, wx = np.minimum(ys + kh, h + b) - ys, np.minimum(xs_ + kw, w + r) - xs_
        else:
            hy = np.minimum(ys + kh, h) - np.maximum(ys, 0)
            wx = np.minimum(xs_ + kw, w) - np.maximum(xs_, 0)
        return (win.sum(axis=(2, 3)) / np.maximum(np.outer(hy, wx), 1)).astype(x.dtype)


@define("Pooling3D", param="Pool3D", kind="pooling")
class Pooling3D:
    """MNN's converter writes ONNX GlobalAveragePool as a global Pooling3D."""
    def infer(node, ins):
        if not params(node)["isGlobal"]:
            raise ValueError("only global Pooling3D is inferred")
        return [Val(tuple(ins[0].shape[:2]) + (1,) * (len(ins[0].shape) - 2), ins[0].dtype)]

    def flops(node, ins, outs):
        return numel(ins[0].shape)

    def compute(node, xs):
        axes = tuple(range(2, xs[0].ndim))
        fn = np.max if params(node)["type"] == "MAXPOOL" else np.mean
        return fn(xs[0], axis=axes, keepdims=True).astype(xs[0].dtype)


def reduce_axes(node, ins_or_xs, rank):
    dims = node.param.get("dim")
    if (dims is None or len(dims) == 0) and len(ins_or_xs) > 1:
        v = ins_or_xs[1]
        dims = v.value if isinstance(v, Val) else v
        if dims is None:
            raise ValueError("axes computed at run time")
        dims = ints(dims)
    if dims is None or len(dims) == 0:
        return list(range(rank))
    return sorted({int(d) % rank for d in dims})


REDUCE = {"SUM": np.sum, "ASUM": lambda x, axis, keepdims: np.abs(x).sum(axis=axis, keepdims=keepdims),
          "SUMSQ": lambda x, axis, keepdims: np.square(x).sum(axis=axis, keepdims=keepdims),
          "MEAN": np.mean, "MAXIMUM": np.max, "MINIMUM": np.min, "PROD": np.prod,
          "ANY": np.any, "ALL": np.all}


@define("Reduction", param="ReductionParam", inputs=("x", "axes?"), kind="reduction")
class Reduction:
    """operation over `dim` (or the axes input; every axis when empty), keeping them when keepDims."""
    def infer(node, ins):
        shape = ins[0].shape
        axes = reduce_axes(node, ins, len(shape))
        keep = params(node)["keepDims"]
        out = tuple(1 if i in axes else d for i, d in enumerate(shape) if keep or i not in axes)
        return [Val(out, ins[0].dtype)]

    def flops(node, ins, outs):
        return numel(ins[0].shape)

    def compute(node, xs):
        x = xs[0]
        axes = tuple(reduce_axes(node, xs, x.ndim))
        op = params(node)["operation"]
        keep = bool(params(node)["keepDims"])
        if x.size == 0 or any(x.shape[a] == 0 for a in axes):
            init = {"MAXIMUM": -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min,
                    "MINIMUM": np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).max,
                    "PROD": 1, "ALL": 1}.get(op, 0)
            shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape) if keep or i not in axes)
            return np.full(shape, init, x.dtype)
        acc = x.astype(np.float64) if x.dtype.kind == "f" else x
        out = REDUCE[op](acc, axis=axes, keepdims=keep)
        return np.asarray(out).astype(x.dtype)


def _matmul_shape(a, b, ta=False, tb=False):
    from .elementwise import broadcast
    a, b = list(a), list(b)
    if ta and len(a) > 1:
        a[-2], a[-1] = a[-1], a[-2]
    if tb and len(b) > 1:
        b[-2], b[-1] = b[-1], b[-2]
    a1, b1 = len(a) == 1, len(b) == 1
    if a1:
        a = [1] + a
    if b1:
        b = b + [1]
    batch = broadcast(tuple(a[:-2]), tuple(b[:-2]))
    return tuple(list(batch) + ([] if a1 else [a[-2]]) + ([] if b1 else [b[-1]]))


def _inner(node, ins):
    a = ins[0].shape
    k = a[-2] if params(node)["transposeA"] and len(a) > 1 else a[-1]
    return k if isinstance(k, int) else 1


def _matmul_value(node, xs):
    a, b = xs[0], xs[1]
    if params(node)["transposeA"] and a.ndim > 1:
        a = np.swapaxes(a, -1, -2)
    if params(node)["transposeB"] and b.ndim > 1:
        b = np.swapaxes(b, -1, -2)
    out = np.matmul(a.astype(np.float64) if a.dtype.kind == "f" else a, b.astype(np.float64) if b.dtype.kind == "f" else b)
    if len(xs) > 2 and xs[2] is not None:
        out = out + xs[2]
    return out.astype(np.result_type(xs[0].dtype, xs[1].dtype))


@define("MatMul", param="MatMul", inputs=("a", "b", "bias?"), kind="matmul")
class MatMul:
    """numpy matmul semantics (1-D operands, broadcast batches), with transposeA/transposeB."""
    def infer(node, ins):
        return [Val(_matmul_shape(ins[0].shape, ins[1].shape, params(node)["transposeA"],
                                  params(node)["transposeB"]), ins[0].dtype)]

    def flops(node, ins, outs):
        return 2 * numel(outs[0].shape) * _inner(node, ins)

    compute = _matmul_value


@define("BatchMatMul", param="BatchMatMulParam", inputs=("a", "b"), kind="matmul")
class BatchMatMul:
    """MatMul over leading batch dims; adjX/adjY transpose the operands."""
    def infer(node, ins):
        return [Val(_matmul_shape(ins[0].shape, ins[1].shape, params(node)["adjX"], params(node)["adjY"]),
                    ins[0].dtype)]

    def flops(node, ins, outs):
        a = ins[0].shape
        k = a[-2] if params(node)["adjX"] else a[-1]
        return 2 * numel(outs[0].shape) * (k if isinstance(k, int) else 1)

    def compute(node, xs):
        a, b = xs
        if params(node)["adjX"]:
            a = np.swapaxes(a, -1, -2)
        if params(node)["adjY"]:
            b = np.swapaxes(b, -1, -2)
        return np.matmul(a, b)


@define("Interp", param="Interp", inputs=("x", "scales_or_size?"), kind="sampling", layout="NC4HW4", grows=True,
        spreads_grid=True)
class Interp:
    """Resize of the last two axes: outputHeight/Width or scales; resizeType 1 nearest (floor),
    2 bilinear, 3 cubic, 4 nearest (round); ctm the coordinate transformation."""
    def infer(node, ins):
        n, c, h, w = ins[0].shape
        p = params(node)
        if p["outputHeight"] and p["outputWidth"]:
            return [Val((n, c, p["outputHeight"], p["outputWidth"]), ins[0].dtype)]
        if len(ins) > 1:
            v = ins[1].value
            if v is None:
                raise ValueError("output size computed at run time")
            v = np.asarray(v).reshape(-1)
            if ins[1].dtype.startswith("float"):   # scales for N, C, H, W
                return [Val((n, c, int(math.floor(h * float(v[-2]))), int(math.floor(w * float(v[-1])))), ins[0].dtype)]
            return [Val((n, c, int(v[-2]), int(v[-1])), ins[0].dtype)]
        hs, ws = p["heightScale"] or 1.0, p["widthScale"] or 1.0
        return [Val((n, c, int(h * hs), int(w * ws)), ins[0].dtype)]

    def flops(node, ins, outs):
        return 4 * numel(outs[0].shape)

    def compute(node, xs):
        from .resize import interp
        (shape,) = [v.shape for v in Interp.infer(node, [Val(xs[0].shape, str(xs[0].dtype))] +
                                                  [Val(np.shape(v), str(np.asarray(v).dtype), v) for v in xs[1:]])]
        return interp(params(node), xs[0], shape[2], shape[3])
