"""Work splits of the parallel kernels, each against its serial twin bit for bit at 3 threads. float_gemm's
kernels with their tail pixels (1..8 past whole 48-pixel tiles, channels in the lanes) in the last K block's
parallel region rather than a region of their own, the K blocks forced small (kc < K, partial sums stored and
reloaded): gemm (both walk orders), gemm_batched, gemm_panels and conv_im2col; depthwise_strips split by
(channel, block of rows). Against float64 NumPy to 2e-5 of the output's largest magnitude (fp32 sums of up to
360 products)."""
import numpy as np
import pytest

from mnntool.runtime.kernels.micro import float_gemm as fg
from mnntool.runtime.kernels.micro.epilogue import NO_GRID

pytestmark = pytest.mark.skipif(not fg.HAS_AVX512, reason="the fp32 micro-kernel needs AVX-512")


def _close(ref, got):
    assert np.abs(got - ref).max() <= 2e-5 * np.abs(ref).max()


@pytest.mark.parametrize("o, k, p, kc", [(40, 300, 147, 64), (17, 70, 51, 32), (24, 100, 197, 100), (9, 30, 12, 8)])
def test_gemms_with_tails_in_the_last_k_region(three_threads, o, k, p, kc):
    rng = np.random.default_rng(o + k + p)
    w, x, b = (rng.standard_normal(s).astype(np.float32) for s in ((o, k), (k, p), (o,)))
    wp = fg.pack_weights(w)
    bias = np.zeros(-(-o // 8) * 8, np.float32)
    bias[:o] = b
    epf, grid = fg.epilogue_of(1, NO_GRID)
    ref = np.maximum(w.astype(np.float64) @ x + b[:, None], 0)
    out = np.empty(o * p, np.float32)
    for by_block in (True, False):
        par, ser = _gemm(x, p, wp, k, kc, o, bias, epf, grid, out, by_block)
        assert np.array_equal(par.view(np.uint32), ser.view(np.uint32))
        _close(ref, par.reshape(o, p))
    # two batches: the second's operands one stride on
    x2 = np.concatenate([x.reshape(-1), (2 * x).reshape(-1)])
    out2 = np.empty(2 * o * p, np.float32)
    wp2 = np.concatenate([wp.reshape(-1), wp.reshape(-1)])
    par, ser = _batched(x2, p, wp2, wp.size, k, kc, o, bias, epf, grid, out2)
    assert np.array_equal(par.view(np.uint32), ser.view(np.uint32))
    _close(np.maximum(w.astype(np.float64) @ (2 * x) + b[:, None], 0), par[o * p:].reshape(o, p))
    panels = fg.pack_panels(x)
    par, ser = _panels(panels, p, wp, k, kc, o, bias, epf, grid, out)
    assert np.array_equal(par.view(np.uint32), ser.view(np.uint32))
    _close(ref, par.reshape(o, p))


def _gemm(x, p, wp, k, kc, o, bias, epf, grid, out, by_block):
    res = []
    for kernel in (fg.gemm.dispatcher(), fg.gemm.serial().dispatcher()):
        y = np.full_like(out, np.nan)
        kernel(x.reshape(-1), p, p, wp.reshape(-1), k, kc, o, bias, epf, grid, y, p, by_block)
        res.append(y)
    return res


def _batched(x2, p, wp2, wstride, k, kc, o, bias, epf, grid, out2):
    res = []
    for kernel in (fg.gemm_batched.dispatcher(), fg.gemm_batched.serial().dispatcher()):
        y = np.full_like(out2, np.nan)
        kernel(x2, p, k * p, p, wp2, wstride, k, kc, o, bias, epf, grid, y, p, o * p, 2, False)
        res.append(y)
    return res


def _panels(panels, p, wp, k, kc, o, bias, epf, grid, out):
    res = []
    for kernel in (fg.gemm_panels.dispatcher(), fg.gemm_panels.serial().dispatcher()):
        y = np.full_like(out, np.nan)
        kernel(panels.reshape(-1), p, wp.reshape(-1), k, kc, o, bias, epf, grid, y, p)
        res.append(y)
    return res


@pytest.mark.parametrize("h, w, k, cin, cout", [(17, 17, 3, 12, 20), (7, 7, 3, 40, 9), (7, 7, 3, 80, 52)])
def test_conv_im2col_tail_in_the_last_k_region(three_threads, h, w, k, cin, cout):
    """conv_im2col (a 3x3 convolution, padding 1, K = cin * 9 in blocks of 16): 289 pixels are 6 tiles and a
    tail of 1, 49 pixels a tile and a tail of 1; parallel and serial twin bit-identical, float64 NumPy to 2e-5.
    With the channel blocks split (split 3: the tiles' panels copied once, by taps in blocks of PANEL_TAPS,
    then shared by the parts) the same bits as unsplit, in K blocks of 16 and in one K block."""
    rng = np.random.default_rng(h * cin)
    x = rng.standard_normal((cin, h, w)).astype(np.float32)
    wt = (rng.standard_normal((cout, cin, k, k)) / np.sqrt(cin * k * k)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    xq = np.zeros((cin, h + 2, w + 2), np.float32)
    fg.phase_split(x, 1, 1, 1, 1, xq)
    koff = fg.tap_offsets(cin, k, k, 1, 1, 1, 1, h + 2, w + 2)
    pk = fg.PackedGemm(wt.reshape(cout, -1), b, 0, NO_GRID, h * w, 1)
    assert fg.tail_pixels.py_func(h * w) == 1
    res = []
    for split, kc in ((1, 16), (3, 16), (3, koff.size), (1, koff.size)):
        for kernel in (fg.conv_im2col.dispatcher(), fg.conv_im2col.serial().dispatcher()):
            out = np.full(cout * h * w, np.nan, np.float32)
            kernel(xq, koff, koff.size, h, w, pk.wp, kc, cout, split, pk.bias, pk.epf, pk.grid, out)
            res.append(out)
    assert koff.size > fg.PANEL_TAPS or cin < 40
    for other in res[1:]:
        assert np.array_equal(res[0].view(np.uint32), other.view(np.uint32))
    xp = np.pad(x.astype(np.float64), ((0, 0), (1, 1), (1, 1)))
    cols = np.stack([xp[:, i:i + h, j:j + w] for i in range(k) for j in range(k)], 1).reshape(cin * k * k, h * w)
    _close(wt.reshape(cout, -1).astype(np.float64) @ cols + b[:, None], res[0].reshape(cout, h * w))


@pytest.mark.parametrize("c, h, k, s", [(3, 40, 3, 1), (5, 19, 5, 1), (2, 33, 3, 2), (7, 12, 7, 1)])
def test_depthwise_strips_split_by_row_blocks(three_threads, c, h, k, s):
    """depthwise_strips' items are (channel, block of `rows` output rows), not channels: with fewer channels
    than threads the parallel kernel and its serial twin give the same bits (every output written once,
    inside its block), and the output matches float64 NumPy to 2e-5."""
    from mnntool.runtime.kernels.micro.depthwise_strips import depthwise_strips
    rng = np.random.default_rng(c * h + k)
    x = rng.standard_normal((c, h, h)).astype(np.float32)
    wt = (rng.standard_normal((c, k * k)) / k).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    p = k // 2
    oh = (h + 2 * p - k) // s + 1
    epf, grid = fg.epilogue_of(0, NO_GRID)
    res = []
    for kernel in (depthwise_strips.dispatcher(), depthwise_strips.serial().dispatcher()):
        out = np.full((c, oh, oh), np.nan, np.float32)
        kernel(x, wt.reshape(-1), b, k, k, s, 1, p, p, epf, grid, np.zeros(h, np.float32), 5, out)
        res.append(out)
    assert np.array_equal(res[0].view(np.uint32), res[1].view(np.uint32))
    xp = np.pad(x.astype(np.float64), ((0, 0), (p, p), (p, p)))
    ref = sum(xp[:, i:i + s * (oh - 1) + 1:s, j:j + s * (oh - 1) + 1:s] * wt[:, i * k + j, None, None]
              for i in range(k) for j in range(k)) + b[:, None, None]
    _close(ref, res[0])


@pytest.mark.parametrize("nmain, items", [(1, 1), (1, 33), (4, 36), (3, 3), (128, 136), (7, 100), (0, 5), (50, 51)])
def test_tiles_spread_over_the_region(nmain, items):
    """`_spread` is a permutation of the region's items that keeps the tiles in order, and every contiguous run
    of positions (what Numba hands one thread) holds its share of the tiles within one: a 7x7 map's 4 tile parts
    and 32 tails put the 4 parts on the first of 4 threads when the tails came last."""
    spread = fg._spread.py_func
    order = [spread(j, nmain, items) for j in range(items)]
    assert sorted(order) == list(range(items))
    tiles = [i for i in order if i < nmain]
    assert tiles == list(range(nmain))
    for threads in (2, 3, 4, 8):
        bounds = [items * t // threads for t in range(threads + 1)]
        for lo, hi in zip(bounds, bounds[1:]):
            share = sum(1 for i in order[lo:hi] if i < nmain)
            assert abs(share - nmain * (hi - lo) / items) <= 1
