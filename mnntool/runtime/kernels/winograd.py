"""Winograd F(m x m, 3x3), m = 4 or 2, for stride-1 3x3 convolutions (Lavin & Gray, 2015): F(4x4) does
4x fewer multiplies than im2col, F(2x2) 2.25x; F(2x2) where a map has too few 4x4 tiles to fill a vector.

Per channel and tile row, the transforms run as whole-row vector passes: B^T down the columns over the
row's full width, then B across each tile with the tiles in the vector lanes (reads of stride m); the
output transform mirrors it. The alpha^2 = (m+2)^2 products are one batched `fgemm` call on weights
transformed and packed at prepare.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from . import scratch, sized
from .conv import _finish
from .fgemm import OCB, epilogue, gemm_batched, k_block, pack_weights, tile_count
from .ocgemm import ocgemm, pack32, suits
from .winograd_ir import at4_block, bt4_cols, bt4_tiles

G4 = np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6], [1 / 24, 1 / 12, 1 / 6],
               [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]], np.float64)
G2 = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], np.float64)


def transform_weights(w: np.ndarray, m: int) -> np.ndarray:
    """(O, C, 3, 3) -> U (alpha^2, O, C) with U[a*alpha+b] = (G w G^T)[a, b]."""
    g = G4 if m == 4 else G2
    u = np.einsum("ai,ocij,bj->aboc", g, w.astype(np.float64), g)
    a = m + 2
    return u.reshape(a * a, w.shape[0], w.shape[1]).astype(np.float32)


@njit(cache=True, fastmath=True, inline="always")
def _bt2(d0, d1, d2, d3, k):
    if k == 0:
        return d0 - d2
    if k == 1:
        return d1 + d2
    if k == 2:
        return d2 - d1
    return d1 - d3


@njit(parallel=True, cache=True, fastmath=True)
def input_transform4(x, t, l, th, tw, v):
    """x (C, H, W), padded by t rows on top and l columns on the left (zeros, also past the bottom and
    right edges, read as such: no padded copy) -> v (36, C, th*tw) = B^T d B per 6x6 tile."""
    C, H, W = x.shape
    Wp = 4 * tw + 2
    tiles = th * tw
    vf, xf = v.reshape(-1), x.reshape(-1)
    span = max(Wp, 64 * ((tw + 15) // 16) + 16)      # bt4_tiles reads 80 floats from a group's start
    for c in prange(C):
        t1 = np.empty((6, span), np.float32)
        tf = t1.reshape(-1)
        for ty in range(th):
            y0 = 4 * ty - t                           # the input row of the tile row's first padded row
            rows = 0
            for k in range(6):
                if 0 <= y0 + k < H:
                    rows |= 1 << k
            for x0 in range(0, Wp, 16):       # B^T down the columns, 16 at a time
                # padded column x0 + lane is input column x0 + lane - l
                bt4_cols(xf, (c * H + y0) * W + x0 - l, W, l - x0, W + l - x0, rows, Wp - x0, tf, x0, span)
            s = ty * tw
            for a in range(6):
                for tx0 in range(0, tw, 16):
                    bt4_tiles(tf, a * span + 4 * tx0, tw - tx0, vf, ((a * 6) * C + c) * tiles + s + tx0, C * tiles)


@njit(parallel=True, cache=True, fastmath=True)
def input_transform2(xp, th, tw, v):
    """xp (C, 2*th+2, 2*tw+2) -> v (16, C, th*tw) = B^T d B per 4x4 tile."""
    C, Wp = xp.shape[0], xp.shape[2]
    for c in prange(C):
        t1 = np.empty((4, Wp), np.float32)
        for ty in range(th):
            y0 = ty * 2
            r0, r1, r2, r3 = xp[c, y0], xp[c, y0 + 1], xp[c, y0 + 2], xp[c, y0 + 3]
            q0, q1, q2, q3 = t1[0], t1[1], t1[2], t1[3]
            for x in range(Wp):
                d0, d1, d2, d3 = r0[x], r1[x], r2[x], r3[x]
                q0[x], q1[x], q2[x], q3[x] = _bt2(d0, d1, d2, d3, 0), _bt2(d0, d1, d2, d3, 1), _bt2(d0, d1, d2, d3, 2), _bt2(d0, d1, d2, d3, 3)
            s = ty * tw
            for a in range(4):
                row = t1[a]
                v0, v1, v2, v3 = v[a * 4, c, s:s + tw], v[a * 4 + 1, c, s:s + tw], v[a * 4 + 2, c, s:s + tw], v[a * 4 + 3, c, s:s + tw]
                for tx in range(tw):
                    x0 = 2 * tx
                    d0, d1, d2, d3 = row[x0], row[x0 + 1], row[x0 + 2], row[x0 + 3]
                    v0[tx], v1[tx], v2[tx], v3[tx] = _bt2(d0, d1, d2, d3, 0), _bt2(d0, d1, d2, d3, 1), _bt2(d0, d1, d2, d3, 2), _bt2(d0, d1, d2, d3, 3)


@njit(cache=True, fastmath=True, inline="always")
def _at2(m0, m1, m2, m3, r):
    if r == 0:
        return m0 + m1 + m2
    return m1 - m2 - m3


@njit(parallel=True, cache=True)
def output_transform4(m, th, tw, bias, epf, grid, out):
    """m (36, O', th*tw) -> out (O, H, W) = A^T m A per tile, cropped, with bias, activation and grid:
    16 tiles of a tile row per `at4_block`."""
    O, oh, ow = out.shape
    rows, tiles = m.shape[1], m.shape[2]
    mf = m.reshape(-1)
    for o in prange(O):
        of = out[o].reshape(-1)
        if tw == 4:     # four tile rows per call (a 14x14 map would fill a quarter of the lanes)
            for ty in range(0, th, 4):
                at4_block(mf, o * tiles + ty * 4, rows * tiles, min(16, tiles - ty * 4), of, 4 * ty * ow, ow,
                          oh - 4 * ty, ow, 1, bias[o], epf, grid)
            continue
        for ty in range(th):
            for tx0 in range(0, tw, 16):
                at4_block(mf, o * tiles + ty * tw + tx0, rows * tiles, tw - tx0, of, 4 * ty * ow + 4 * tx0, ow,
                          min(4, oh - 4 * ty), ow - 4 * tx0, 0, bias[o], epf, grid)


@njit(parallel=True, cache=True, fastmath=True)
def output_transform2(m, th, tw, bias, act, grid, out):
    """m (16, O', th*tw) -> out (O, H, W) = A^T m A per 4x4 tile, cropped, with bias, activation and grid."""
    O, oh, ow = out.shape
    for o in prange(O):
        t2 = np.empty((4, 2 * tw), np.float32)
        bo = bias[o]
        for ty in range(th):
            t0 = ty * tw
            for i in range(4):
                s0, s1, s2, s3 = (m[i * 4, o, t0:t0 + tw], m[i * 4 + 1, o, t0:t0 + tw], m[i * 4 + 2, o, t0:t0 + tw],
                                  m[i * 4 + 3, o, t0:t0 + tw])
                row = t2[i]
                for tx in range(tw):
                    m0, m1, m2, m3 = s0[tx], s1[tx], s2[tx], s3[tx]
                    row[2 * tx] = _at2(m0, m1, m2, m3, 0)
                    row[2 * tx + 1] = _at2(m0, m1, m2, m3, 1)
            for r in range(2):
                y = ty * 2 + r
                if y >= oh:
                    break
                dst = out[o, y]
                for x in range(ow):
                    dst[x] = _finish(bo + _at2(t2[0, x], t2[1, x], t2[2, x], t2[3, x], r), act, grid)


def tile_size(oh: int, ow: int) -> int:
    """4 when the map has a vector's worth of 4x4 tiles, else 2."""
    return 4 if (-(-oh // 4)) * (-(-ow // 4)) >= 16 else 2


class Winograd:
    """Prepared state for one convolution: transformed, packed weights and the scratch buffers."""

    def __init__(self, weight, bias, cin, h, w, oh, ow, t, l, act, grid):
        m = self.m = tile_size(oh, ow)
        a2 = (m + 2) ** 2
        cout = weight.shape[0]
        u = transform_weights(weight.reshape(cout, cin, 3, 3), m)
        self.nob = -(-cout // OCB)
        self.th, self.tw = -(-oh // m), -(-ow // m)
        # few tiles per position (a 28x28 map has 49): output channels in the vector lanes
        self.oc = suits(self.th * self.tw, cin * cout * 4)
        pack = pack32 if self.oc else pack_weights
        self.wp = np.concatenate([pack(u[k]) for k in range(a2)])
        tiles = self.th * self.tw
        self.h, self.w, self.t, self.l, self.cin = h, w, t, l, cin
        self.padded = np.zeros((cin, self.th * m + 2, self.tw * m + 2), np.float32) if m == 2 else None
        self.bias, self.act, self.grid = np.asarray(bias, np.float32), act, grid
        self.out_epf, self.on_grid = epilogue(act, grid), 1 if grid[1] > 0 else 0
        self.epf = epilogue(0, (1, 0, 0, 0))
        self.zero_bias = np.zeros(-(-cout // 32) * 32 if self.oc else self.nob * OCB, np.float32)
        self.a2, self.tiles = a2, tiles
        self.kc = k_block(cin, self.nob * OCB, tile_count(tiles))
        self.fwd = sized(input_transform4 if m == 4 else input_transform2, a2 * cin * tiles * 4)
        self.gemm = sized(ocgemm if self.oc else gemm_batched, a2 * self.nob * OCB * cin * tiles // 16)
        self.cout = cout
        self.inv = sized(output_transform4 if m == 4 else output_transform2, cout * oh * ow * 8)

    def __call__(self, x, y):
        cin, tiles, rows, a2 = self.cin, self.tiles, self.nob * OCB, self.a2
        v, mm = scratch("winograd_in", (a2, cin, tiles)), scratch("winograd_out", (a2, rows, tiles))
        if self.m == 4:         # reads the input in place, padding as zeros
            self.fwd(np.ascontiguousarray(x), self.t, self.l, self.th, self.tw, v)
        else:
            p = self.padded
            hh = min(self.h, p.shape[1] - self.t)
            ww = min(self.w, p.shape[2] - self.l)
            p[:, self.t:self.t + hh, self.l:self.l + ww] = x[:, :hh, :ww]
            self.fwd(p, self.th, self.tw, v)
        if self.oc:
            self.gemm(v.reshape(-1), tiles, cin * tiles, tiles, self.wp, self.wp.size // a2, cin, self.cout,
                      self.zero_bias, self.epf, 0, mm.reshape(-1), tiles, rows * tiles, a2)
        else:
            self.gemm(v.reshape(-1), tiles, cin * tiles, tiles, self.wp, rows * cin, cin, self.kc, self.nob,
                      self.zero_bias, self.epf, mm.reshape(-1), tiles, rows * tiles, a2)
        if self.m == 4:
            self.inv(mm, self.th, self.tw, self.bias, self.out_epf, self.on_grid, y)
        else:
            self.inv(mm, self.th, self.tw, self.bias, self.act, self.grid, y)
