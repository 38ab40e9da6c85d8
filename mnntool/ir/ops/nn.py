"""Ops with arithmetic-heavy kernels: convolutions, pooling, matmul, reductions, resize."""
from __future__ import annotations

import math

from . import Val, numel, register


def _pads(common: dict):
    """(top, left, bottom, right) from MNN's `pads` (begin dims then end dims) or padX/padY."""
    pads = common.get("pads")
    if pads is not None and len(pads) == 4:
        return int(pads[0]), int(pads[1]), int(pads[2]), int(pads[3])
    py, px = int(common.get("padY", 0)), int(common.get("padX", 0))
    return py, px, py, px


def conv_out(size, k, s, d, p0, p1, mode="CAFFE"):
    if not isinstance(size, int):
        return size
    if mode == "SAME":
        return -(-size // s)
    if mode == "VALID":
        return (size - d * (k - 1) - 1) // s + 1
    return (size + p0 + p1 - d * (k - 1) - 1) // s + 1


def _conv(node, ins):
    c = node.param["common"]
    n, _, h, w = ins[0].shape
    t, l, b, r = _pads(c)
    mode = c.get("padMode", "CAFFE")
    oh = conv_out(h, c.get("kernelY", 1), c.get("strideY", 1), c.get("dilateY", 1), t, b, mode)
    ow = conv_out(w, c.get("kernelX", 1), c.get("strideX", 1), c.get("dilateX", 1), l, r, mode)
    return [Val((n, c["outputCount"], oh, ow), "float32")]


def _conv_flops(node, ins, outs):
    c = node.param["common"]
    cin = c.get("inputCount") or (ins[0].shape[1] if ins[0].shape else 0)
    group = c.get("group", 1) or 1
    return 2 * numel(outs[0].shape) * (cin // group) * c.get("kernelX", 1) * c.get("kernelY", 1)


def _deconv(node, ins):
    c = node.param["common"]
    n, _, h, w = ins[0].shape
    t, l, b, r = _pads(c)
    op = list(c.get("outPads") if c.get("outPads") is not None else [0, 0])

    def out(size, k, s, d, p0, p1, extra):
        if not isinstance(size, int):
            return size
        if c.get("padMode") == "SAME":
            return size * s
        return (size - 1) * s - p0 - p1 + d * (k - 1) + 1 + extra
    oh = out(h, c.get("kernelY", 1), c.get("strideY", 1), c.get("dilateY", 1), t, b, int(op[0]))
    ow = out(w, c.get("kernelX", 1), c.get("strideX", 1), c.get("dilateX", 1), l, r, int(op[-1]))
    return [Val((n, c["outputCount"], oh, ow), "float32")]


def _deconv_flops(node, ins, outs):
    c = node.param["common"]
    group = c.get("group", 1) or 1
    return 2 * numel(ins[0].shape) * (c["outputCount"] // group) * c.get("kernelX", 1) * c.get("kernelY", 1)


for _name in ("Convolution", "ConvolutionDepthwise"):
    register(_name, "Convolution2D", flops=_conv_flops)(_conv)
for _name in ("Deconvolution", "DeconvolutionDepthwise"):
    register(_name, "Convolution2D", flops=_deconv_flops)(_deconv)


@register("Pooling", "Pool", flops=lambda node, ins, outs: numel(ins[0].shape))
def _pool(node, ins):
    p = node.param
    n, c, h, w = ins[0].shape
    if p.get("isGlobal"):
        return [Val((n, c, 1, 1), ins[0].dtype)]
    t, l, b, r = _pads(p)
    mode = p.get("padType", "CAFFE")

    def out(size, k, s, p0, p1):
        if not isinstance(size, int):
            return size
        if mode == "SAME":
            return -(-size // s)
        if mode == "VALID":
            return (size - k) // s + 1
        span = (size + p0 + p1 - k) / s
        return int(math.ceil(span) if p.get("ceilModel", True) else math.floor(span)) + 1
    return [Val((n, c, out(h, p["kernelY"], p["strideY"], t, b), out(w, p["kernelX"], p["strideX"], l, r)),
                ins[0].dtype)]


def _axes(node, ins, rank):
    dims = node.param.get("dim")
    if dims is None and len(ins) > 1:
        dims = ins[1].value
    if dims is None or len(dims) == 0:
        return list(range(rank))
    return sorted(int(d) % rank for d in dims)


@register("Reduction", "ReductionParam", flops=lambda node, ins, outs: numel(ins[0].shape))
def _reduction(node, ins):
    shape = ins[0].shape
    axes = _axes(node, ins, len(shape))
    keep = node.param.get("keepDims", False)
    out = tuple(1 if i in axes else d for i, d in enumerate(shape) if keep or i not in axes)
    return [Val(out, ins[0].dtype)]


@register("MatMul", "MatMul", flops=lambda node, ins, outs: 2 * numel(outs[0].shape) * _inner(node, ins))
def _matmul(node, ins):
    from .elementwise import broadcast
    a, b = list(ins[0].shape), list(ins[1].shape)
    if node.param.get("transposeA"):
        a[-2], a[-1] = a[-1], a[-2]
    if node.param.get("transposeB"):
        b[-2], b[-1] = b[-1], b[-2]
    a1, b1 = len(a) == 1, len(b) == 1
    if a1:
        a = [1] + a
    if b1:
        b = b + [1]
    batch = broadcast(tuple(a[:-2]), tuple(b[:-2]))
    out = list(batch) + ([] if a1 else [a[-2]]) + ([] if b1 else [b[-1]])
    return [Val(tuple(out), ins[0].dtype)]


def _inner(node, ins):
    a = ins[0].shape
    k = a[-2] if node.param.get("transposeA") and len(a) > 1 else a[-1]
    return k if isinstance(k, int) else 1


@register("Interp", "Interp", flops=lambda node, ins, outs: 4 * numel(outs[0].shape))
def _interp(node, ins):
    n, c, h, w = ins[0].shape
    p = node.param
    if p.get("outputHeight") and p.get("outputWidth"):
        return [Val((n, c, p["outputHeight"], p["outputWidth"]), ins[0].dtype)]
    if len(ins) > 1 and ins[1].value is not None:
        v = ins[1].value
        if ins[1].dtype.startswith("float"):   # scales for N, C, H, W
            return [Val((n, c, int(math.floor(h * float(v[2]))), int(math.floor(w * float(v[3])))), ins[0].dtype)]
        return [Val((n, c, int(v[-2]), int(v[-1])), ins[0].dtype)]
    hs, ws = p.get("heightScale") or 1.0, p.get("widthScale") or 1.0
    return [Val((n, c, int(h * hs), int(w * ws)), ins[0].dtype)]


@register("Pooling3D", "Pool3D", flops=lambda node, ins, outs: numel(ins[0].shape))
def _pool3d(node, ins):
    """MNN's converter writes ONNX GlobalAveragePool as a global Pooling3D."""
    if not node.param.get("isGlobal"):
        raise ValueError("only global Pooling3D is inferred")
    return [Val(tuple(ins[0].shape[:2]) + (1,) * (len(ins[0].shape) - 2), ins[0].dtype)]
