"""MNN's int8 average pooling (ops.pool.int8_average) for 2x2 stride-2 windows inside the input, in one
vectorized pass per output row.

The general kernel loops over each output's clipped window with a scalar int64 sum: DenseNet-121's
transition pools (2x2/2 over 256 x 56 x 56 and smaller) took 0.96 ms of a 24 ms int8 run, three times
the float pooling. Here every window has its four values (no clipping, the count fixed at 4), so the
loop over an output row runs on vectors (the stride-2 reads an interleaved group); the values are the
same integer steps, summed, scaled by 2^24 // 4 and shifted as int8_average does, so the bytes are
equal (tests/runtime/test_int8_pool.py)."""
from __future__ import annotations

import numpy as np
from ..compile.jit import njit, prange


@njit(cache=True, inline="always")
def _step(v, grid):
    """int8_average's step of v: MNN's rounding (half away from zero; copysign, not a branch, so the
    loop vectorizes: the same value, -0 rounding to 0 either way), clamped to the grid's bounds."""
    t = v * grid[0]
    return np.int64(min(max(np.trunc(t + np.copysign(np.float32(0.5), t)), grid[2]), grid[3]))


@njit(parallel=True, cache=True)
def int8_average_2x2(x, grid, offset, out):
    """out (N, C, H // 2, W // 2 at most) = ops.pool.int8_average(x, grid, offset, 2, 2, 2, 2, 0, 0, out)."""
    n, c = x.shape[0], x.shape[1]
    oh, ow = out.shape[2], out.shape[3]
    mult = np.int64((1 << 24) // 4)
    for nc in prange(n * c):
        b, ch = nc // c, nc % c
        for y in range(oh):
            r0, r1, o = x[b, ch, 2 * y], x[b, ch, 2 * y + 1], out[b, ch, y]
            for xo in range(ow):
                i = 2 * xo
                total = (_step(r0[i], grid) + _step(r0[i + 1], grid) + _step(r1[i], grid) + _step(r1[i + 1], grid)
                         + 4 * offset)
                o[xo] = np.float32(((total * mult) >> 24) - offset) * grid[1]


def covers(kh, kw, sh, sw, pt, pl, in_shape, out_shape) -> bool:
    """Whether int8_average_2x2 computes this pooling: 2x2 stride 2, no padding, every window inside."""
    return (kh, kw, sh, sw, pt, pl) == (2, 2, 2, 2, 0, 0) and 2 * out_shape[2] <= in_shape[2] \
        and 2 * out_shape[3] <= in_shape[3]


@njit(parallel=True, cache=True, fastmath=True)
def int8_average_2x2_grid(x, grid, out):
    """int8_average_2x2 for an input already on the output's grid (DenseNet's transition convolutions round
    their output to the pool's grid): each value is fl(k s), k its step within the bounds, so the float sum
    of a window's four values times 1/s lies within 2e-4 of the sum of their steps K (|K| <= 512; in any
    order of the adds) and rint finds K; the average's step is floor((K + 4 offset) / 4) - offset = K >> 2
    whatever the offset. Four float adds, a multiply and a rounding an output, as the float pooling, in place
    of four casts (0.19 against the float pooling's 0.08 ms for DenseNet's 128 x 56 x 56, one Zen 4 core).
    The step goes through int32, so a zero average is +0 as in int8_average."""
    n, c = x.shape[0], x.shape[1]
    oh, ow = out.shape[2], out.shape[3]
    for nc in prange(n * c):
        b, ch = nc // c, nc % c
        for y in range(oh):
            r0, r1, o = x[b, ch, 2 * y], x[b, ch, 2 * y + 1], out[b, ch, y]
            for xo in range(ow):
                i = 2 * xo
                k = np.int32(np.rint(((r0[i] + r0[i + 1]) + (r1[i] + r1[i + 1])) * grid[0]))
                o[xo] = np.float32(k >> 2) * grid[1]
