"""Int8 convolutions on integer arithmetic, the way MNN runs a `symmetricQuan` convolution.

The float input is quantized once to its int8 grid, in steps k = round(x / s) (half away from zero, as
MNN; stored as the byte u8 = k + off with off = 128 + zero point, that is q + 128; channels last, so an
im2col row is a few contiguous copies and the padding, real 0, is the byte off), multiplied by the int8
weights with 32-bit accumulation (`vnni`), and the accumulator is rescaled in MNN's own float order
with the offset folded into the bias (`vnni.epilogue`), given the activation, and rounded to the
output's int8 grid, or left float for an outputDataType DT_FLOAT layer. Between operators tensors stay
float on that grid, so every other kernel is unchanged.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from . import sized
from .grid import mnn_round
from .vnni import Int8Weights, epilogue, pixel_blocks


@njit(cache=True, fastmath=True, inline="always")
def _byte(v, inv_s, lo, hi, off):
    return np.uint32(np.int32(min(max(mnn_round(v * inv_s), lo), hi)) + off)


@njit(parallel=True, cache=True, fastmath=True)
def quantize_hwc(x, inv_s, lo, hi, off, t, l, xq):
    """x (C, H, W) float -> xq[t + y, l + x, c] = clip(round(x / s)) + off; the border is left as written."""
    C, H, W = x.shape
    for y in prange(H):
        dst = xq[t + y]
        for c in range(C):
            src = x[c, y]
            for i in range(W):
                dst[l + i, c] = np.uint8(_byte(src[i], inv_s, lo, hi, off))


@njit(parallel=True, cache=True)
def im2col_packed(g32, kh, kw, sh, sw, dh, dw, oh, ow, cols):
    """cols[p // 16, k4, p % 16] = 4 bytes of pixel p's window, K = (i, j, c): the tile's pixel blocks.

    g32 is the HWC grid viewed as uint32 (4 channels per word); cols is (blocks, K/4, 16) uint32.
    """
    c4 = g32.shape[2]
    for pb in prange(cols.shape[0]):
        for pl in range(16):
            p = pb * 16 + pl
            if p >= oh * ow:
                break
            y, x = p // ow, p % ow
            for i in range(kh):
                for j in range(kw):
                    src = g32[y * sh + i * dh, x * sw + j * dw]
                    base = (i * kw + j) * c4
                    for c in range(c4):
                        cols[pb, base + c, pl] = src[c]


@njit(parallel=True, cache=True, fastmath=True)
def quantize_packed(x, inv_s, lo, hi, off, cols):
    """x (C, P) float -> cols (blocks, C/4, 16) uint32 words of 4 channels: the pixel blocks of a 1x1
    stride-1 convolution, written directly; whole blocks are one vectorized pass over four rows."""
    C, P = x.shape
    for pb in prange(cols.shape[0]):
        p0 = pb * 16
        for kb in range(cols.shape[1]):
            dst = cols[pb, kb]
            c = 4 * kb
            if p0 + 16 <= P and c + 4 <= C:
                r0, r1, r2, r3 = x[c, p0:p0 + 16], x[c + 1, p0:p0 + 16], x[c + 2, p0:p0 + 16], x[c + 3, p0:p0 + 16]
                for k in range(16):
                    dst[k] = (_byte(r0[k], inv_s, lo, hi, off) | _byte(r1[k], inv_s, lo, hi, off) << 8
                              | _byte(r2[k], inv_s, lo, hi, off) << 16 | _byte(r3[k], inv_s, lo, hi, off) << 24)
            else:
                for k in range(16):
                    word = np.uint32(0)
                    for j in range(4):
                        b = _byte(x[c + j, p0 + k], inv_s, lo, hi, off) if c + j < C and p0 + k < P else np.uint32(off)
                        word |= b << (8 * j)
                    dst[k] = word


def int8_convolution(geometry, q, alpha, bias, act, grids, in_shape, out_shape, threads: int):
    """The kernel function for one int8 convolution (group 1), or None when the geometry is not covered.

    `q` (O, C*kh*kw) int8 in (c, i, j) order with per-channel `alpha`; `grids` a conv.Int8Grids.
    """
    kh, kw, sh, sw, dh, dw, t, l, b, r = geometry
    (s_in, lo, hi) = grids.input
    off = 128 + grids.zero_in
    if not (0 <= lo + off and hi + off <= 255):
        return None
    n, cin, h, w = in_shape
    _, cout, oh, ow = out_shape
    if q.shape[1] != cin * kh * kw:
        return None
    cp = -(-cin // 4) * 4
    wk = np.zeros((cout, kh, kw, cp), np.int8)
    wk[..., :cin] = q.reshape(cout, cin, kh, kw).transpose(0, 2, 3, 1)
    k4 = kh * kw * cp // 4
    out_grid = None if grids.output is None else (*grids.output, grids.zero_out)
    rows, epf = epilogue(alpha, bias, q.astype(np.int64).sum(1), s_in, grids.zero_in, out_grid, act)
    # VNNI does 16 multiply-adds per element operation of kernels.sized's measure
    weights = Int8Weights(wk.reshape(cout, -1), *rows, cout * oh * ow * k4 * 4 // 16, threads)
    f32 = np.float32
    pixels = oh * ow
    cols = np.full((pixel_blocks(pixels), k4, 16, 4), off, np.uint8)
    direct = kh == kw == 1 and sh == sw == 1 and not (t or l or b or r)   # quantize straight into the blocks
    words, flat = cols.view(np.uint32).reshape(cols.shape[:3]), cols.reshape(-1)
    grid = None if direct else np.full((h + t + b, w + l + r, cp), off, np.uint8)
    grid32 = None if direct else grid.view(np.uint32)
    inv_in = f32(1 / s_in)
    quantize = sized(quantize_packed if direct else quantize_hwc, cin * h * w, threads)
    unfold = None if direct else sized(im2col_packed, words.size, threads)

    def run(inputs, outputs):
        x, y = inputs[0], outputs[0]
        for i in range(n):
            if direct:
                quantize(x[i].reshape(cin, pixels), inv_in, lo, hi, off, words)
            else:
                quantize(x[i], inv_in, lo, hi, off, t, l, grid)
                unfold(grid32, kh, kw, sh, sw, dh, dw, oh, ow, words)
            dst = y[i].reshape(cout, pixels)
            weights.matmul(flat, epf, dst)
    return run
