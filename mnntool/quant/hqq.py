"""HQQ (half-quadratic quantization, Badri & Shaji 2023) for asymmetric weight-only blocks: the scale
stays min-max, the zero point moves to where an lp (p < 1) norm of the rounding error is smallest.
The lp norm lets a few large errors stand to make the many small ones smaller, which is what the
min-max range (pinned by each block's two extremes) cannot do.

MNN's converter (`--hqq`) runs the same proximal step a fixed 20 times at one beta; this one grows
beta by kappa each step (the paper's schedule) and keeps the zero of the step with the smallest mean
absolute error, so it is never worse than min-max on that measure.
"""
from __future__ import annotations

import numpy as np

LP_NORM, BETA, KAPPA, ITERS = 0.7, 10.0, 1.01, 20     # the paper's and MNN's settings


def _shrink(x: np.ndarray, beta: float, p: float) -> np.ndarray:
    """The proximal operator of the lp norm (the generalized soft threshold)."""
    a = np.abs(x)
    return np.sign(x) * np.maximum(a - np.power(np.maximum(a, 1e-8), p - 1) / beta, 0)


def hqq_minimum(x: np.ndarray, lo: np.ndarray, scale: np.ndarray, bits: int) -> np.ndarray:
    """Rows of blocks `x` (blocks, n) with their min-max `lo` and `scale` -> the optimised `lo`
    (dequantization stays w = lo + (q - qmin) * scale, q in qmin .. qmin + 2**bits - 1)."""
    levels = (1 << bits) - 1
    inv = (1.0 / scale)[:, None]
    s = scale[:, None]
    zero = -lo[:, None] * inv                   # in the unsigned domain: q' = round(w / scale + zero)
    beta = BETA
    best = np.abs(x - (np.clip(np.round(x * inv + zero), 0, levels) - zero) * s).mean(1)
    best_zero = zero.copy()
    for _ in range(ITERS):
        wq = np.clip(np.round(x * inv + zero), 0, levels)
        err = x - (wq - zero) * s
        zero = np.mean(wq - (x - _shrink(err, beta, LP_NORM)) * inv, axis=1, keepdims=True)
        beta *= KAPPA
        now = np.abs(x - (np.clip(np.round(x * inv + zero), 0, levels) - zero) * s).mean(1)
        better = now < best
        best = np.where(better, now, best)
        best_zero = np.where(better[:, None], zero, best_zero)
    return -best_zero[:, 0] * scale
