"""MNN's float activations as its x86 CPU kernels compute them, emulated in numpy, and tables of them
for operators that read an int8 tensor.

An int8 file's float operators (the sigmoid of a SiLU, a HardSwish) read a tensor of at most 256
values, and their result is rounded to int8 again by the next layer. Where mnntool's activation
differs from MNN's by an ulp, that rounding flips now and then, and the flips grow through the layers
below: the two runtimes then read one file differently. A table of MNN's own results, made once at
prepare time, runs such an operator exactly as MNN does, and faster than computing it.

Each formula was read from MNN 3.x's wheel (`_mnncengine`, objdump) and checked on 2^20 values drawn
at random (tests/runtime/test_mnn_math.py checks them against MNN on every run):
- `MNNSigmoid`: `_AVX_MNNExpC8FMA` of -x, then 1 / (1 + e);
- `MNNHardSwishCommon`: x * relu6(x + 3) / 6, in that order;
- `MNNGeluStandardCommon`: in double, (erf(x * 0.7071067932881648) + 1) * x * 0.5.
"""
from __future__ import annotations

import math

import numpy as np
from ..compile.jit import njit, prange

f32 = np.float32


def fma32(a, b, c) -> np.ndarray:
    """a * b + c rounded once to float32 (vfmadd). The product of two float32 is exact in float64;
    the float64 sum may round onto a float32 midpoint, so its rounding error (TwoSum) decides those."""
    a, b, c = (np.asarray(v, np.float64) for v in (a, b, c))
    p = a * b
    s = p + c
    t = s - p
    err = (p - (s - t)) + (c - t)
    r = s.astype(f32)
    r64 = r.astype(np.float64)
    other = np.nextafter(r, np.where(r64 < s, f32(np.inf), f32(-np.inf))).astype(np.float64)
    tie = (r64 != s) & (np.abs(s - r64) == np.abs(other - s))     # s halfway: the exact sum is not
    up = tie & (err > 0) & (r64 < s)
    down = tie & (err < 0) & (r64 > s)
    r = np.where(up, np.nextafter(r, f32(np.inf)), r)
    return np.where(down, np.nextafter(r, f32(-np.inf)), r).astype(f32)


# _AVX_MNNExpC8FMA's constants (MNNExp's parameters: ln 2, 1 / ln 2, then the Taylor terms of e^(t))
LN2, INV_LN2 = f32(0.6931471824645996), f32(1.4426950216293335)
TAYLOR = (f32(0.0416666679084301), f32(0.1666666716337204), f32(0.5), f32(1), f32(1))


def exp(x) -> np.ndarray:
    """e^x: x = n ln2 + r with n rounded to nearest even (vcvtps2dq), e^r as (degree-5 Taylor of r/4)^4
    by FMAs, times 2^n; x clamped to [-87, 87]."""
    x = np.clip(np.asarray(x, f32), f32(-87), f32(87))
    n = np.rint(x * INV_LN2).astype(np.int32)
    r = fma32(-n.astype(f32), LN2, x)
    t = (r * f32(0.25)).astype(f32)
    p = np.full_like(t, f32(0.008333333767950535))
    for c in TAYLOR:
        p = fma32(p, t, c)
    p = p * p
    p = p * p
    return (p * ((n + 127) << 23).view(f32)).astype(f32)


def sigmoid(x) -> np.ndarray:
    x = np.asarray(x, f32)
    return (f32(1) / (f32(1) + exp(-x))).astype(f32)


def silu(x) -> np.ndarray:
    """x * sigmoid(x) as an exported SiLU computes it: MNN's sigmoid, then a float32 product."""
    x = np.asarray(x, f32)
    return (x * sigmoid(x)).astype(f32)


def silu_unary(x) -> np.ndarray:
    """MNN's UnaryOp SILU (what passes/fuse_silu writes): x / (1 + exp(-x)), which differs from x * sigmoid(x)
    by an ulp in ~1 value of 6 (measured against MNN 3.6.1)."""
    x = np.asarray(x, f32)
    return (x / (f32(1) + exp(-x))).astype(f32)


def hardswish(x) -> np.ndarray:
    x = np.asarray(x, f32)
    return ((x * np.clip(x + f32(3), f32(0), f32(6))) / f32(6)).astype(f32)


def gelu_erf(x) -> np.ndarray:
    return np.array([(math.erf(float(v) * 0.7071067932881648) + 1.0) * float(v) * 0.5
                     for v in np.asarray(x, f32).reshape(-1)], np.float64).astype(f32).reshape(np.shape(x))


# UnaryOp types (and the planner's fused x * sigmoid(x)) that read an int8 tensor through a table
ON_GRID = {"SIGMOID": sigmoid, "HARDSWISH": hardswish, "GELU_STANDARD": gelu_erf, "FusedSiLU": silu,
           "SILU": silu_unary}


def table(fn, grid: tuple) -> np.ndarray:
    """fn at every value of an int8 grid (kernels.micro.epilogue.grid_of: 1/s, s, min and max in steps), in steps
    from min: the values the grid's kernels write, f32(k) * s."""
    lo, hi = int(grid[2]), int(grid[3])
    return fn((np.arange(lo, hi + 1, dtype=f32) * f32(grid[1])).astype(f32))


LUT_CHUNK = 4096


@njit(parallel=True, cache=True, fastmath=True)
def lookup(x, inv, lo, values, out):
    """out[i] = values[round(x[i] / s) - lo] over flat arrays whose values lie on an int8 grid."""
    n, top = x.shape[0], values.shape[0] - 1
    for c in prange((n + LUT_CHUNK - 1) // LUT_CHUNK):
        start = c * LUT_CHUNK
        src, dst = x[start:min(n, start + LUT_CHUNK)], out[start:min(n, start + LUT_CHUNK)]
        for i in range(src.shape[0]):
            k = np.int32(np.rint(src[i] * inv)) - lo
            dst[i] = values[min(max(k, 0), top)]


def on_grid(op: str, ins, outs, threads: int):
    """A kernel that runs `op` by table when its input lies on an int8 grid, else None. Where the file
    stores the output on an int8 grid too (outs[0].grid; the planner gives none where a reader takes
    it unrounded), the table holds the rounded values and the kernel says so (out_grid), so no rounding
    step follows: EfficientNet-B0's SiLUs spent 3.3 ms of 16.8 in those steps (Zen 4, one thread)."""
    fn = ON_GRID.get(op)
    grid = ins[0].grid if ins else None
    if fn is None or grid is None or ins[0].dtype != "float32":
        return None
    from .. import Kernel, sized
    values = table(fn, grid)
    out_grid = outs[0].grid if outs else None
    if out_grid is not None:     # rounded as the store's rounding step rounds (int8_store.rounding)
        from ..micro.epilogue import to_grid_z
        rows = values.reshape(1, -1)
        to_grid_z(rows, out_grid, f32(outs[0].zero), rows)
    inv, lo = f32(grid[0]), np.int32(grid[2])
    size = int(np.prod(outs[0].shape)) if outs and outs[0].shape is not None else 0
    run = sized(lookup, size * 2, threads)
    return Kernel(lambda i, o: run(np.ascontiguousarray(i[0], f32).reshape(-1), inv, lo, values, o[0].reshape(-1)),
                  True, out_grid)
