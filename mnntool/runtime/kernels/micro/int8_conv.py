"""Int8 convolutions on integer arithmetic, the way MNN runs a `symmetricQuan` convolution.

The float input is quantized once to its int8 grid, in steps k = round(x / s) (half away from zero, as
MNN; stored as the byte u8 = k + off with off = 128 + zero point, that is q + 128; four channels to a
word and the words of a row side by side (`quantize_rows`), so the pixels of an output row are runs of
words for every tap (`im2col_rows`; the GEMM of a stride-1 window reads a grid in planes of words in place,
`quantize_planes`, int8_gemm.gemm_planes),
and the padding, real 0, is the byte off), multiplied by the int8
weights with 32-bit accumulation (`int8_gemm`), and the accumulator is rescaled in MNN's own float order
with the offset folded into the bias (`int8_gemm.epilogue`), given the activation, and rounded to the
output's int8 grid, or left float for an outputDataType DT_FLOAT layer. Between operators tensors stay
float on that grid, so every other kernel is unchanged.
"""
from __future__ import annotations

import copy

import numpy as np
from ..compile.jit import intrinsic, njit, prange, types

from .. import Scratch, sized
from .epilogue import EXACT, act_bounds, activation, grid_of, mnn_cast, to_grid_z
from .int8_gemm import NO_TABLE, Int8Weights, byte_table, epilogue, lut_chunk, pixel_blocks
from .int8_lanes_oc import OcLanesWeights, lane_fill
from .int8_lut import lut_values, value_planes
from .llvm_ir import declare, host_has


@njit(cache=True, fastmath=EXACT, inline="always")
def _byte(v, inv_s, z, lo, hi):
    """MNN's stored byte for v: its int8 cast (grid.mnn_cast, zero point z, bounds in int8 values) + 128."""
    return np.uint32(np.int32(mnn_cast(v, inv_s, z, lo, hi)) + 128)


@njit(cache=True, fastmath=EXACT, inline="always")
def _word(a, b, c, d, byte, bp):
    """The word of four channels' bytes (byte(v, bp): `_cast_byte` or `_grid_byte`), the first in the low byte."""
    return byte(a, bp) | byte(b, bp) << 8 | byte(c, bp) << 16 | byte(d, bp) << 24


@njit(cache=True, fastmath=EXACT, inline="always")
def _pack_row(x, c, y, byte, bp, off, dst):
    """dst[i] = the word of channels c..c+3 of x (C, H, W) at (y, i) for i < W, the byte `off` (real 0)
    past the last channel: whole words in one vectorized pass over four rows, the channel tail per byte.
    quantize_rows' and quantize_planes' row."""
    C, W = x.shape[0], x.shape[2]
    if c + 4 <= C:
        r0, r1, r2, r3 = x[c, y], x[c + 1, y], x[c + 2, y], x[c + 3, y]
        for i in range(W):
            dst[i] = _word(r0[i], r1[i], r2[i], r3[i], byte, bp)
    else:
        for i in range(W):
            word = np.uint32(0)
            for j in range(4):
                q = byte(x[c + j, y, i], bp) if c + j < C else np.uint32(off)
                word |= q << (8 * j)
            dst[i] = word


@njit(parallel=True, cache=True, fastmath=EXACT)
def quantize_rows(x, inv_s, z, lo, hi, off, t, l, g32):
    """x (C, H, W) float -> g32[t + y, k, l + x] = the word of channels 4k..4k+3's bytes (_byte; the
    byte `off`, real 0, past the last channel): the grid in rows of words, so a pixel run of one output
    row is one run of words for every tap and word (im2col_rows), and four channel rows quantize in one
    vectorized pass (0.24 -> 0.06 ms for 64 channels of 56x56 against bytes channels-last, one Zen 4
    core). The border is left as written."""
    C, H, W = x.shape
    c4 = g32.shape[1]
    for y in prange(H):
        for k in range(c4):
            _pack_row(x, 4 * k, y, _cast_byte, (inv_s, z, lo, hi), off, g32[t + y, k, l:l + W])


@njit(parallel=True, cache=True, fastmath=EXACT)
def quantize_planes(x, inv_s, z, lo, hi, off, t, l, sh, sw, g32):
    """`_planes_walk` with MNN's cast (`_cast_byte`)."""
    _planes_walk(x, _cast_byte, (inv_s, z, lo, hi), off, t, l, sh, sw, g32)


@njit(parallel=True, cache=True, fastmath=EXACT)
def quantize_planes_grid(x, inv_s, off, t, l, sh, sw, g32):
    """quantize_planes for an input on the convolution's own grid (an int8 layer's output rounded to it:
    DenseNet's and ResNet's 3x3 layers): the same bytes in fewer vector steps (`_byte_on_grid`)."""
    _planes_walk(x, _grid_byte, (inv_s, np.float32(off)), off, t, l, sh, sw, g32)


@njit(cache=True, fastmath=EXACT, inline="always")
def _planes_walk(x, byte, bp, off, t, l, sh, sw, g32):
    """x (C, H, W) float -> the grid a window's GEMM reads in place (int8_gemm.gemm_planes): planes of
    words (4 channels' bytes, `_byte`; the byte `off` past the last channel), one a (row phase, column
    phase, channel word), the padded pixel (Y, X) = (y + t, x + l) in plane ((Y % sh) * sw + X % sw) * C/4
    + k at row Y // sh, column X // sw. At stride 1 one phase (the padded map at the planes' pitch, see
    plane_pitch); at stride 2 four, so each tap of the window is again a run of words for consecutive
    output pixels (no im2col pass: 0.29 ms of a 7x7 stride-2 stem's 1.2 ms). Padding (real 0) is
    left as written."""
    C, H, W = x.shape
    c4 = -(-C // 4)
    for y in prange(H):
        yy = y + t
        a, row = yy % sh, yy // sh
        words = np.empty(W, np.uint32)
        for k in range(c4):
            c = 4 * k
            if sw == 2 and c + 4 <= C:
                # both column phases in one loop: LLVM vectorizes the stride-2 reads as an interleaved
                # group (the word pass then two strided copies cost 0.10 ms for 64 channels of 56x56)
                r0, r1, r2, r3 = x[c, y], x[c + 1, y], x[c + 2, y], x[c + 3, y]
                ev = g32[(a * 2 + l % 2) * c4 + k, row, l // 2:]
                od = g32[(a * 2 + (l + 1) % 2) * c4 + k, row, (l + 1) // 2:]
                for m in range(W // 2):
                    i = 2 * m
                    ev[m] = _word(r0[i], r1[i], r2[i], r3[i], byte, bp)
                    od[m] = _word(r0[i + 1], r1[i + 1], r2[i + 1], r3[i + 1], byte, bp)
                if W % 2:
                    i = W - 1
                    ev[W // 2] = _word(r0[i], r1[i], r2[i], r3[i], byte, bp)
                continue
            # the row's words in one vectorized pass (in place at stride 1), then each column phase's
            # share copied out: quantizing with strided reads ran 5x slower (0.31 ms for a 3x224x224 stem)
            _pack_row(x, c, y, byte, bp, off, g32[a * sw * c4 + k, row, l:l + W] if sw == 1 else words)
            if sw > 1:
                for ph in range(sw):
                    out = g32[(a * sw + ph) * c4 + k, row]
                    x0 = (ph - l) % sw
                    d0 = (x0 + l) // sw
                    for m in range((W - x0 + sw - 1) // sw):
                        out[d0 + m] = words[x0 + m * sw]


def plane_pitch(w: int, l: int, r: int, sw: int) -> int:
    """The row pitch of quantize_planes' grid: at stride 1 W + max(l, r) words, the left and right
    padding of consecutive rows shared (row y's right padding runs on into row y + 1's left padding, real
    0 both), so fewer of gemm_planes' lanes fall past the output rows (56-pixel rows with padding 1: a
    pitch of 57, not 58); at a larger stride a phase's whole padded row."""
    return w + max(l, r) if sw == 1 else -(-(w + l + r) // sw)


def plane_fill(oh: int, ow: int, pitch: int) -> float:
    """The share of gemm_planes' lanes (tiles of 32 virtual pixels) that are output pixels."""
    virtual = (oh - 1) * pitch + ow
    return oh * ow / (32 * -(-virtual // 32))


@njit(parallel=True, cache=True)
def im2col_rows(g32, kh, kw, sh, sw, dh, dw, oh, ow, cols):
    """cols[p // 16, k4, p % 16] = 4 bytes of pixel p's window, K = (i, j, c): the tile's pixel blocks,
    from the grid in rows of words g32 (H, C/4, W) (quantize_rows); cols is (blocks, K/4, 16) uint32,
    its pixels past the last left as they are. Each block's 16 window starts are found once, then every
    (tap, word) row of the block is 16 loads at those starts plus the tap's offset (consecutive words
    within an output row at stride 1). The per-pixel copies this replaces made a slice per pixel and
    tap: a 7x7 stride-2 stem on 3 channels spent 1.64 ms there, twice its GEMM (one Zen 4 core)."""
    c4, wg = g32.shape[1], g32.shape[2]
    src = g32.reshape(-1)
    pixels = oh * ow
    for pb in prange(cols.shape[0]):
        p0 = pb * 16
        if p0 >= pixels:
            continue
        n = min(16, pixels - p0)
        start = np.empty(16, np.int64)
        for pl in range(16):
            p = p0 + min(pl, n - 1)
            start[pl] = (p // ow) * sh * c4 * wg + (p % ow) * sw
        dst = cols[pb]
        for i in range(kh):
            for j in range(kw):
                tap = i * dh * c4 * wg + j * dw
                base = (i * kw + j) * c4
                for c in range(c4):
                    row = dst[base + c]
                    at = tap + c * wg
                    if n == 16:
                        for pl in range(16):
                            row[pl] = src[start[pl] + at]
                    else:
                        for pl in range(n):
                            row[pl] = src[start[pl] + at]


# maps of at least PACK_RUN whole pixel blocks and PACK_RUNS_MIN floats are packed a row run at a time:
# PACK_RUN blocks (1 KB of each float row) by PACK_GROUP words (64 channels). Block by block, every block
# reads a line from each of C rows: too many streams for the prefetchers once the input is out of cache (a
# 1x1 layer's input was written long before: DenseNet's concatenations). With the input evicted first,
# one Zen 4 core (tmp_dev/int8e/walk_try2.py): 256 x 3136 affine 728 -> 290 us, 512 x 784 324 -> 173;
# in cache 184 -> 145, 96 -> 77. Below these sizes (14x14 maps and less; the input is in L2) the run order
# cost more than it saved (1024 x 49: 10.8 -> 19.3 us in cache), so the walk keeps block order there.
PACK_RUN = 16
PACK_GROUP = 16
PACK_RUNS_MIN = 1 << 18


@njit(cache=True, fastmath=EXACT, inline="always")
def _packed_walk(x, chan, value, vp, byte, bp, off, cols):
    """The one walk of every 1x1 packing kernel: x (C, P) float -> cols (blocks, C/4, 16) uint32 words of 4
    channels, the pixel blocks of a 1x1 stride-1 convolution, written directly; whole blocks are one
    vectorized pass over four rows, the tails per byte (`off`, real 0, past the last channel or pixel).
    A byte is byte(value(v, chan(vp, c)), bp): `chan` takes channel c's parameters out of `vp` once per
    four rows, `value` is the float the layer reads (v itself, a product, an affine map) and `byte` its
    stored byte. The callers pass these functions as constants, so Numba compiles one specialized loop per
    form. Two orders (PACK_RUN): block by block on small maps, row runs on large ones; the same bytes."""
    C, P = x.shape
    nblk, k4 = cols.shape[0], cols.shape[1]
    nbw, k4w = P // 16, C // 4
    if nbw < PACK_RUN or C * P < PACK_RUNS_MIN:
        for pb in prange(nblk):
            p0 = pb * 16
            for kb in range(k4):
                dst = cols[pb, kb]
                c = 4 * kb
                if p0 + 16 <= P and c + 4 <= C:
                    r0, r1, r2, r3 = x[c, p0:p0 + 16], x[c + 1, p0:p0 + 16], x[c + 2, p0:p0 + 16], x[c + 3, p0:p0 + 16]
                    # one assignment each: a tuple unpacked from these calls confuses the parfor array analysis
                    q0 = chan(vp, c)
                    q1 = chan(vp, c + 1)
                    q2 = chan(vp, c + 2)
                    q3 = chan(vp, c + 3)
                    for k in range(16):
                        dst[k] = (byte(value(r0[k], q0), bp) | byte(value(r1[k], q1), bp) << 8
                                  | byte(value(r2[k], q2), bp) << 16 | byte(value(r3[k], q3), bp) << 24)
                else:
                    for k in range(16):
                        word = np.uint32(0)
                        for j in range(4):
                            b = byte(value(x[c + j, p0 + k], chan(vp, c + j)), bp) if c + j < C and p0 + k < P \
                                else np.uint32(off)
                            word |= b << (8 * j)
                        dst[k] = word
        return
    # whole blocks a row run at a time (the same vectorized pass; a helper for it, or one nest for both
    # orders with run lengths of 1, lost the vectorization: 2-3x slower), then the tail blocks
    groups = -(-k4w // PACK_GROUP)
    for it in prange(-(-nbw // PACK_RUN) * groups):
        b0, g0 = it // groups * PACK_RUN, it % groups * PACK_GROUP
        b1 = min(nbw, b0 + PACK_RUN)
        for kb in range(g0, min(k4w, g0 + PACK_GROUP)):
            c = 4 * kb
            q0 = chan(vp, c)
            q1 = chan(vp, c + 1)
            q2 = chan(vp, c + 2)
            q3 = chan(vp, c + 3)
            for pb in range(b0, b1):
                p0 = pb * 16
                dst = cols[pb, kb]
                r0, r1, r2, r3 = x[c, p0:p0 + 16], x[c + 1, p0:p0 + 16], x[c + 2, p0:p0 + 16], x[c + 3, p0:p0 + 16]
                for k in range(16):
                    dst[k] = (byte(value(r0[k], q0), bp) | byte(value(r1[k], q1), bp) << 8
                              | byte(value(r2[k], q2), bp) << 16 | byte(value(r3[k], q3), bp) << 24)
    # the channel tail of the whole blocks (t < ct), then every word of the pixel tail block
    ct = nbw * (k4 - k4w)
    for t in prange(ct + (nblk - nbw) * k4):
        if t < ct:
            pb, kb = t // (k4 - k4w), k4w + t % (k4 - k4w)
        else:
            pb, kb = nbw + (t - ct) // k4, (t - ct) % k4
        p0, c = pb * 16, 4 * kb
        dst = cols[pb, kb]
        for k in range(16):
            word = np.uint32(0)
            for j in range(4):
                b = byte(value(x[c + j, p0 + k], chan(vp, c + j)), bp) if c + j < C and p0 + k < P \
                    else np.uint32(off)
                word |= b << (8 * j)
            dst[k] = word


# the value forms of _packed_walk: chan(vp, c) -> channel c's parameters, value(v, q) -> the float to cast
@njit(cache=True, fastmath=EXACT, inline="always")
def _no_chan(vp, c):
    return np.float32(0)


@njit(cache=True, fastmath=EXACT, inline="always")
def _itself(v, q):
    return v


@njit(cache=True, fastmath=EXACT, inline="always")
def _chan_scale(vp, c):
    return vp[0][c]


@njit(cache=True, fastmath=EXACT, inline="always")
def _times(v, q):
    return v * q


@njit(cache=True, fastmath=EXACT, inline="always")
def _chan_affine(vp, c):
    return (vp[0][c], vp[1][c])


@njit(cache=True, fastmath=EXACT, inline="always")
def _fma_of(v, q):
    return _fma(v, q[0], q[1])


# the byte forms: bp = (1/s, z, lo, hi) for MNN's cast, (1/s, z + 128) for a value on the grid
@njit(cache=True, fastmath=EXACT, inline="always")
def _cast_byte(v, bp):
    return _byte(v, bp[0], bp[1], bp[2], bp[3])


@njit(cache=True, fastmath=EXACT, inline="always")
def _grid_byte(v, bp):
    return _byte_on_grid(v, bp[0], bp[1])


@njit(parallel=True, cache=True, fastmath=EXACT)
def quantize_packed(x, inv_s, z, lo, hi, off, cols):
    """x (C, P) float -> cols (blocks, C/4, 16) uint32 words of 4 channels (`_packed_walk`), MNN's cast."""
    _packed_walk(x, _no_chan, _itself, (), _cast_byte, (inv_s, z, lo, hi), off, cols)


@njit(cache=True, fastmath=EXACT, inline="always")
def _byte_on_grid(v, inv_s, off):
    """_byte for a value already on the grid (fl(k s), k an integer within its bounds), off = z + 128:
    fl(fl(v inv_s) + off) is within 1e-4 of the integer k + z + 128 (at most 255, where a float32 step is
    2^-16), so rint finds what the clamp and the half-away rounding find."""
    return np.uint32(np.int32(np.rint(v * inv_s + off)))


@njit(parallel=True, cache=True, fastmath=EXACT)
def quantize_packed_grid(x, inv_s, off, cols):
    """quantize_packed for an input on the convolution's own grid (the output of an int8 layer rounded to
    it): the same bytes (`_byte_on_grid`) in fewer vector steps, no clamps or sign-dependent rounding
    (MobileNetV2's 1x1 layers read their input this way: 0.96 ms of its quantize passes, one Zen 4 core)."""
    _packed_walk(x, _no_chan, _itself, (), _grid_byte, (inv_s, np.float32(off)), off, cols)


@njit(parallel=True, cache=True, fastmath=EXACT)
def quantize_packed_scaled(x, sc, inv_s, z, lo, hi, off, cols):
    """quantize_packed of x * sc[c] (a squeeze-excite's channel scale, plan stage fuse_channel_scale): the
    float32 products the multiply would have stored, quantized in the same pass, so the multiply's own
    pass over the map goes (EfficientNet-B0's 144 x 56 x 56: 0.11 ms, one Zen 4 core)."""
    _packed_walk(x, _chan_scale, _times, (sc,), _cast_byte, (inv_s, z, lo, hi), off, cols)


@intrinsic
def _fma(typingctx, a, b, c):
    """a * b + c rounded once (llvm.fma.f32)."""
    from llvmlite import ir
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, sig, args):
        f32 = ir.FloatType()
        fn = declare(builder, "llvm.fma.f32", f32, f32, f32, f32)
        return builder.call(fn, list(args))
    return sig, codegen


@njit(cache=True, fastmath=EXACT)
def _affine(v, s, b, lo, hi):
    """ops.scale.scale_rows' value: its multiply-add runs under fastmath, which contracts it to an FMA
    (checked: its output equals the once-rounded products), so here an explicit one."""
    return min(max(_fma(v, s, b), lo), hi)


@njit(parallel=True, cache=True, fastmath=EXACT)
def quantize_packed_affine(x, sc, sb, inv_s, z, lo, hi, off, cols):
    """quantize_packed of clamp(x * sc[c] + sb[c], lo_a, hi_a): a BatchNorm (and its ReLU) left as a Scale
    before an int8 1x1 convolution (DenseNet's pre-activations, plan stage fuse_channel_scale) computed in
    the packing pass, the same floats as the Scale step (`_affine`), so its own pass over the map goes.
    [lo, hi] are `affine_cast_bounds`: the activation's clamp merged into the cast's (two vector steps
    fewer an element: 256 x 3136 in cache 149 -> 122 us, one Zen 4 core)."""
    _packed_walk(x, _chan_affine, _fma_of, (sc, sb), _cast_byte, (inv_s, z, lo, hi), off, cols)


def affine_cast_bounds(lo_a, hi_a, inv_s, z, q_lo, q_hi) -> tuple:
    """The one clamp of quantize_packed_affine: the cast computes t = fl(fl(v inv_s) + z) and clamps it to
    [q_lo, q_hi]; v clamped to [lo_a, hi_a] first gives the same t as t clamped to [g(lo_a), g(hi_a)], g(u) =
    fl(fl(u inv_s) + z) (g is monotone, inv_s > 0), and two clamps in a row are one (merged_bounds). In
    float32 here as in the kernel; a bound past float32's range (ReLU's hi_a) is infinite, never the
    kernel's: the merged bounds are within [q_lo, q_hi]."""
    f32 = np.float32
    with np.errstate(over="ignore"):
        g_lo, g_hi = (f32(f32(f32(u) * f32(inv_s)) + f32(z)) for u in (lo_a, hi_a))
    return merged_bounds(g_lo, g_hi, f32(q_lo), f32(q_hi))


# a stride-1 window runs from the grid (Int8Weights.matmul_grid, no im2col pass) where its lanes' fill
# (plane_fill: 56x56 and padding 1: 0.98, 28x28: 0.96, 14x14: 0.93, 7x7: 0.77) is at least this share
# of im2col's dense blocks' (0.77 for 7x7 too)
GRID_FILL = 0.9
# the channels go in the lanes (int8_lanes_oc) where that fills at least as much of the lanes, counting
# the two tiles' epilogues as this many K steps (int8_gemm's, int8_lanes_oc's: fitted on 1x1 layers of
# K = 32..384 at 7x7 and 14x14, where the second tile fills every lane and still lost on K = 64 by 11%)
OC_LANES = 1.0
EPILOGUE_K = (12, 19)


def int8_convolution(geometry, q, alpha, bias, act, grids, in_shape, out_shape, threads: int, table=None,
                     scaled=False, on_grid=False, affine=None):
    """The kernel function for one int8 convolution (group 1), or None when the geometry is not covered.
    `scaled`: of x * s, s (1, C, 1, 1) its second input (a 1x1 unpadded stride-1 layer only: the product
    quantized in the packing pass, quantize_packed_scaled). `on_grid`: the input lies on the layer's input
    grid (an int8 layer rounded it there): a 1x1 layer packs it in fewer steps (quantize_packed_grid).
    `affine` (s, b, lo, hi): of clamp(x * s + b, lo, hi) per channel (a Scale before it, as scale_rows
    computes it; 1x1 unpadded stride-1 only: quantize_packed_affine).

    `q` (O, C*kh*kw) int8 in (c, i, j) order with per-channel `alpha`; `grids` a conv.Int8Grids; `table`
    (codes, zero point, scale) of a table op (a SiLU) that reads the output, by output step from the
    grid's lowest (kernels.ops.int8_tables.codes_of): written instead of the output's own values, in
    the GEMM's epilogue.
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
    if table is not None and out_grid is None:
        return None
    rows, epf = epilogue(alpha, bias, q.astype(np.int64).sum(1), s_in, grids.zero_in, out_grid, act,
                         None if table is None else table[1:])
    tab = NO_TABLE if table is None else byte_table(table[0])
    f32 = np.float32
    pixels = oh * ow
    # a 1x1 window without padding: quantize straight into the blocks (strided: from a copy of the pixels it
    # reads, a quarter of the input at stride 2, not the whole map through the grid and im2col)
    direct = kh == kw == 1 and not (t or l or b or r)
    strided = direct and (sh, sw) != (1, 1)
    if (scaled or affine is not None) and (not direct or strided):
        return None
    picked = np.empty((cin, oh, ow), np.float32) if strided else None
    # a window whose rows fill the 16-pixel blocks well: the GEMM reads the grid (no im2col)
    pitch = plane_pitch(w, l, r, sw)
    dense = pixels / (32 * -(-pixels // 32))
    from_grid = not direct and plane_fill(oh, ow, pitch) >= GRID_FILL * dense
    # channels in the lanes (int8_lanes_oc) where that fills the lanes better (7x7 and 14x14 maps), read
    # from the grid or the direct blocks; its epilogue (a transpose) costs more, so a short K gains less
    filled = (plane_fill(oh, ow, pitch) if from_grid else dense) * cout / (8 * -(-cout // 8))
    oc_lanes = lane_fill(pixels, cout) * (k4 + EPILOGUE_K[0]) / (k4 + EPILOGUE_K[1]) >= OC_LANES * filled
    from_grid = from_grid or (oc_lanes and not direct)
    # VNNI does 16 multiply-adds per element operation of kernels.sized's measure
    weights = Int8Weights(wk.reshape(cout, -1), *rows, cout * oh * ow * k4 * 4 // 16, threads)
    # AMX tiles where the host has them (int8_amx): from the grid where C/4 is a multiple of 16, else the blocks
    from . import int8_amx
    amx = int8_amx.amx_weights(weights, wk.reshape(cout, -1), cout * oh * ow * k4 * 4 // 16, threads)
    if amx is not None:
        from_grid, oc_lanes = int8_amx.grid_ok(cp // 4, direct), False
    lanes_oc = OcLanesWeights(weights, wk.reshape(cout, -1), cout * oh * ow * k4 * 4 // 16, threads) \
        if oc_lanes else None
    cols = None if from_grid else np.full((pixel_blocks(pixels) + (amx.slack_blocks if amx else 0), k4, 16, 4), off,
                                          np.uint8)
    words, flat = (None, None) if from_grid else (cols.view(np.uint32).reshape(cols.shape[:3]), cols.reshape(-1))
    word = np.uint32(off * 0x01010101)
    c4, wg, hg = cp // 4, w + l + r, h + t + b
    if from_grid:
        # planes of words at the shared-padding pitch, then slack: the last block reads up to 15 words past
        # the last row, a right-edge tap into the next row's left padding (or, after the last plane, here)
        rows_g = -(-hg // sh)
        plane, planes = rows_g * pitch, sh * sw * c4
        slack = np.full(planes * plane + 2 * pitch + 32, word, np.uint32)
        grid32 = slack[:planes * plane].reshape(planes, rows_g, pitch)
        offs = np.array([((i * dh % sh * sw + j * dw % sw) * c4 + c) * plane + i * dh // sh * pitch + j * dw // sw
                         for i in range(kh) for j in range(kw) for c in range(c4)], np.int64)
        from .int8_gemm import plane_blocks
        blk = plane_blocks(oh, ow, pitch)
        p = np.arange(pixels, dtype=np.int64)
        pix = (p // ow) * pitch + p % ow
    elif not direct:
        grid32 = np.full((hg, c4, wg), word, np.uint32)
    if direct and oc_lanes:         # pixel p's word k in the blocks: block p // 16, row k, lane p % 16
        p = np.arange(pixels, dtype=np.int64)
        pix = (p // 16) * k4 * 16 + p % 16
        offs = np.arange(k4, dtype=np.int64) * 16
        flat_words = words.reshape(-1)
    inv_in = grid_of(*grids.input)[0]
    z_in = f32(grids.zero_in)
    q_lo, q_hi = f32(lo + grids.zero_in), f32(hi + grids.zero_in)
    packed_grid = direct and on_grid and not scaled and affine is None
    planes_grid = from_grid and on_grid
    a_bounds = None if affine is None else affine_cast_bounds(affine[2], affine[3], inv_in, z_in, q_lo, q_hi)
    quantize = sized(quantize_packed_affine if affine is not None else quantize_packed_scaled if scaled else
                     quantize_packed_grid if packed_grid else quantize_packed if direct else quantize_planes_grid
                     if planes_grid else quantize_planes if from_grid else quantize_rows, cin * h * w, threads)
    unfold = None if direct or from_grid else sized(im2col_rows, words.size, threads)

    def run(inputs, outputs):
        x, y = inputs[0], outputs[0]
        for i in range(n):
            if packed_grid:
                if strided:
                    np.copyto(picked, x[i][:, ::sh, ::sw])
                quantize((picked if strided else x[i]).reshape(cin, pixels), inv_in, off, words)
            elif strided:
                np.copyto(picked, x[i][:, ::sh, ::sw])
                quantize(picked.reshape(cin, pixels), inv_in, z_in, q_lo, q_hi, off, words)
            elif affine is not None:
                quantize(x[i].reshape(cin, pixels), affine[0], affine[1], inv_in, z_in, *a_bounds, off, words)
            elif scaled:
                quantize(x[i].reshape(cin, pixels), np.ascontiguousarray(inputs[1], f32).reshape(cin), inv_in, z_in, q_lo, q_hi, off, words)
            elif direct:
                quantize(x[i].reshape(cin, pixels), inv_in, z_in, q_lo, q_hi, off, words)
            else:
                if planes_grid:
                    quantize(x[i], inv_in, off, t, l, sh, sw, grid32)
                elif from_grid:
                    quantize(x[i], inv_in, z_in, q_lo, q_hi, off, t, l, sh, sw, grid32)
                if from_grid:
                    if oc_lanes:
                        lanes_oc.matmul(slack, pix, offs, epf, y[i].reshape(cout, pixels), tab)
                    else:
                        (amx or weights).matmul_grid(slack, offs, epf, y[i].reshape(cout, pixels), blk, tab)
                    continue
                quantize(x[i], inv_in, z_in, q_lo, q_hi, off, t, l, grid32)
                unfold(grid32, kh, kw, sh, sw, dh, dw, oh, ow, words)
            dst = y[i].reshape(cout, pixels)
            if oc_lanes:
                lanes_oc.matmul(flat_words, pix, offs, epf, dst, tab)
            else:
                (amx or weights).matmul(flat, epf, dst, tab)
    return run


@njit(parallel=True, cache=True, fastmath=EXACT)
def requantize_rows(v, inv_in, acc_bias, scale, lo, hi, q_lo, q_hi, z, s_out, out):
    """MNN's int8 depthwise epilogue (in place allowed, but slow: see depthwise_int8): v (C, P) is the
    accumulator over the input's steps times inv_in's inverse (the real input's sum), made the integer
    accumulator again by rounding v * inv_in, plus acc_bias[c]; then the byte q = clamp(round(fl(acc *
    scale[c]))) with the activation's bounds, the output zero point already in acc_bias; out = (q - z) *
    s_out. Float32 throughout and no contraction (EXACT), so each step rounds as MNN's does; lo and hi
    finite (EXACT assumes no infinities: `depthwise_int8` passes +-FLT_MAX for an open bound).
    copysign, not a branch, so the loop vectorizes."""
    C, P = v.shape
    half = np.float32(0.5)
    for c in prange(C):
        sc, b = scale[c], acc_bias[c]
        for i in range(P):
            a = v[c, i] * inv_in
            t = (np.trunc(a + np.copysign(half, a)) + b) * sc
            t = min(max(t, lo), hi)
            r = np.trunc(t + np.copysign(half, t))
            out[c, i] = (min(max(r, q_lo), q_hi) - z) * s_out


def merged_bounds(lo, hi, q_lo, q_hi) -> tuple:
    """One clamp for the activation's bounds [lo, hi] then the byte's integer bounds [q_lo, q_hi]:
    round(clamp(t, L, H)) == clamp(round(clamp(t, lo, hi)), q_lo, q_hi) for the half-away rounding (monotone,
    integers fixed), L, H the intersection, or the byte bound both sides where they do not meet."""
    f32 = np.float32
    return f32(min(max(lo, q_lo), q_hi)), f32(max(min(hi, q_hi), q_lo))


@njit(parallel=True, cache=True, fastmath=EXACT)
def requantize_acc(v, inv_in, acc_bias, scale, lo, hi, z, s_out, out):
    """requantize_rows for depthwise_int8's sums, in fewer steps, same values: v * inv_in is within 0.4 of
    the integer accumulator (EXACT_TAPS, sums_exact) or is it (steps), so rint finds it (one rounding
    instruction, not three), and the two clamps are one (`merged_bounds`: lo, hi). 0.103 -> 0.062 ms for
    144 x 3136 (one Zen 4 core): the pass is compute-bound, 17 -> 11 vector steps per 16 outputs."""
    C, P = v.shape
    half = np.float32(0.5)
    for c in prange(C):
        sc, b = scale[c], acc_bias[c]
        for i in range(P):
            t = min(max((np.rint(v[c, i] * inv_in) + b) * sc, lo), hi)
            out[c, i] = (np.trunc(t + np.copysign(half, t)) - z) * s_out


@njit(cache=True, fastmath=EXACT, inline="always")
def _acc_bytes(v, inv_in, b, sc, lo, hi, q_lo, row):
    """One channel's bytes - q_lo in requantize_acc's steps, into row (the table kernels look them up
    after, while the row is in cache)."""
    half = np.float32(0.5)
    for i in range(v.shape[0]):
        t = min(max((np.rint(v[i] * inv_in) + b) * sc, lo), hi)
        row[i] = np.trunc(t + np.copysign(half, t)) - q_lo


@njit(parallel=True, cache=True, fastmath=EXACT)
def requantize_acc_table(v, inv_in, acc_bias, scale, lo, hi, q_lo, tab, z_t, s_t, out):
    """requantize_acc with a table op's codes for the output bytes (int8_gemm.byte_table, on a grid of
    zero point z_t and scale s_t): out = (tab[q - q_lo] - z_t) * s_t; the bytes - q_lo to the row, then
    looked up 64 at a time while the row is in cache (int8_gemm.lut_chunk). A SiLU after an int8
    depthwise convolution in its pass, where a lookup pass of its own cost ~0.8 ns an output (one Zen 4
    core)."""
    C, P = v.shape
    for c in prange(C):
        row = out[c]
        _acc_bytes(v[c], inv_in, acc_bias[c], scale[c], lo, hi, q_lo, row)
        for i in range(0, P, 64):
            lut_chunk(row, i, P - i, tab, z_t, s_t)


@njit(parallel=True, cache=True, fastmath=EXACT)
def requantize_acc_values(v, inv_in, acc_bias, scale, lo, hi, q_lo, values, out):
    """requantize_acc with a table op's float values for the output bytes: out = values[q - q_lo]
    (clamped to the table, as mnn_math.lookup reads it), for a table op whose output the file keeps float
    (EfficientNet-B0's SiLUs after the depthwise layers, read by the SE pools): the same values as
    requantize_rows then lookup's pass, which re-read and re-derived every byte (~0.8 ns an output, 2.4 ms
    of EfficientNet-B0's 6 ms in depthwise steps, one Zen 4 core). The bytes go to the row first
    (vectorized), then the lookups while the row is in cache."""
    C, P = v.shape
    top = values.shape[0] - 1
    for c in prange(C):
        row = out[c]
        _acc_bytes(v[c], inv_in, acc_bias[c], scale[c], lo, hi, q_lo, row)
        for i in range(P):
            row[i] = values[min(max(np.int32(row[i]), 0), top)]


@njit(parallel=True, cache=True, fastmath=EXACT)
def requantize_acc_planes(v, inv_in, acc_bias, scale, lo, hi, q_lo, planes, out):
    """requantize_acc_values with the table looked up in registers (int8_lut.lut_values, `planes` =
    int8_lut.value_planes(values)), 64 outputs at a time while the row is in cache: the same bytes (the
    indices stay within [0, q_hi - q_lo], the planes repeat the last value past the table as the clamp
    does). EfficientNet-B0's requantize passes with the SiLU values 1.5 -> 0.6 ms a run (one Zen 4 core).
    Needs AVX-512 VBMI."""
    C, P = v.shape
    for c in prange(C):
        row = out[c]
        _acc_bytes(v[c], inv_in, acc_bias[c], scale[c], lo, hi, q_lo, row)
        for i in range(0, P, 64):
            lut_values(row, i, P - i, planes)


# taps up to which a float32 sum of real on-grid inputs times integer weights stays within 0.4 of the
# integer sum in steps, in the worst case ((K + 1) 2^-24 K 127^2 < 0.4): rounding recovers it exactly
EXACT_TAPS = 16
FLT_MAX = np.finfo(np.float32).max


def sums_exact(q, grid) -> bool:
    """Whether a float32 depthwise sum over the real on-grid inputs x = fl(k s) rounds back to the exact
    integer sum(k w) for these integer weights q (C, K) whatever the order of its adds (FMA or not): the
    error of a K-term dot product, the input's own rounding and the two roundings of sum * (1/s) stay
    within gamma_{K+3} sum|k w| (Higham, Accuracy and Stability, 3.1), at most (K+3) 2^-24 k_max max_c
    sum_t |q[c, t]| (k_max from the grid's bounds in steps), kept below 0.4. EXACT_TAPS is the worst
    case's (every |q| and k 127); real 5x5 layers stay well inside it (EfficientNet-B0's: sum |q|
    ~1/2 of 25 x 127), so they skip the pass that casts their input to steps (0.7 ms of 6 a run, Zen 4)."""
    taps = int(q.shape[1])
    k_max = max(abs(float(grid[1])), abs(float(grid[2])))
    worst = float(np.abs(np.asarray(q, np.float64)).sum(axis=1).max(initial=0.0))
    u = 2.0 ** -24
    return (taps + 3) * u / (1 - (taps + 3) * u) * k_max * worst < 0.4


def depthwise_int8(node, ins, outs, bias, grids, threads: int, float_kernel, table=None, float_table=None):
    """An int8 depthwise convolution computed as MNN 3.6's x86 kernel does (read from its binary and
    checked byte for byte): the 32-bit accumulator sum(k w) + B over the input steps k, with
    B = trunc(b / (s_in alpha)) + trunc(z_out / scale) the bias and output zero point in accumulator
    units, then q = round(fl(float(acc) * scale)), scale = alpha * (s_in / s_out). The sum is a float
    depthwise convolution with the integer weights (`float_kernel`, no bias, activation or grid): over
    the real input when it is already on its grid and the window small (EXACT_TAPS) or its weights
    keep the sum's error small (`sums_exact`), the sum / s_in rounded back to the integer; else over
    the input cast to steps first, exact in float32. The rest
    follows in `requantize_acc` (requantize_rows' values in fewer steps; `requantize_acc_table` with a
    table op's codes: see int8_convolution; `requantize_acc_values` with its float values, `float_table`,
    from the lowest output step, where it has no codes).
    None when the layer has no 8-bit per-channel weights or a float output."""
    from ....format.idst import int8_values
    c = node.param["common"]
    cout = c["outputCount"]
    values = int8_values(node.param["quanParameter"], cout)
    if values is None or grids.output is None or len(ins[0].shape) != 4:
        return None
    q, alpha = values[:2]
    f32 = np.float32
    s_in, (s_out, out_lo, out_hi) = grids.input[0], grids.output
    s_in, s_out, z = f32(s_in), f32(s_out), f32(grids.zero_out)
    a = np.asarray(alpha, f32)
    a = np.where(np.abs(a) < f32(1e-6), f32(1e-6), a)
    scale = (a * (s_in / s_out)).astype(f32)
    acc_bias = (np.trunc(np.asarray(bias, f32) / (s_in * a)) + np.trunc(z / scale)).astype(f32)
    plain = copy.copy(node)
    plain.param = dict(node.param, common=dict(c, relu=False, relu6=False))
    fn = float_kernel(plain, np.asarray(q, np.float32).reshape(cout, -1), np.zeros(cout, f32))
    lo, hi = (np.clip(b, -FLT_MAX, FLT_MAX) for b in act_bounds(activation(c), s_out, z))
    q_lo, q_hi = f32(out_lo) + z, f32(out_hi) + z
    vals = None if table is not None or float_table is None else np.ascontiguousarray(float_table, f32)
    rows_fn = requantize_acc_table if table is not None else requantize_acc_values if vals is not None \
        else requantize_acc
    if vals is not None and 0 < vals.size <= 256 and q_hi - q_lo <= 255 and host_has("avx512vbmi"):
        rows_fn, vals = requantize_acc_planes, value_planes(vals)      # the lookups in registers
    requant = sized(rows_fn, int(np.prod(outs[0].shape)), threads)
    lo, hi = merged_bounds(lo, hi, q_lo, q_hi)
    tab = None if table is None else byte_table(table[0])
    n = ins[0].shape[0]
    grid_in = grid_of(*grids.input)
    on_grid = ins[0].grid == grid_in and (q.shape[1] <= EXACT_TAPS or sums_exact(q, grids.input))
    inv_in = grid_in[0] if on_grid else f32(1)
    if not on_grid:
        steps_grid = (grid_in[0], f32(1), grid_in[2], grid_in[3])      # the input in steps k, cast as MNN
        z_in = f32(grids.zero_in)
        xk_of = Scratch("int8_dw_steps", ins[0].shape)
        width = ins[0].shape[-1]
        to_steps = sized(to_grid_z, int(np.prod(ins[0].shape)), threads)

    # the sums go to a buffer of their own: requantizing in place, the vectorized loop's overlap check
    # sent every row to its scalar remainder (MobileNetV2's depthwise layers: 4.4 ms -> 0.4 ms a run);
    # one buffer the thread's depthwise layers share (kernels.scratch), warm in cache, where one per layer
    # was cold at every run (MobileNetV2's 14x14 layers: ~0.086 ms against fp32's 0.041, one Zen 4 core)
    acc_of = Scratch("int8_dw_acc", outs[0].shape)

    def run(inputs, outputs):
        acc = acc_of()
        if on_grid:
            fn(inputs, [acc])
        else:
            x = np.ascontiguousarray(inputs[0], f32)
            xk = xk_of()
            to_steps(x.reshape(-1, width), steps_grid, z_in, xk.reshape(-1, width))
            fn([xk] + list(inputs[1:]), [acc])
        for i in range(n):
            if vals is not None:
                requant(acc[i].reshape(cout, -1), inv_in, acc_bias, scale, lo, hi, q_lo, vals,
                        outputs[0][i].reshape(cout, -1))
            elif tab is None:
                requant(acc[i].reshape(cout, -1), inv_in, acc_bias, scale, lo, hi, z, s_out,
                        outputs[0][i].reshape(cout, -1))
            else:
                requant(acc[i].reshape(cout, -1), inv_in, acc_bias, scale, lo, hi, q_lo, tab, table[1], table[2],
                        outputs[0][i].reshape(cout, -1))
    return run
