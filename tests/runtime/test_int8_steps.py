"""The int8 path's steps around the GEMM against numpy references, bit-exact: the quantize into rows of
words (int8_conv.quantize_rows) against MNN's cast in numpy, the packed im2col (int8_conv.im2col_rows)
against numpy's window gather, and the depthwise requantize epilogue
(int8_conv.requantize_rows) against its float32 formula step by step (MNN's order, half away from zero).
"""
import numpy as np
import pytest

from mnntool.runtime.kernels import sized
from mnntool.runtime.kernels.micro import int8_conv
from mnntool.runtime.kernels.micro.int8_gemm import pixel_blocks

f = np.float32


def _im2col_reference(grid, kh, kw, sh, sw, dh, dw, oh, ow, blocks):
    """(blocks, K/4, 16) uint32 words from the HWC byte grid, K = (i, j, c); pixels past the end 0."""
    words = grid.view(np.uint32)
    c4 = words.shape[2]
    cols = np.zeros((blocks * 16, kh * kw * c4), np.uint32)
    for y in range(oh):
        for x in range(ow):
            win = words[y * sh:y * sh + dh * (kh - 1) + 1:dh, x * sw:x * sw + dw * (kw - 1) + 1:dw]
            cols[y * ow + x] = win.reshape(-1)
    return cols.reshape(blocks, 16, -1).transpose(0, 2, 1)


@pytest.mark.parametrize("cin,hw,k,s,d", [(3, (30, 27), 7, 2, 1), (4, (17, 17), 3, 2, 1), (64, (9, 9), 3, 1, 1),
                                          (8, (12, 10), 3, 1, 2), (12, (8, 8), 5, 2, 1), (4, (4, 33), 1, 1, 1)])
@pytest.mark.parametrize("threads", [1, 2])
def test_im2col_rows_matches_numpy(cin, hw, k, s, d, threads):
    r = np.random.default_rng(cin * 31 + k)
    p = d * (k // 2)
    oh, ow = ((n + 2 * p - d * (k - 1) - 1) // s + 1 for n in hw)
    cp = -(-cin // 4) * 4
    grid = r.integers(0, 256, (hw[0] + 2 * p, hw[1] + 2 * p, cp), dtype=np.uint8)
    blocks = pixel_blocks(oh * ow)
    words = np.zeros((blocks, k * k * cp // 4, 16), np.uint32)
    rows = np.ascontiguousarray(grid.view(np.uint32).transpose(0, 2, 1))      # (H, C/4, W) words
    sized(int8_conv.im2col_rows, words.size, threads)(rows, k, k, s, s, d, d, oh, ow, words)
    np.testing.assert_array_equal(words, _im2col_reference(grid, k, k, s, s, d, d, oh, ow, blocks))


@pytest.mark.parametrize("cin", [3, 8, 13])
@pytest.mark.parametrize("zero", [0, -127])
@pytest.mark.parametrize("threads", [1, 2])
def test_quantize_rows_matches_numpy(cin, zero, threads):
    r = np.random.default_rng(cin)
    x = (r.standard_normal((cin, 7, 11)) * 4).astype(f)
    x[0, 0, :6] = [0.05, -0.05, 0.15, -0.25, 1e4, -1e4]       # ties at scale 0.1, and clamped values
    inv, z, lo, hi = f(10), f(zero), f(-128), f(127)
    off = 128 + zero
    t, l = 1, 2
    got = np.full((7 + 2, -(-cin // 4), 11 + 3), 0xDEADBEEF, np.uint32)
    sized(int8_conv.quantize_rows, x.size, threads)(x, inv, z, lo, hi, off, t, l, got)
    v = np.clip(((x * inv).astype(f) + z).astype(f), lo, hi)
    q = np.trunc((v + np.copysign(f(0.5), v)).astype(f)).astype(np.int32) + 128
    want_bytes = np.full((-(-cin // 4) * 4, 7, 11), off, np.uint8)
    want_bytes[:cin] = q
    want = want_bytes.transpose(1, 2, 0).copy().view(np.uint32).transpose(0, 2, 1)    # (H, C/4, W) words
    np.testing.assert_array_equal(got[t:t + 7, :, l:l + 11], want)
    inner = np.zeros(got.shape, bool)
    inner[t:t + 7, :, l:l + 11] = True
    assert (got[~inner] == 0xDEADBEEF).all()                 # the border is left as it was


def _requantize_reference(v, inv_in, acc_bias, scale, lo, hi, q_lo, q_hi, z, s_out):
    def round_away(t):
        return np.trunc((t + np.copysign(f(0.5), t)).astype(f))
    acc = (round_away((v * inv_in).astype(f)) + acc_bias[:, None]).astype(f)
    t = np.clip((acc * scale[:, None]).astype(f), lo, hi)
    return ((np.clip(round_away(t), q_lo, q_hi) - z) * s_out).astype(f)


@pytest.mark.parametrize("lo,hi", [(-np.inf, np.inf), (3, np.inf), (3, 50.5)])
@pytest.mark.parametrize("threads", [1, 2])
def test_requantize_rows_matches_numpy(lo, hi, threads):
    r = np.random.default_rng(7)
    s_in = f(0.037)
    v = (np.round(r.standard_normal((24, 301)) * 60).astype(f) * s_in).astype(f)
    v[0, :6] = [0.5 * s_in, -0.5 * s_in, 0, -0.0, 1.5 * s_in, -2.5 * s_in]      # ties and zeros
    acc_bias = np.round(r.standard_normal(24) * 20).astype(f)
    scale = (r.random(24) * 0.05).astype(f)
    scale[1] = f(0.5)                                  # outputs on exact halves
    args = (f(1) / s_in, acc_bias, scale, f(lo), f(hi), f(-125), f(130), f(3), f(0.02))
    want = _requantize_reference(v, *args)
    finite = [np.clip(b, -int8_conv.FLT_MAX, int8_conv.FLT_MAX) for b in (f(lo), f(hi))]
    out = np.empty_like(v)
    sized(int8_conv.requantize_rows, v.size, threads)(v, args[0], acc_bias, scale, *finite, *args[5:], out)
    np.testing.assert_array_equal(out, want)
