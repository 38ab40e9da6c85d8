"""Winograd F(m x m, 3x3), m = 4 or 2, for stride-1 3x3 convolutions (Lavin & Gray, 2015): F(4x4) does
4x fewer multiplies than im2col, F(2x2) 2.25x; F(2x2) where a map has too few 4x4 tiles to fill a vector.

The transforms are LLVM IR (`winograd_ir`) reading the input in place (padding as zeros): for F(4x4),
per channel and tile row, B^T down 16 columns at a time, then B across 16 tiles in the vector lanes;
the output block does A^T, A, bias, activation and grid for 16 tiles. F(2x2) (maps of 7x7 and less,
4 tiles to a row) gathers each tap of 16 tiles through index tables and scatters the outputs. The
alpha^2 = (m+2)^2 products are one batched GEMM (`float_gemm`, or `few_pixel_gemm` for few tiles) on weights
transformed and packed at prepare.
"""
from __future__ import annotations

import numpy as np
from ..compile.jit import njit, prange

from .. import scratch, sized
from .float_gemm import IDENTITY, OCB, epilogue_of, gemm_batched, k_block, tile_count
from .epilogue import NO_POST
from .few_pixel_gemm import OCB as OC_BLOCK, ocgemm, suits
from .winograd_ir import at4_block, bt4_cols, bt4_tiles, f2_in, f2_out

G4 = np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6], [1 / 24, 1 / 12, 1 / 6],
               [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]], np.float64)
G2 = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], np.float64)


def _taps_to_positions(m: int) -> np.ndarray:
    """G (x) G in float32, (alpha^2, 9): row a*alpha+b maps a 3x3 kernel's taps to (G w G^T)[a, b]."""
    g = G4 if m == 4 else G2
    return np.kron(g, g).astype(np.float32)


def transform_weights(w: np.ndarray, m: int) -> np.ndarray:
    """(O, C, 3, 3) -> U (alpha^2, O, C) with U[a*alpha+b] = (G w G^T)[a, b] (the reference layout;
    `transform_packed` makes the kernels')."""
    o, c = w.shape[:2]
    return (_taps_to_positions(m) @ np.asarray(w, np.float32).reshape(o * c, 9).T).reshape(-1, o, c)


def transform_packed(w: np.ndarray, m: int, block: int) -> np.ndarray:
    """U packed as the GEMMs read it, flat [alpha^2][O/block][C][block] (float_gemm.pack_stacked of
    `transform_weights`), by one float32 GEMM with the Kronecker product G (x) G whose columns are the
    taps already in that order: only the 3x3 taps are moved, not the alpha^2/9 times larger result
    (ResNet-18's 13 layers: 325 ms as a float64 three-operand einsum plus ~120 of packing; ~30 so)."""
    from .. import aligned_empty
    o, c = w.shape[:2]
    nb = -(-o // block)
    taps = np.zeros((nb * block, c, 9), np.float32)
    taps[:o] = w.reshape(o, c, 9)
    cols = np.ascontiguousarray(taps.reshape(nb, block, c, 9).transpose(0, 2, 1, 3)).reshape(-1, 9)
    out = aligned_empty((m + 2) ** 2 * cols.shape[0])
    np.matmul(_taps_to_positions(m), cols.T, out=out.reshape(-1, cols.shape[0]))
    return out


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
        t1 = np.zeros((6, span), np.float32)
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


def f2_tables(h, w, oh, ow, t, l, th, tw):
    """For the gather/scatter F(2x2) kernels, per group of 16 tiles (tile = 16g + lane at (ty, tx)):
    each patch tap's input offset and the lanes inside the image, and each output's offset and the
    lanes inside the (cropped) map."""
    tiles = th * tw
    groups = -(-tiles // 16)
    tile = np.arange(groups * 16).reshape(groups, 1, 16)
    ty, tx = tile // tw, tile % tw
    live = tile < tiles
    i, j = np.arange(4).repeat(4).reshape(1, 16, 1), np.tile(np.arange(4), 4).reshape(1, 16, 1)
    y, x = 2 * ty + i - t, 2 * tx + j - l
    inside = live & (y >= 0) & (y < h) & (x >= 0) & (x < w)
    in_idx = np.where(inside, y * w + x, 0).astype(np.int64)
    r, q = np.array([0, 0, 1, 1]).reshape(1, 4, 1), np.array([0, 1, 0, 1]).reshape(1, 4, 1)
    oy, ox = 2 * ty + r, 2 * tx + q
    shown = live & (oy < oh) & (ox < ow)
    out_idx = np.where(shown, oy * ow + ox, 0).astype(np.int64)
    bits = 1 << np.arange(16)
    return (in_idx.reshape(-1), (inside * bits).sum(axis=2).reshape(-1).astype(np.int64),
            out_idx.reshape(-1), (shown * bits).sum(axis=2).reshape(-1).astype(np.int64))


@njit(parallel=True, cache=True)
def input_transform2(x, in_idx, in_mask, tiles, v):
    """x (C, H, W) read in place -> v (16, C, tiles), 16 tiles per gather step (`f2_tables`)."""
    C, H, W = x.shape
    xf, vf = x.reshape(-1), v.reshape(-1)
    groups = (tiles + 15) // 16
    for c in prange(C):
        for g in range(groups):
            f2_in(xf, c * H * W, in_idx, 256 * g, in_mask, 16 * g, vf, c * tiles + 16 * g, C * tiles, tiles - 16 * g)


@njit(parallel=True, cache=True)
def output_transform2(m, out_idx, out_mask, bias, epf, grid, out):
    """m (16, O', tiles) -> out (O, H, W) with bias, activation and grid, 16 tiles per scatter step."""
    O, oh, ow = out.shape
    rows, tiles = m.shape[1], m.shape[2]
    mf, of = m.reshape(-1), out.reshape(-1)
    groups = (tiles + 15) // 16
    for o in prange(O):
        for g in range(groups):
            f2_out(mf, o * tiles + 16 * g, rows * tiles, tiles - 16 * g, of, o * oh * ow, out_idx, 64 * g, out_mask,
                   4 * g, bias[o], epf, grid)


@njit(parallel=True, cache=True)
def output_transform4(m, th, tw, bias, epf, grid, out, ty0):
    """m (36, O', th*tw) -> out (O, H, W) = A^T m A per tile, cropped, with bias, activation and grid:
    16 tiles of a tile row per `at4_block`. m holds the tile rows from ty0 on."""
    O, oh, ow = out.shape
    rows, tiles = m.shape[1], m.shape[2]
    mf = m.reshape(-1)
    for o in prange(O):
        of = out[o].reshape(-1)
        if tw == 4:     # four tile rows per call (a 14x14 map would fill a quarter of the lanes)
            for ty in range(0, th, 4):
                y = 4 * (ty0 + ty)
                at4_block(mf, o * tiles + ty * 4, rows * tiles, min(16, tiles - ty * 4), of, y * ow, ow,
                          oh - y, ow, 1, bias[o], epf, grid)
            continue
        for ty in range(th):
            y = 4 * (ty0 + ty)
            for tx0 in range(0, tw, 16):
                at4_block(mf, o * tiles + ty * tw + tx0, rows * tiles, tw - tx0, of, y * ow + 4 * tx0, ow,
                          min(4, oh - y), ow - 4 * tx0, 0, bias[o], epf, grid)


def tile_size(oh: int, ow: int) -> int:
    """4 when the map has a vector's worth of 4x4 tiles, else 2."""
    return 4 if (-(-oh // 4)) * (-(-ow // 4)) >= 16 else 2


CHUNK_BYTES = 1 << 20      # transformed input and products of one chunk of tile rows (L2 is 2 MB)


class Winograd:
    """Prepared state for one convolution: transformed, packed weights and the scratch buffers."""

    def __init__(self, weight, bias, cin, h, w, oh, ow, t, l, act, grid, threads: int, post=NO_POST):
        m = self.m = tile_size(oh, ow)
        a2 = (m + 2) ** 2
        cout = weight.shape[0]
        self.nob = -(-cout // OCB)
        self.th, self.tw = -(-oh // m), -(-ow // m)
        # few tiles per position (a 28x28 map has 49): output channels in the vector lanes
        self.oc = suits(self.th * self.tw, cin * cout * 4)
        from ..weight_cache import packed_once      # shared by the plans of every input shape
        self.wp = packed_once(transform_packed, weight.reshape(cout, cin, 3, 3), m, OC_BLOCK if self.oc else OCB)
        tiles = self.th * self.tw
        self.t, self.l, self.cin = t, l, cin
        if m == 2:      # gathers and scatters through index tables, 16 tiles a step
            self.in_idx, self.in_mask, self.out_idx, self.out_mask = f2_tables(h, w, oh, ow, t, l, self.th, self.tw)
        self.bias = np.asarray(bias, np.float32)
        self.out_epf, self.on_grid = epilogue_of(act, grid, post)
        self.zero_bias = np.zeros(-(-cout // OC_BLOCK) * OC_BLOCK if self.oc else self.nob * OCB, np.float32)
        self.a2, self.tiles = a2, tiles
        self.fwd = sized(input_transform4 if m == 4 else input_transform2, a2 * cin * tiles * 4, threads)
        self.gemm = sized(ocgemm if self.oc else gemm_batched, a2 * self.nob * OCB * cin * tiles // 16, threads)
        self.cout = cout
        self.inv = sized(output_transform4 if m == 4 else output_transform2, cout * oh * ow * 8, threads)
        # F(4x4) on large maps: tile rows a chunk at a time (at least 4: narrower GEMMs lose more than
        # they gain), so the transformed input and the products (36 x (cin + cout) floats a tile) stay
        # in L2 between the transforms and the GEMMs. 1 thread, SiLU epilogue: 32->64 at 112x112
        # 1.94 -> 1.85 ms, 24->32 0.90 -> 0.78, 16->16 at 150x150 0.82 -> 0.69; 64->64 at 56x56 (3.6 MB
        # whole) 0.70 -> 0.77 in chunks of 4, so it stays whole
        per_row = a2 * (cin + self.nob * OCB) * self.tw * 4
        whole = m != 4 or self.oc or per_row * self.th <= 4 * CHUNK_BYTES
        self.chunk = self.th if whole else min(self.th, max(4, CHUNK_BYTES // per_row))
        self.kc = k_block(cin, self.nob * OCB, tile_count(self.chunk * self.tw))

    def __call__(self, x, y):
        x = np.ascontiguousarray(x)         # read in place, padding as zeros
        if self.m == 4 and not self.oc:
            return self._tile_rows(x, y)
        cin, tiles, rows, a2 = self.cin, self.tiles, self.nob * OCB, self.a2
        v, mm = scratch("winograd_in", (a2, cin, tiles)), scratch("winograd_out", (a2, rows, tiles))
        if self.m == 4:
            self.fwd(x, self.t, self.l, self.th, self.tw, v)
        else:
            self.fwd(x, self.in_idx, self.in_mask, tiles, v)
        if self.oc:
            self.gemm(v.reshape(-1), tiles, cin * tiles, tiles, self.wp, self.wp.size // a2, cin, self.cout,
                      self.zero_bias, IDENTITY, 0, mm.reshape(-1), tiles, rows * tiles, a2)
        else:
            self.gemm(v.reshape(-1), tiles, cin * tiles, tiles, self.wp, rows * cin, cin, self.kc, self.nob * OCB,
                      self.zero_bias, IDENTITY, 0, mm.reshape(-1), tiles, rows * tiles, a2, False)
        if self.m == 4:
            self.inv(mm, self.th, self.tw, self.bias, self.out_epf, self.on_grid, y, 0)
        else:
            self.inv(mm, self.out_idx, self.out_mask, self.bias, self.out_epf, self.on_grid, y)

    def _tile_rows(self, x, y):
        """F(4x4) on float_gemm's GEMMs, `chunk` tile rows at a time (all of them on a small map)."""
        cin, rows, a2, tw = self.cin, self.nob * OCB, self.a2, self.tw
        for ty0 in range(0, self.th, self.chunk):
            th = min(self.chunk, self.th - ty0)
            tiles = th * tw
            v, mm = scratch("winograd_in", (a2, cin, tiles)), scratch("winograd_out", (a2, rows, tiles))
            # the chunk's first padded row is 4 * ty0 - t of the input
            self.fwd(x, self.t - 4 * ty0, self.l, th, tw, v)
            self.gemm(v.reshape(-1), tiles, cin * tiles, tiles, self.wp, rows * cin, cin, self.kc, rows,
                      self.zero_bias, IDENTITY, 0, mm.reshape(-1), tiles, rows * tiles, a2, False)
            self.inv(mm, th, tw, self.bias, self.out_epf, self.on_grid, y, ty0)
