"""The residual add a planner-fused convolution (plan stage fuse_residual_add) finishes with: its
output plus the block's residual, then the ReLU/ReLU6 bounds (or the LeakyReLU) that followed the Add, in one pass over
the output in place of the Add's step (which wrote a tensor of its own)."""
from __future__ import annotations

import numpy as np

from ..compile.jit import njit, prange

BLOCK = 4096        # floats a thread's chunk holds: 16 KB of output and of residual, in L1 together


@njit(parallel=True, cache=True, fastmath=True)
def add_clamped(y, r, lo, hi):
    """y = min(max(y + r, lo), hi) over flat float32 arrays (lo, hi: -inf, inf for a plain add)."""
    n = y.shape[0]
    for blk in prange((n + BLOCK - 1) // BLOCK):
        yb, rb = y[blk * BLOCK:(blk + 1) * BLOCK], r[blk * BLOCK:(blk + 1) * BLOCK]
        # selects, not min/max: Numba's min and max of floats kept the loop scalar (4x slower than the
        # Add step this pass replaces)
        for i in range(yb.shape[0]):
            v = yb[i] + rb[i]
            v = lo if v < lo else v         # a NaN kept, as the Add and ReLU steps keep it
            yb[i] = hi if v > hi else v


@njit(parallel=True, cache=True, fastmath=True)
def add_leaky(y, r, slope):
    """y = v if v > 0 else v * slope, v = y + r, over flat float32 arrays: a LeakyReLU after the add (CSP
    networks), as the ReLU step computes it (max(v, v * slope) for a slope under 1: the same values)."""
    n = y.shape[0]
    for blk in prange((n + BLOCK - 1) // BLOCK):
        yb, rb = y[blk * BLOCK:(blk + 1) * BLOCK], r[blk * BLOCK:(blk + 1) * BLOCK]
        for i in range(yb.shape[0]):
            v = yb[i] + rb[i]
            yb[i] = v if v > 0 else v * slope


def bounds_of(post: tuple) -> tuple:
    """(lo, hi) float32 of a Post that is a clip (epilogue.POST_CLIP) or none."""
    from .epilogue import POST_CLIP
    if int(post[0]) == POST_CLIP:
        return np.float32(post[1]), np.float32(post[2])
    return np.float32(-np.inf), np.float32(np.inf)
