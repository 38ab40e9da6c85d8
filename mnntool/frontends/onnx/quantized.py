"""ONNX quantization ops -> float IR: DequantizeLinear as (x - zero point) * scale, QuantizeLinear as a
half-to-even rounding of x / scale plus the zero point, clamped to the type's range, and the QLinear /
Integer ops as their float equivalents between those. QDQ models from other quantizers convert and
compute in float (integer values are exact in float32 up to 2^24); the result is carried as int32."""
from __future__ import annotations

import numpy as np

from ...errors import MnnToolError
from .math import binary, round_half_even
from .registry import converts

RANGES = {"uint8": (0, 255), "int8": (-128, 127), "uint16": (0, 65535), "int16": (-32768, 32767),
          "int32": (-2**31, 2**31 - 1), "uint4": (0, 15), "int4": (-8, 7), "uint2": (0, 3), "int2": (-2, 1)}


def _opt(node, k):
    return node.input[k] if len(node.input) > k and node.input[k] else None


def _aligned(ctx, node, name, x, axis, block, tag):
    """A scale or zero point shaped to broadcast against x: per-tensor as is, per-axis as [C, 1, ...],
    blocked repeated block_size times along the axis (constants only)."""
    v = ctx.const(name)
    rank = ctx.rank(x)
    if v is None:
        if np.prod(ctx.shape(name) or (1,)) == 1 or rank is None:
            return name
        if block:
            raise MnnToolError(f"{ctx.path}: {node.op_type} '{node.name}': blocked quantization needs constant parameters")
        r = ctx.tmp(f"{node.name}_{tag}_r")
        ctx.emit("Reshape", [name, ctx.int_const(f"{node.name}_{tag}_shape", [-1] + [1] * (rank - 1 - axis % rank))],
                 [r], {"dimType": "NCHW"}, r)
        return r
    v = np.asarray(v, np.float32)
    if v.size == 1:
        return ctx.float_const(f"{node.name}_{tag}", v.reshape(()))
    if rank is None:
        raise MnnToolError(f"{ctx.path}: {node.op_type} '{node.name}': per-axis parameters need the input's rank")
    axis %= rank
    if block:
        shape = ctx.shape(x)
        v = np.repeat(v, block, axis=axis)
        if shape is not None and isinstance(shape[axis], int):
            v = np.take(v, np.arange(shape[axis]), axis=axis)
        return ctx.float_const(f"{node.name}_{tag}", v)
    return ctx.float_const(f"{node.name}_{tag}", v.reshape((-1,) + (1,) * (rank - 1 - axis)))


def _as_float(ctx, name, out):
    ctx.emit("Cast", [name], [out], {"dstT": "DT_FLOAT"}, out)
    return out


def _zero_point(ctx, node, zp, x, axis, block, out):
    """The zero point aligned with x, as float."""
    z = _aligned(ctx, node, zp, x, axis, block, "zp")
    return _as_float(ctx, z, ctx.tmp(out + "_zpf")) if ctx.const(zp) is None else z


def dequantize(ctx, node, x, scale, zp, out, axis=1, block=0):
    xf = _as_float(ctx, x, ctx.tmp(out + "_xf"))
    s = _aligned(ctx, node, scale, x, axis, block, "scale")
    if zp is not None:
        z = _zero_point(ctx, node, zp, x, axis, block, out)
        centred = ctx.tmp(out + "_centred")
        binary(ctx, xf, z, centred, "SUB", centred)
        xf = centred
    binary(ctx, xf, s, out, "MUL", out)


def quantize(ctx, node, x, scale, zp, out, qtype, axis=1, block=0, saturate=True):
    lo, hi = RANGES[qtype]
    s = _aligned(ctx, node, scale, x, axis, block, "scale")
    div, rounded = ctx.tmp(out + "_div"), ctx.tmp(out + "_round")
    binary(ctx, x, s, div, "REALDIV", div)
    round_half_even(ctx, div, rounded, out + "_round")
    shifted = rounded
    if zp is not None:
        z = _zero_point(ctx, node, zp, x, axis, block, out)
        shifted = ctx.tmp(out + "_shift")
        binary(ctx, rounded, z, shifted, "ADD", shifted)
    lo_t, clamped = ctx.tmp(out + "_lo"), ctx.tmp(out + "_clamp")
    binary(ctx, shifted, ctx.float_const(out + "_min", float(lo)), lo_t, "MAXIMUM", lo_t)
    binary(ctx, lo_t, ctx.float_const(out + "_max", float(hi)), clamped, "MINIMUM", clamped)
    ctx.g.info(out).dtype = "int32"
    ctx.emit("Cast", [clamped], [out], {"dstT": "DT_INT32"}, out)


def _qtype(ctx, node, a, zp):
    if "output_dtype" in a and int(a["output_dtype"]):
        from .tensor import ONNX_DTYPES
        t = ONNX_DTYPES.get(int(a["output_dtype"]))
    elif zp is not None:
        t = ctx.dtype(zp)
    else:
        t = "uint8"
    if t not in RANGES:
        raise MnnToolError(f"{ctx.path}: {node.op_type} '{node.name}': quantized type {t} is not supported")
    return t


@converts("DequantizeLinear")
def dequantize_linear(ctx, node, a):
    if ctx.dtype(node.input[0]).startswith("float"):
        raise MnnToolError(f"{ctx.path}: DequantizeLinear '{node.name}': float8/float4 inputs are not supported")
    dequantize(ctx, node, node.input[0], node.input[1], _opt(node, 2), node.output[0], int(a.get("axis", 1)),
               int(a.get("block_size", 0)))


@converts("QuantizeLinear")
def quantize_linear(ctx, node, a):
    zp = _opt(node, 2)
    quantize(ctx, node, node.input[0], node.input[1], zp, node.output[0], _qtype(ctx, node, a, zp),
             int(a.get("axis", 1)), int(a.get("block_size", 0)))


@converts("DynamicQuantizeLinear")
def dynamic_quantize_linear(ctx, node, a):
    """uint8 scale and zero point from the tensor's range (which always includes 0), then QuantizeLinear."""
    x, (y, scale, zp) = node.input[0], node.output[:3]
    name = node.name
    mx, mn, mx0, mn0, span = (ctx.tmp(f"{y}_{k}") for k in ("max", "min", "max0", "min0", "span"))
    ctx.emit("Reduction", [x], [mx], {"operation": "MAXIMUM", "dim": list(range(ctx.rank(x) or 1)), "keepDims": False},
             name + "_max")
    ctx.emit("Reduction", [x], [mn], {"operation": "MINIMUM", "dim": list(range(ctx.rank(x) or 1)), "keepDims": False},
             name + "_min")
    zero = ctx.float_const(name + "_zero", 0.0)
    binary(ctx, mx, zero, mx0, "MAXIMUM", mx0)
    binary(ctx, mn, zero, mn0, "MINIMUM", mn0)
    binary(ctx, mx0, mn0, span, "SUB", span)
    binary(ctx, span, ctx.float_const(name + "_255", 255.0), scale, "REALDIV", scale)
    neg, zr, zc, zf = (ctx.tmp(f"{y}_{k}") for k in ("neg", "zr", "zc", "zf"))
    binary(ctx, zero, mn0, neg, "SUB", neg)
    binary(ctx, neg, scale, zf, "REALDIV", zf)
    round_half_even(ctx, zf, zr, y + "_zround")
    binary(ctx, zr, ctx.float_const(name + "_0", 0.0), zc, "MAXIMUM", zc)
    zcl = ctx.tmp(f"{y}_zcl")
    binary(ctx, zc, ctx.float_const(name + "_255b", 255.0), zcl, "MINIMUM", zcl)
    ctx.g.info(zp).dtype = "int32"
    ctx.emit("Cast", [zcl], [zp], {"dstT": "DT_INT32"}, zp)
    quantize(ctx, node, x, scale, zcl, y, "uint8")


@converts("MatMulInteger")
def matmul_integer(ctx, node, a):
    """(A - a_zero) @ (B - b_zero) in float (exact below 2^24), as int32."""
    ins = []
    for k, (v, zp) in enumerate(((node.input[0], _opt(node, 2)), (node.input[1], _opt(node, 3)))):
        f = _as_float(ctx, v, ctx.tmp(f"{node.output[0]}_f{k}"))
        if zp is not None:
            z = _aligned(ctx, node, zp, v, 1 if k else 0, 0, f"zp{k}") if k else _aligned(ctx, node, zp, v, -1, 0, "zp0")
            if ctx.const(zp) is None:
                z = _as_float(ctx, z, ctx.tmp(f"{node.output[0]}_zf{k}"))
            c = ctx.tmp(f"{node.output[0]}_c{k}")
            binary(ctx, f, z, c, "SUB", c)
            f = c
        ins.append(f)
    mm = ctx.tmp(node.output[0] + "_mm")
    ctx.emit("MatMul", ins, [mm], {"T": "DT_FLOAT", "transposeA": False, "transposeB": False}, mm)
    ctx.g.info(node.output[0]).dtype = "int32"
    ctx.emit("Cast", [mm], [node.output[0]], {"dstT": "DT_INT32"}, node.name)


@converts("QLinearMatMul")
def qlinear_matmul(ctx, node, a):
    a_, a_s, a_z, b_, b_s, b_z, y_s, y_z = node.input[:8]
    out = node.output[0]
    af, bf, yf = (ctx.tmp(f"{out}_{k}") for k in ("af", "bf", "yf"))
    dequantize(ctx, node, a_, a_s, a_z, af, axis=-1)
    dequantize(ctx, node, b_, b_s, b_z, bf, axis=-1)
    ctx.emit("MatMul", [af, bf], [yf], {"T": "DT_FLOAT", "transposeA": False, "transposeB": False}, yf)
    quantize(ctx, node, yf, y_s, y_z, out, _qtype(ctx, node, {}, y_z), axis=-1)


@converts("QLinearConv", "ConvInteger")
def qlinear_conv(ctx, node, a):
    """Dequantize input and weights, convolve in float (bias as int32 x input scale x weight scale), and
    requantize (QLinearConv) or cast to int32 (ConvInteger)."""
    import onnx
    from .registry import CONVERTERS
    out = node.output[0]
    if node.op_type == "QLinearConv":
        x, xs, xz, w, ws, wz, ys, yz = node.input[:8]
        b = _opt(node, 8)
    else:
        x, w = node.input[:2]
        xz, wz = _opt(node, 2), _opt(node, 3)
        xs = ws = None
    xf, wf = ctx.tmp(out + "_xf"), ctx.tmp(out + "_wf")
    one = ctx.float_const(node.name + "_one", 1.0)
    dequantize(ctx, node, x, xs or one, xz, xf, axis=1)
    dequantize(ctx, node, w, ws or one, wz, wf, axis=0)
    ins = [xf, wf]
    if node.op_type == "QLinearConv" and b is not None:
        bv, xsv, wsv = ctx.const(b), ctx.const(xs), ctx.const(ws)
        if bv is not None and xsv is not None and wsv is not None:
            ins.append(ctx.float_const(node.name + "_bias", np.asarray(bv, np.float64) * np.asarray(xsv) * np.asarray(wsv)))
        else:       # the int32 bias on the accumulator's grid: bias x input scale x weight scale, at run time
            bf, bxs, bias = ctx.tmp(out + "_bf"), ctx.tmp(out + "_bxs"), ctx.tmp(out + "_bias")
            _as_float(ctx, b, bf)
            binary(ctx, bf, xs, bxs, "MUL", bxs)
            binary(ctx, bxs, ws, bias, "MUL", bias)
            ins.append(bias)
    # fold the dequantized weights to a constant where they are one (then the convolution is a normal one)
    from ...passes.constant_fold import ConstantFoldPass
    ConstantFoldPass()(ctx.g)
    conv_node = onnx.helper.make_node("Conv", ins, [out + "_yf" if node.op_type == "QLinearConv" else out + "_yfi"],
                                      name=node.name + "_conv")
    conv_node.attribute.extend(node.attribute)
    for t in ins:
        ctx.shapes.setdefault(t, ctx.shape(x) if t == xf else (ctx.shape(w) if t == wf else None))
        ctx.dtypes[t] = "float32"
    CONVERTERS["Conv"](ctx, conv_node, {at.name: onnx.helper.get_attribute_value(at) for at in node.attribute})
    if node.op_type == "QLinearConv":
        quantize(ctx, node, conv_node.output[0], ys, yz, out, _qtype(ctx, node, {}, yz), axis=1)
    else:
        ctx.g.info(out).dtype = "int32"
        ctx.emit("Cast", [conv_node.output[0]], [out], {"dstT": "DT_INT32"}, node.name)
