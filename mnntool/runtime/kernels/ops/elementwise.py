"""Elementwise kernels: activations, unary and binary math, select, cast."""
from __future__ import annotations

import math

import numpy as np
from ..compile.jit import Bound, njit, prange

from ....ir.ops import params
from .. import PLAN_ONLY, by_definition, kernel, returns, sized, writes
from . import mnn_math
from ....ir.ops.elementwise import COMPARE as COMPARE_OPS, operand_dtypes
from ..micro.exp_erf import EXP_FLOOR, erf32, exp_poly, exp_split


# the transcendental activations numpy lacks, as one compiled loop per kind over flat float32 arrays. Plain
# cached functions, not Numba ufuncs: a ufunc builds its wrapper at every import (35 ms each), which
# start-up paid for every model
ACTIVATION_KINDS = {"ERF": 0, "SIGMOID": 1, "GELU_STANDARD": 2, "GELU": 3, "HARDSWISH": 4, "SILU": 5}


@njit(cache=True)
def activation_flat(x, out, kind):
    n = x.shape[0]
    if kind == 0:
        for i in range(n):
            out[i] = math.erf(x[i])
    elif kind == 1:
        for i in range(n):
            v = x[i]
            out[i] = 1.0 / (1.0 + math.exp(-v)) if v >= 0 else math.exp(v) / (1.0 + math.exp(v))
    elif kind == 2:
        for i in range(n):
            out[i] = 0.5 * x[i] * (1.0 + math.erf(x[i] * 0.7071067811865476))
    elif kind == 3:
        for i in range(n):
            v = x[i]
            out[i] = 0.5 * v * (1.0 + math.tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)))
    elif kind == 4:
        for i in range(n):
            out[i] = x[i] * min(max(x[i] + 3.0, 0.0), 6.0) / 6.0
    else:
        for i in range(n):
            out[i] = x[i] / (1.0 + math.exp(-x[i]))


def _activation(name):
    kind = ACTIVATION_KINDS[name]

    def apply(x, out=None):
        x = np.ascontiguousarray(x, np.float32)
        res = np.empty_like(x) if out is None or not out.flags.c_contiguous else out
        activation_flat(x.reshape(-1), res.reshape(-1), kind)
        if out is not None and res is not out:
            out[...] = res
        return res if out is None else out
    return apply


_erf, _sigmoid, _gelu_erf, _gelu_tanh, _hardswish, _silu = (
    _activation(k) for k in ("ERF", "SIGMOID", "GELU_STANDARD", "GELU", "HARDSWISH", "SILU"))


ERF_CHUNK = 4096


@njit(parallel=True, cache=True, fastmath=True)
def erf_flat(x, out, gelu):
    """out = erf(x), or GELU's 0.5 x (1 + erf(x / sqrt 2)) when gelu, over flat float32 arrays."""
    n = x.shape[0]
    half, root = np.float32(0.5), np.float32(0.7071067811865476)
    for c in prange((n + ERF_CHUNK - 1) // ERF_CHUNK):
        # slices from the chunk's start: indices are then the loop variable, which Numba knows is not
        # negative, so it drops its wrap-around select and LLVM vectorizes (1.95 -> 0.43 ns an element)
        lo, hi = c * ERF_CHUNK, min(n, (c + 1) * ERF_CHUNK)
        src, dst = x[lo:hi], out[lo:hi]
        if gelu:
            for i in range(src.shape[0]):
                v = src[i]
                dst[i] = half * v * (np.float32(1) + erf32(v * root))
        else:
            for i in range(src.shape[0]):
                dst[i] = erf32(src[i])


@njit(parallel=True, cache=True, fastmath=True)
def gelu_tanh_flat(x, out):
    """GELU's tanh form as MNN computes it (MNNGeluCommon): tanh as the rational x (135135 + 17325 x^2 +
    378 x^4 + x^6) / (135135 + 62370 x^2 + 3150 x^4 + 28 x^6), +-1 beyond +-5. No exp or libm call, so
    LLVM vectorizes it (math.tanh per element made pvt_v2_b0's six GELUs 57% of its run)."""
    n = x.shape[0]
    one, half = np.float32(1), np.float32(0.5)
    for c in prange((n + ERF_CHUNK - 1) // ERF_CHUNK):
        lo, hi = c * ERF_CHUNK, min(n, (c + 1) * ERF_CHUNK)
        src, dst = x[lo:hi], out[lo:hi]
        for i in range(src.shape[0]):
            v = src[i]
            t = np.float32(0.79788458) * (np.float32(0.044715) * v * v * v + v)
            t = min(max(t, np.float32(-5)), np.float32(5))
            t2 = t * t
            a = t * (np.float32(135135) + t2 * (np.float32(17325) + t2 * (np.float32(378) + t2)))
            b = np.float32(135135) + t2 * (np.float32(62370) + t2 * (np.float32(3150) + t2 * np.float32(28)))
            th = min(max(a / b, -one), one)
            dst[i] = (one + th) * v * half


def _gelu_tanh_kernel(size: int, threads: int):
    fn = sized(gelu_tanh_flat, size * 16, threads)
    return writes(lambda i, o: fn(np.ascontiguousarray(i[0]).reshape(-1), o[0].reshape(-1)))


def _erf_kernel(size: int, gelu: bool, threads: int):
    fn = sized(erf_flat, size * 16, threads)     # ~16 operations an element
    return writes(lambda i, o: fn(np.ascontiguousarray(i[0]).reshape(-1), o[0].reshape(-1), gelu))


def _round_away(x, out):
    """MNN's ROUND: halves away from zero."""
    np.abs(x, out=out)
    out += np.float32(0.5)
    np.floor(out, out=out)
    np.copysign(out, x, out=out)


def _rsqrt(x, out):
    np.sqrt(x, out=out)
    np.reciprocal(out, out=out)


UNARY = {
    "ABS": np.abs, "NEG": np.negative, "FLOOR": np.floor, "CEIL": np.ceil, "SQUARE": np.square, "SQRT": np.sqrt,
    "RSQRT": _rsqrt, "EXP": np.exp, "LOG": np.log, "SIN": np.sin, "COS": np.cos, "TAN": np.tan,
    "ASIN": np.arcsin, "ACOS": np.arccos, "ATAN": np.arctan, "RECIPROCAL": np.reciprocal, "LOG1P": np.log1p,
    "SINH": np.sinh, "COSH": np.cosh, "ASINH": np.arcsinh, "ACOSH": np.arccosh, "ATANH": np.arctanh,
    "SIGN": np.sign, "ROUND": _round_away, "EXPM1": np.expm1, "BNLL": lambda x, out=None: np.logaddexp(0, x, out=out), "TANH": np.tanh, "SIGMOID": _sigmoid, "ERF": _erf,
    "HARDSWISH": _hardswish, "GELU": _gelu_tanh, "GELU_STANDARD": _gelu_erf, "SILU": _silu,
}


def _div(a, b, out):
    if np.issubdtype(out.dtype, np.integer):
        np.floor_divide(a, b, out=out)
    else:
        np.true_divide(a, b, out=out)


def _sqdiff(a, b, out):
    np.subtract(a, b, out=out)
    np.square(out, out=out)


FLOAT_BINARY = {
    "ADD": np.add, "SUB": np.subtract, "MUL": np.multiply, "REALDIV": _div, "DIV": _div, "POW": np.power,
    "MAXIMUM": np.maximum, "MINIMUM": np.minimum, "MAX_TEMP": np.maximum, "MIN_TEMP": np.minimum,
    "EQUAL": np.equal, "NOTEQUAL": np.not_equal, "GREATER": np.greater, "GREATER_EQUAL": np.greater_equal,
    "LESS": np.less, "LESS_EQUAL": np.less_equal, "FLOORDIV": np.floor_divide, "FLOORMOD": np.mod, "MOD": np.fmod,
    "SquaredDifference": _sqdiff, "ATAN2": np.arctan2, "LOGICALOR": np.logical_or, "LOGICALXOR": np.logical_xor,
    "BITWISE_AND": np.bitwise_and, "BITWISE_OR": np.bitwise_or, "BITWISE_XOR": np.bitwise_xor,
}


def _unsupported(node, what):
    from ....errors import MnnToolError
    return MnnToolError(f"{node.op} '{node.name}': {what} is not supported by the runtime")


@njit(parallel=True, cache=True)
def clip_rows(x, step, lo, hi, out):
    """out (rows, n) = min(max(x, lo), hi), row r of x at x[r * step:r * step + n] (x flat: a contiguous array,
    step n, or a split's strided view, parallel_rows.row_span), NaN kept (as np.maximum / np.clip). One
    compiled call: in a run, where the kernels before have pushed NumPy's and the interpreter's code out of
    the caches and TLB, a ufunc call on 25K floats cost ~50 us (EfficientViT-B0's ReLUs on its attention's q/k
    splits; 3-20 us warm). Flat unsigned indices, no view a row (rows of 16 floats: 8.2 -> ~3 us)."""
    rows, n = out.shape
    of = out.reshape(-1)
    un, us = np.uint64(n), np.uint64(step)
    for r in prange(rows):
        xb, ob = np.uint64(r) * us, np.uint64(r) * un
        for j in range(un):
            v = x[xb + j]
            v = lo if v < lo else v
            of[ob + j] = hi if v > hi else v


def _clip_kernel(ins, outs, lo: float, hi: float, threads: int):
    """clip_rows over the last axis, or None for shapes/types it does not take."""
    shape = ins[0].shape
    if shape is None or len(shape) < 1 or not all(isinstance(d, int) for d in shape) or \
            ins[0].dtype != "float32" or outs[0].dtype != "float32" or not int(np.prod(shape)):
        return None
    from ..micro.parallel_rows import RowSpan
    last = shape[-1]
    rows = int(np.prod(shape)) // last
    fn = sized(clip_rows, int(np.prod(shape)), threads)
    lo, hi = np.float32(lo), np.float32(hi)
    span = RowSpan(rows, last)

    def run(i, o):
        y = o[0]
        # (a strided input view whose leading axes merge is read in place)
        if y.flags.c_contiguous and (xs := span(i[0])) is not None:
            fn(xs[0], xs[1], lo, hi, y.reshape(rows, last))
        else:                       # an output placed in a concat's slice, an input of another layout
            np.clip(i[0], lo, hi, out=y)
    return writes(run)


@kernel("ReLU")
def relu(node, ins, outs, settings):
    slope = float(node.param.get("slope", 0.0))
    if slope == 0.0:
        return _clip_kernel(ins, outs, 0.0, np.inf, settings.threads) or \
            writes(lambda i, o: np.maximum(i[0], 0, out=o[0]))

    from .parallel_steps import leaky as parallel_leaky      # threads, with the work for them
    if (par := parallel_leaky(ins[0].shape, slope, ins[0].dtype, settings.threads)) is not None:
        return writes(par)

    def leaky(i, o):
        np.multiply(i[0], slope, out=o[0])
        np.maximum(i[0], o[0], out=o[0]) if slope < 1 else np.minimum(i[0], o[0], out=o[0])
    return writes(leaky)


@kernel("ReLU6")
def relu6(node, ins, outs, settings):
    lo, hi = float(node.param.get("minValue", 0.0)), float(node.param.get("maxValue", 6.0))
    return _clip_kernel(ins, outs, lo, hi, settings.threads) or writes(lambda i, o: np.clip(i[0], lo, hi, out=o[0]))


@njit(cache=True, fastmath=True)
def sigmoid_flat(x, out):
    """The logistic function over flat arrays, stable for large |x|. A plain function: a Numba ufunc
    costs 1.8 us a call on a 64-wide LSTM gate, this 0.7 (small arrays; large ones: sigmoid_blocks)."""
    for i in range(x.shape[0]):
        v = x[i]
        if v >= 0:
            out[i] = np.float32(1) / (np.float32(1) + np.exp(-v))
        else:
            e = np.exp(v)
            out[i] = e / (np.float32(1) + e)


SIGMOID_BLOCK = 2048


@njit(parallel=True, cache=True, fastmath=True)
def sigmoid_blocks(x, out, times_x=False):
    """The logistic function in blocks, vectorized: e = exp(-|x|) as 2^k e^f (the softmax kernel's
    split, its 2^k written as bits into out first so both loops vectorize), then 1 / (1 + e) or
    e / (1 + e) by sign; times x when `times_x` (SiLU: one pass, no sigmoid tensor). Relative error
    ~1.2e-7 (the degree-6 polynomial)."""
    n = x.shape[0]
    for b in prange((n + SIGMOID_BLOCK - 1) // SIGMOID_BLOCK):
        lo = b * SIGMOID_BLOCK
        hi = min(lo + SIGMOID_BLOCK, n)
        src, dst = x[lo:hi], out[lo:hi]
        bits = dst.view(np.int32)
        for j in range(src.shape[0]):
            k, _ = exp_split(max(-abs(src[j]), EXP_FLOOR))
            bits[j] = (np.int32(k) + 127) << 23
        for j in range(src.shape[0]):
            v = src[j]
            _, f = exp_split(max(-abs(v), EXP_FLOOR))
            e = dst[j] * exp_poly(f)
            s = np.float32(1) / (np.float32(1) + e)
            r = s if v >= 0 else e * s
            dst[j] = v * r if times_x else r


def fused_silu(node, ins, outs, settings):
    exact = mnn_math.on_grid("FusedSiLU", ins, outs, settings.threads)
    if exact is not None:
        return exact
    size = _size(outs) or 0
    blocks = sized(sigmoid_blocks, size * 4, settings.threads)
    return writes(lambda i, o: blocks(np.ascontiguousarray(i[0], np.float32).reshape(-1), o[0].reshape(-1), True))


PLAN_ONLY["FusedSiLU"] = fused_silu


def _sigmoid_kernel(size: int | None = None, threads: int = 1):
    if size is None or size < 4 * SIGMOID_BLOCK:
        flat = Bound(sigmoid_flat)
        return writes(lambda i, o: flat(np.ascontiguousarray(i[0]).reshape(-1), o[0].reshape(-1)))
    blocks = sized(sigmoid_blocks, size * 4, threads)
    return writes(lambda i, o: blocks(np.ascontiguousarray(i[0]).reshape(-1), o[0].reshape(-1), False))


def _size(outs) -> int | None:
    shape = outs[0].shape if outs else None
    return int(np.prod(shape)) if shape is not None and all(isinstance(d, int) for d in shape) else None


@kernel("Sigmoid")
def sigmoid(node, ins, outs, settings):
    return mnn_math.on_grid("SIGMOID", ins, outs, settings.threads) or _sigmoid_kernel(_size(outs), settings.threads)


@kernel("TanH")
def tanh(node, ins, outs, settings):
    return writes(lambda i, o: np.tanh(i[0], out=o[0]))


@kernel("ELU")
def elu(node, ins, outs, settings):
    alpha = np.float32(params(node)["alpha"])

    def run(i, o):
        np.minimum(i[0], 0, out=o[0])
        np.expm1(o[0], out=o[0])
        np.multiply(o[0], alpha, out=o[0])
        np.copyto(o[0], i[0], where=i[0] > 0)
    return writes(run)


@kernel("PReLU")
def prelu(node, ins, outs, settings):
    slope = np.asarray(node.param["slope"], np.float32).reshape(-1)
    rank = len(ins[0].shape)
    s = slope.reshape((1, -1) + (1,) * (rank - 2)) if slope.size > 1 else slope.reshape(())

    def run(i, o):
        np.multiply(i[0], s, out=o[0])
        np.copyto(o[0], i[0], where=i[0] > 0)
    return writes(run)


@kernel("UnaryOp")
def unary(node, ins, outs, settings):
    op = node.param.get("opType")
    if op not in UNARY or ins[0].dtype != "float32":
        return by_definition(node)
    fn = UNARY[op]
    exact = mnn_math.on_grid(op, ins, outs, settings.threads)
    if exact is not None:
        return exact
    if op == "SIGMOID" and ins[0].dtype == "float32":
        return _sigmoid_kernel(_size(outs), settings.threads)
    if op == "GELU" and outs[0].shape is not None:
        return _gelu_tanh_kernel(int(np.prod(outs[0].shape)), settings.threads)
    if op in ("ERF", "GELU_STANDARD") and ins[0].dtype == "float32" and outs[0].shape is not None:
        return _erf_kernel(int(np.prod(outs[0].shape)), op == "GELU_STANDARD", settings.threads)
    if ins[0].dtype != "float32" and op not in ("ABS", "NEG", "SQUARE", "SIGN"):
        return returns(lambda i: [fn(i[0].astype(np.float32)).astype(i[0].dtype)])
    if op in ACTIVATION_KINDS and outs[0].dtype == "float32":
        # one bound compiled call (the apply wrapper's dispatch through the kernel library, cold in a run:
        # ~60 us for EfficientViT-B0's head hard-swish on 1280 floats)
        flat, kind = Bound(activation_flat), ACTIVATION_KINDS[op]

        def run(i, o):
            if o[0].flags.c_contiguous:
                flat(np.ascontiguousarray(i[0]).reshape(-1), o[0].reshape(-1), kind)
            else:
                fn(i[0], out=o[0])
        return writes(run)
    return writes(lambda i, o: fn(i[0], out=o[0]))


@njit(parallel=True, cache=True, fastmath=True)
def add_relu(a, b, out, relu):
    """out = a + b, then max(., 0) when relu, in one pass over (rows, n) arrays: numpy's add and a
    separate maximum read and write the output twice (a ResNet residual add: 0.18 -> 0.06 ms)."""
    for r in prange(a.shape[0]):
        x, y, z = a[r], b[r], out[r]
        if relu:
            for i in range(z.shape[0]):
                v = x[i] + y[i]
                z[i] = v if v > 0 else np.float32(0)
        else:
            for i in range(z.shape[0]):
                z[i] = x[i] + y[i]


SMALL = 4096    # elements: below this a same-shape add is numpy's (the fused Numba pass costs 2.5 us a call, np.add 0.4)


@njit(parallel=True, cache=True, fastmath=True)
def per_row(x, s, out, mul, relu):
    """out[r] = x[r] * s[r % len(s)] (or + when not mul), then max(., 0) when relu, over (rows, n)
    arrays: a squeeze-excite's channel scale (x of (N*C, H*W), s of C or N*C). numpy's broadcast ran
    its inner loop per row of W: RegNetY's 320 x 14 x 14 scale took 32 us, 0.5 ns a float."""
    c = s.shape[0]
    for r in prange(x.shape[0]):
        v, a, z = s[r % c], x[r], out[r]
        if mul:
            for i in range(z.shape[0]):
                z[i] = a[i] * v
        else:
            for i in range(z.shape[0]):
                z[i] = a[i] + v
        if relu:
            for i in range(z.shape[0]):
                z[i] = max(z[i], np.float32(0))


def _per_channel(op, ins, outs, fused_relu, threads):
    """The kernel for x (op) s with s one value per channel ((1|N, C, 1, 1) against (N, C, H, W)), or None."""
    if op not in ("MUL", "ADD") or len(ins) != 2 or any(np.dtype(v.dtype) != np.float32 for v in ins + outs):
        return None
    shapes = [v.shape for v in ins]
    if any(sh is None or len(sh) != 4 or not all(isinstance(d, int) for d in sh) for sh in shapes):
        return None
    full = 0 if shapes[0][2:] != (1, 1) else 1
    xs, ss = shapes[full], shapes[1 - full]
    if tuple(outs[0].shape) != xs or ss[1] != xs[1] or ss[2:] != (1, 1) or ss[0] not in (1, xs[0]) or \
            xs[2] * xs[3] < 16 or int(np.prod(xs)) < SMALL:
        return None
    rows = xs[0] * xs[1]
    fn = sized(per_row, int(np.prod(xs)), threads)

    def run(i, o):
        fn(np.ascontiguousarray(i[full]).reshape(rows, -1), np.ascontiguousarray(i[1 - full]).reshape(-1),
           o[0].reshape(rows, -1), op == "MUL", fused_relu)
    return writes(run)


ROW_OPS = {"ADD": 0, "SUB": 1, "MUL": 2, "REALDIV": 3, "DIV": 3}


@njit(parallel=True, cache=True, error_model="numpy")
def by_row_value(x, step, s, kind, relu, out):
    """out[r, j] = x[r * step + j] (+ - * /) s[r] over (rows, n) (x flat: parallel_rows.row_span; no fastmath:
    the division stays a division, as NumPy's; NumPy's error model: x / 0 is inf or nan, not an exception),
    then max(., 0) when relu: an operand broadcast along the last axis, as EfficientViT's linear attention
    divides each row of its (8, 196, 16) output, a strided view, by its (8, 196, 1) normaliser (a NumPy
    broadcast ufunc, ~30 us a call in the run; a row view a row and the copy of x 33 us at one thread, flat
    indices on the view in place 4)."""
    rows, n = out.shape
    of = out.reshape(-1)
    un, us = np.uint64(n), np.uint64(step)
    for r in prange(rows):
        v = s[r]
        xb, ob = np.uint64(r) * us, np.uint64(r) * un
        if kind == 0:
            for j in range(un):
                of[ob + j] = x[xb + j] + v
        elif kind == 1:
            for j in range(un):
                of[ob + j] = x[xb + j] - v
        elif kind == 2:
            for j in range(un):
                of[ob + j] = x[xb + j] * v
        else:
            for j in range(un):
                of[ob + j] = x[xb + j] / v
        if relu:
            for j in range(un):
                of[ob + j] = max(of[ob + j], np.float32(0))


def _last_axis_broadcast(op, ins, outs, fused_relu, threads):
    """The kernel for x (op) s where s is x's shape with a last axis of 1 (the same leading axes), or None."""
    if op not in ROW_OPS or len(ins) != 2 or any(np.dtype(v.dtype) != np.float32 for v in ins + outs):
        return None
    xs, ss, ys = ins[0].shape, ins[1].shape, outs[0].shape
    if xs is None or ss is None or ys is None or len(xs) < 2 or len(ss) != len(xs) or \
            not all(isinstance(d, int) for d in xs + ss) or tuple(ys) != tuple(xs) or \
            tuple(ss) != tuple(xs[:-1]) + (1,) or xs[-1] < 2:
        return None
    from ..micro.parallel_rows import RowSpan
    n = xs[-1]
    rows = int(np.prod(xs)) // n
    fn, kind = sized(by_row_value, rows * n, threads), ROW_OPS[op]
    span = RowSpan(rows, n)

    def run(i, o):
        y = o[0]
        if y.flags.c_contiguous:
            x = span(i[0]) or (np.ascontiguousarray(i[0]).reshape(-1), n)      # (another layout: copied)
            fn(x[0], x[1], np.ascontiguousarray(i[1]).reshape(rows), kind, fused_relu, y.reshape(rows, n))
        else:
            FLOAT_BINARY[op](i[0], i[1], out=y)
            if fused_relu:
                np.maximum(y, 0, out=y)
    return writes(run)


def _small_power(op, ins, shapes):
    """x ** e for a constant e of 2, 3 or 0.5 as products or a square root: numpy's float32 power is a
    general pow (GPT-2's GELU cubes 64 x 256 values: 180 -> 3 us)."""
    e = ins[1].value if op == "POW" and len(ins) == 2 else None
    if e is None or np.size(e) != 1 or shapes[0] != shapes[2]:
        return None
    e = float(np.asarray(e).reshape(-1)[0])
    if e == 2:
        return lambda i, o: np.multiply(i[0], i[0], out=o[0])
    if e == 3:
        def cube(i, o):
            np.multiply(i[0], i[0], out=o[0])
            np.multiply(o[0], i[0], out=o[0])
        return cube
    if e == 0.5:
        return lambda i, o: np.sqrt(i[0], out=o[0])
    return None


@kernel("BinaryOp")
def binary(node, ins, outs, settings):
    op = node.param.get("opType")
    if op not in FLOAT_BINARY or any(v.dtype != "float32" for v in ins):
        exact = _integer_binary(node, op, ins, outs)
        return exact if exact is not None else by_definition(node)   # MNN's meaning, in ir/ops/elementwise
    fn = FLOAT_BINARY[op]
    dtype = np.dtype(outs[0].dtype)
    fused_relu = int(node.param.get("activationType", 0)) == 1   # MNN's converter fuses ReLU this way
    shapes = [v.shape for v in ins + outs]
    if (op == "ADD" and len(ins) == 2 and all(np.dtype(v.dtype) == np.float32 for v in ins + outs)
            and shapes[0] is not None and len(shapes[0]) >= 2 and all(isinstance(d, int) for d in shapes[0])
            and all(sh == shapes[0] for sh in shapes) and int(np.prod(shapes[0])) >= SMALL):
        rows = int(np.prod(shapes[0][:2]))
        from .int8_add import rounded_add      # an output stored on an int8 grid: rounded in the same pass
        if (rounded := rounded_add(rows, outs, fused_relu, settings.threads)) is not None:
            return rounded
        fused = sized(add_relu, int(np.prod(shapes[0])), settings.threads)

        def run_add(i, o):
            a, b = (np.ascontiguousarray(v).reshape(rows, -1) for v in i)
            fused(a, b, o[0].reshape(rows, -1), fused_relu)
        return writes(run_add)

    channel = _per_channel(op, ins, outs, fused_relu, settings.threads)
    if channel is not None:
        return channel
    rowwise = _last_axis_broadcast(op, ins, outs, fused_relu, settings.threads)
    if rowwise is not None:
        return rowwise
    power = _small_power(op, ins, shapes)
    if power is not None:
        return writes(power)
    from .parallel_steps import binary as parallel_binary   # a broadcast: threads, with the work for them
    if not fused_relu and (par := parallel_binary(op, ins, outs, settings.threads)) is not None:
        return writes(par)

    def run(i, o):
        a, b = i
        if a.dtype != b.dtype and dtype != np.bool_:
            a, b = a.astype(dtype, copy=False), b.astype(dtype, copy=False)
        fn(a, b, out=o[0])
        if fused_relu:
            np.maximum(o[0], 0, out=o[0])
    return writes(run)


# integer ops whose NumPy ufunc is MNN's meaning with no rounding rule of its own (division, modulo and
# shifts keep the definition)
INTEGER_BINARY = {"ADD": np.add, "SUB": np.subtract, "MUL": np.multiply, "MAXIMUM": np.maximum,
                  "MINIMUM": np.minimum, "EQUAL": np.equal, "NOTEQUAL": np.not_equal, "GREATER": np.greater,
                  "GREATER_EQUAL": np.greater_equal, "LESS": np.less, "LESS_EQUAL": np.less_equal}


def _integer_binary(node, op, ins, outs):
    """Integer/boolean operands with dtypes known at prepare: the definition's type rule (operand_dtypes)
    decided once, then one ufunc into the output, or None. An embedding's negative-index fix is three
    such ops on 16 indices: 4 us each through the definition, ~1 here."""
    try:
        kinds = [np.dtype(v.dtype) if v.dtype else None for v in ins + outs]
    except TypeError:       # a type NumPy does not name (MNN's string tensors): the definition
        return None
    if op not in INTEGER_BINARY or len(ins) != 2 or None in kinds or any(k.kind not in "biu" for k in kinds) or \
            int(node.param.get("activationType", 0) or 0):
        return None
    t, _ = operand_dtypes(op, kinds[0], kinds[1])
    if kinds[2] != (np.dtype(np.bool_) if op in COMPARE_OPS else t):
        return None
    fn = INTEGER_BINARY[op]

    def run(i, o):
        fn(np.asarray(i[0]).astype(t, copy=False), np.asarray(i[1]).astype(t, copy=False), out=o[0])
    return writes(run)


@kernel("Select")
def select(node, ins, outs, settings):
    return writes(lambda i, o: np.copyto(o[0], np.where(i[0].astype(bool), i[1], i[2])))


@kernel("Cast")
def cast(node, ins, outs, settings):
    dtype = np.dtype(outs[0].dtype)
    return returns(lambda i: [i[0].astype(dtype)])
