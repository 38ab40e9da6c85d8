"""Winograd F(4x4, 3x3) for stride-1 3x3 convolutions: 4x fewer multiplies than im2col, done as 36
batched sgemms between Numba input/output transforms (Lavin & Gray, 2015)."""
from __future__ import annotations

import numpy as np
from numba import njit, prange

G = np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6], [1 / 24, 1 / 12, 1 / 6],
              [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]], np.float64)


def transform_weights(w: np.ndarray) -> np.ndarray:
    """(O, C, 3, 3) -> U (36, O, C) with U[a*6+b] = (G w G^T)[a, b]."""
    u = np.einsum("ai,ocij,bj->aboc", G, w.astype(np.float64), G)
    return np.ascontiguousarray(u.reshape(36, w.shape[0], w.shape[1]).astype(np.float32))


@njit(parallel=True, cache=True, fastmath=True)
def input_transform(xp, th, tw, v):
    """xp (C, 4*th+2, 4*tw+2) -> v (36, C, th*tw) = B^T d B per 6x6 tile."""
    for c in prange(xp.shape[0]):
        t1 = np.empty((6, 6), np.float32)
        for ty in range(th):
            for tx in range(tw):
                y0, x0 = ty * 4, tx * 4
                for j in range(6):   # columns: B^T applied down each column
                    d0 = xp[c, y0, x0 + j]
                    d1 = xp[c, y0 + 1, x0 + j]
                    d2 = xp[c, y0 + 2, x0 + j]
                    d3 = xp[c, y0 + 3, x0 + j]
                    d4 = xp[c, y0 + 4, x0 + j]
                    d5 = xp[c, y0 + 5, x0 + j]
                    t1[0, j] = 4 * d0 - 5 * d2 + d4
                    t1[1, j] = -4 * d1 - 4 * d2 + d3 + d4
                    t1[2, j] = 4 * d1 - 4 * d2 - d3 + d4
                    t1[3, j] = -2 * d1 - d2 + 2 * d3 + d4
                    t1[4, j] = 2 * d1 - d2 - 2 * d3 + d4
                    t1[5, j] = 4 * d1 - 5 * d3 + d5
                t = ty * tw + tx
                for i in range(6):   # rows: then B on the right
                    d0, d1, d2, d3, d4, d5 = t1[i, 0], t1[i, 1], t1[i, 2], t1[i, 3], t1[i, 4], t1[i, 5]
                    k = i * 6
                    v[k, c, t] = 4 * d0 - 5 * d2 + d4
                    v[k + 1, c, t] = -4 * d1 - 4 * d2 + d3 + d4
                    v[k + 2, c, t] = 4 * d1 - 4 * d2 - d3 + d4
                    v[k + 3, c, t] = -2 * d1 - d2 + 2 * d3 + d4
                    v[k + 4, c, t] = 2 * d1 - d2 - 2 * d3 + d4
                    v[k + 5, c, t] = 4 * d1 - 5 * d3 + d5


@njit(parallel=True, cache=True, fastmath=True)
def output_transform(m, th, tw, bias, act, out):
    """m (36, O, th*tw) -> out (O, H, W) = A^T m A per tile, cropped, plus bias and activation."""
    oh, ow = out.shape[1], out.shape[2]
    for o in prange(out.shape[0]):
        t1 = np.empty((4, 6), np.float32)
        vals = np.empty(4, np.float32)
        for ty in range(th):
            for tx in range(tw):
                t = ty * tw + tx
                for j in range(6):
                    m0, m1, m2 = m[j, o, t], m[6 + j, o, t], m[12 + j, o, t]
                    m3, m4, m5 = m[18 + j, o, t], m[24 + j, o, t], m[30 + j, o, t]
                    t1[0, j] = m0 + m1 + m2 + m3 + m4
                    t1[1, j] = m1 - m2 + 2 * m3 - 2 * m4
                    t1[2, j] = m1 + m2 + 4 * m3 + 4 * m4
                    t1[3, j] = m1 - m2 + 8 * m3 - 8 * m4 + m5
                for i in range(4):
                    y = ty * 4 + i
                    if y >= oh:
                        break
                    r0, r1, r2, r3, r4, r5 = t1[i, 0], t1[i, 1], t1[i, 2], t1[i, 3], t1[i, 4], t1[i, 5]
                    vals[0] = r0 + r1 + r2 + r3 + r4
                    vals[1] = r1 - r2 + 2 * r3 - 2 * r4
                    vals[2] = r1 + r2 + 4 * r3 + 4 * r4
                    vals[3] = r1 - r2 + 8 * r3 - 8 * r4 + r5
                    for j in range(4):
                        x = tx * 4 + j
                        if x < ow:
                            val = vals[j] + bias[o]
                            if act == 1:
                                val = max(val, 0.0)
                            elif act == 2:
                                val = min(max(val, 0.0), 6.0)
                            out[o, y, x] = val


class Winograd:
    """Prepared state for one convolution: transformed weights and the scratch buffers."""

    def __init__(self, weight, bias, cin, h, w, oh, ow, t, l, act):
        self.u = transform_weights(weight.reshape(-1, cin, 3, 3))
        self.th, self.tw = -(-oh // 4), -(-ow // 4)
        self.h, self.w, self.t, self.l = h, w, t, l
        self.padded = np.zeros((cin, self.th * 4 + 2, self.tw * 4 + 2), np.float32)
        self.v = np.empty((36, cin, self.th * self.tw), np.float32)
        self.m = np.empty((36, self.u.shape[1], self.th * self.tw), np.float32)
        self.bias, self.act = bias, act

    def __call__(self, x, y):
        p = self.padded
        hh = min(self.h, p.shape[1] - self.t)
        ww = min(self.w, p.shape[2] - self.l)
        p[:, self.t:self.t + hh, self.l:self.l + ww] = x[:, :hh, :ww]
        input_transform(p, self.th, self.tw, self.v)
        np.matmul(self.u, self.v, out=self.m)
        output_transform(self.m, self.th, self.tw, self.bias, self.act, y)
