"""PoolFormer's and EfficientFormer's token mixer, out = r + s[c] * (avgpool(y) - y) with a stride-1 k x k
average pool padded to the same size (plan/fuse_pool_mixer.py makes the step from a Pooling, the Sub
that takes its input back off, and the layer scale's Mul and residual Add that may follow). The pool runs
as a box filter: per output row the k input rows are summed down into a zero-bordered row, then k
neighbours across, and the count of the window (inside the map when padding is not counted) is
1/rows * 1/cols, separable. The pooling kernel's window loop took 3.9 ms on EfficientFormer-L1's
48 x 56 x 56 maps (1 thread, AMD EPYC Zen 4), and the Sub, Mul and Add were three more passes."""
from __future__ import annotations

import numpy as np
from ..compile.jit import njit, prange

from .. import PLAN_ONLY, sized, writes


@njit(cache=True, fastmath=True, inline="always")
def _column_sums(src, h, w, k, col):
    """col[p:p + h * w] = the sums of src (a flat h x w plane) over the k rows centred on each pixel's,
    where they exist (p = k // 2; indices as slices: an index i + off of unknown sign does not vectorize)."""
    p, hw = k // 2, h * w
    v = col[p:p + hw]
    if k == 3 and h >= 3:           # one pass: the row above, the row, the row below
        top, mid, bot, vm = src[:hw - 2 * w], src[w:hw - w], src[2 * w:], v[w:hw - w]
        for i in range(hw - 2 * w):
            vm[i] = top[i] + mid[i] + bot[i]
        a, b, va = src[:w], src[w:2 * w], v[:w]
        c, d, vz = src[hw - 2 * w:hw - w], src[hw - w:], v[hw - w:]
        for i in range(w):
            va[i] = a[i] + b[i]
            vz[i] = c[i] + d[i]
        return
    for i in range(hw):
        v[i] = src[i]
    for dd in range(1, p + 1):      # rows dd below and dd above
        off = dd * w
        if off >= hw:
            break
        head, below, tail, above = v[:hw - off], src[off:], v[off:], src[:hw - off]
        for i in range(hw - off):
            head[i] += below[i]
        for i in range(hw - off):
            tail[i] += above[i]


@njit(parallel=True, cache=True, fastmath=True)
def pool_mixer(y, r, scale, k, inv, sub, res, chunks, out):
    """out[b, c] = res * r[b, c] + scale[c] * (box_k(y[b, c]) * inv - sub * y[b, c]) over (N, C, H, W)
    planes; box_k sums the k x k window centred on each pixel, inside the map; inv: (H, W), 1 / count.
    Each plane runs flat (H * W long loops: at 56 pixels a row, per-row loops spent their time in
    remainders): the column sums over k rows into a zero-bordered scratch (one a chunk of planes), then
    k neighbours across, whose sums at the p = k // 2 pixels each side of a row wrap into the next row
    and are redone."""
    n, c, h, w = y.shape
    p = k // 2
    hw = h * w
    planes = n * c
    iv = inv.reshape(hw)
    for chunk in prange(chunks):
        col = np.zeros(hw + 2 * p, np.float32)
        v = col[p:p + hw]
        for nc in range(chunk * planes // chunks, (chunk + 1) * planes // chunks):
            b, ch = nc // c, nc % c
            s = scale[ch]
            src, rr, dst = y[b, ch].reshape(hw), r[b, ch].reshape(hw), out[b, ch].reshape(hw)
            _column_sums(src, h, w, k, col)
            if k == 3:
                c0, c1, c2 = col[:hw], col[1:hw + 1], col[2:hw + 2]
                for i in range(hw):
                    dst[i] = res * rr[i] + s * ((c0[i] + c1[i] + c2[i]) * iv[i] - sub * src[i])
                for yy in range(h):         # a row's ends: their sums wrapped into the next row
                    i = yy * w
                    t = v[i] + v[i + 1] if w > 1 else v[i]
                    dst[i] = res * rr[i] + s * (t * iv[i] - sub * src[i])
                    if w > 1:
                        i = yy * w + w - 1
                        dst[i] = res * rr[i] + s * ((v[i - 1] + v[i]) * iv[i] - sub * src[i])
                continue
            for i in range(hw):
                dst[i] = col[i]
            for j in range(1, k):
                cj = col[j:j + hw]
                for i in range(hw):
                    dst[i] += cj[i]
            for i in range(hw):
                dst[i] = res * rr[i] + s * (dst[i] * iv[i] - sub * src[i])
            for yy in range(h):             # the pixels whose window crossed a row's end
                for e in range(2 * p):
                    x = e if e < p else w - 2 * p + e
                    if x < 0 or x >= w or (e >= p and x < p):
                        continue
                    i = yy * w + x
                    t = np.float32(0)
                    for j in range(max(x - p, 0), min(x + p + 1, w)):
                        t += v[yy * w + j]
                    dst[i] = res * rr[i] + s * (t * iv[i] - sub * src[i])


def window_counts(size: int, k: int, include: bool) -> np.ndarray:
    """1 / the window's extent along one axis at each of `size` positions (stride 1, padding k // 2):
    k everywhere when padding counts, else the part inside the map."""
    if include:
        return np.full(size, 1.0 / k, np.float32)
    pos = np.arange(size)
    return (1.0 / (np.minimum(pos + k // 2 + 1, size) - np.maximum(pos - k // 2, 0))).astype(np.float32)


def pool_mixer_step(node, ins, outs, settings):
    """The fused step: inputs (y, r) or (y,); param k, include (padding counted), scale (C floats),
    sub (1.0: the Sub's y taken off, 0.0: none), res (a residual input)."""
    prm = node.param
    n, c, h, w = ins[0].shape
    k, sub, res = int(prm["k"]), np.float32(prm["sub"]), bool(prm["res"])
    scale = np.ascontiguousarray(prm["scale"], np.float32).reshape(c)
    inv = np.outer(window_counts(h, k, prm["include"]), window_counts(w, k, prm["include"])).astype(np.float32)
    fn = sized(pool_mixer, n * c * h * w * 2 * k, settings.threads)
    one, zero = np.float32(1), np.float32(0)
    chunks = min(n * c, max(1, settings.threads) * 4)     # a scratch row each

    def run(i, o):
        y = np.ascontiguousarray(i[0], np.float32)
        r = np.ascontiguousarray(i[1], np.float32) if res else y
        fn(y, r, scale, k, inv, sub, one if res else zero, chunks, o[0])
    return writes(run)


PLAN_ONLY["PoolMixer"] = pool_mixer_step
