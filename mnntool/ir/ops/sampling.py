"""Sampling an image at computed points: GridSample (a spatial transformer's warp, optical-flow
warping), with ONNX/PyTorch's coordinate conventions and MNN's rounding."""
from __future__ import annotations

import numpy as np

from . import Val, define, numel, params


def _reflect(c, lo, hi):
    span = hi - lo
    if span <= 0:
        return np.zeros_like(c)
    c = np.abs(c - lo)
    flips = np.floor(c / span)
    extra = c - flips * span
    return np.where(flips % 2 == 0, lo + extra, hi - extra)


def grid_sample(x, grid, mode, padding, align):
    """ONNX/PyTorch grid_sample on NCHW x with an [N, Ho, Wo, 2] grid of (x, y) in [-1, 1]."""
    n, c, h, w = x.shape
    gx, gy = grid[..., 0].astype(np.float64), grid[..., 1].astype(np.float64)
    if align:
        ix, iy = (gx + 1) / 2 * (w - 1), (gy + 1) / 2 * (h - 1)
    else:
        ix, iy = ((gx + 1) * w - 1) / 2, ((gy + 1) * h - 1) / 2
    if padding == "CLAMP":
        ix, iy = np.clip(ix, 0, w - 1), np.clip(iy, 0, h - 1)
    elif padding == "REFLECTION":
        if align:
            ix, iy = _reflect(ix, 0, w - 1), _reflect(iy, 0, h - 1)
        else:
            ix, iy = np.clip(_reflect(ix, -0.5, w - 0.5), 0, w - 1), np.clip(_reflect(iy, -0.5, h - 0.5), 0, h - 1)
    out = np.zeros((n, c) + gx.shape[1:], np.float64)
    xd = x.astype(np.float64)

    def pick(b, yy, xx):
        ok = (yy >= 0) & (yy < h) & (xx >= 0) & (xx < w)
        v = xd[b][:, np.clip(yy, 0, h - 1), np.clip(xx, 0, w - 1)]
        return v * ok
    for b in range(n):
        if mode == "NEAREST":       # MNN rounds halves up (measured): floor(c + 0.5)
            out[b] = pick(b, np.floor(iy[b] + 0.5).astype(np.int64), np.floor(ix[b] + 0.5).astype(np.int64))
            continue
        x0, y0 = np.floor(ix[b]).astype(np.int64), np.floor(iy[b]).astype(np.int64)
        fx, fy = ix[b] - x0, iy[b] - y0
        out[b] = (pick(b, y0, x0) * (1 - fx) * (1 - fy) + pick(b, y0, x0 + 1) * fx * (1 - fy)
                  + pick(b, y0 + 1, x0) * (1 - fx) * fy + pick(b, y0 + 1, x0 + 1) * fx * fy)
    return out.astype(x.dtype)


@define("GridSample", param="GridSample", inputs=("x", "grid"), kind="sampling", layout="NC4HW4")
class GridSample:
    """Samples x at the grid's normalized (x, y) points: bilinear or nearest, zeros/clamp/reflection
    outside, corners aligned or not."""
    def infer(node, ins):
        n, c = ins[0].shape[:2]
        return [Val((n, c) + tuple(ins[1].shape[1:3]), ins[0].dtype)]

    def flops(node, ins, outs):
        return 8 * numel(outs[0].shape)

    def compute(node, xs):
        p = params(node)
        return grid_sample(xs[0], xs[1], p["mode"], p["paddingMode"],
                           bool(p["alignCorners"]))
