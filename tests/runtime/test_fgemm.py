"""The AVX-512 fp32 paths: the fgemm micro-kernel, Winograd F(4x4)/F(2x2), convolutions without an
im2col matrix, and 3x3 stride-2 max pooling. References: numpy in float64 and torch's conv2d/max_pool2d;
tolerance 2e-5 of the output's largest magnitude (fp32 sums over up to 2304 products, and Winograd's
transforms, which scale values by up to 8x)."""
import numpy as np
import pytest

from mnntool.ir.ops import Val
from mnntool.runtime.kernels.ops.conv import convolution_float
from mnntool.runtime.kernels.micro.epilogue import NO_GRID, grid_of
from mnntool.runtime.settings import Settings
from mnntool.runtime.kernels.micro.float_gemm import HAS_AVX512, PackedGemm, k_block

torch = pytest.importorskip("torch")
F = torch.nn.functional
needs_avx512 = pytest.mark.skipif(not HAS_AVX512, reason="the fp32 micro-kernel needs AVX-512")


def close(ref, got, tol=2e-5):
    ref, got = np.asarray(ref, np.float64), np.asarray(got, np.float64)
    assert got.shape == ref.shape
    assert np.abs(got - ref).max() <= tol * max(np.abs(ref).max(), 1e-6)


@needs_avx512
@pytest.mark.parametrize("o, k, p", [(5, 7, 3), (13, 600, 50), (64, 147, 200), (96, 16, 12544 // 8), (24, 1200, 49),
                                     (40, 64, 64), (8, 9, 1), (512, 2304, 49),
                                     (17, 64, 100), (3, 20, 37), (1, 30, 20), (10, 33, 16),   # last blocks of 1-4 rows
                                     # 1-4 pixels past whole tiles (float_gemm._tail, channels in the lanes)
                                     (70, 300, 289), (33, 50, 196), (200, 64, 98), (16, 40, 147), (24, 100, 197),
                                     (20, 40, 104),
                                     # 49..56 pixels: one 48-pixel tile and a tail (TAIL_FROM); 57: one 64 x 4 tile
                                     (9, 70, 56), (130, 40, 51), (20, 33, 57)])
@pytest.mark.parametrize("act", [0, 1, 2])
def test_packed_gemm_matches_numpy(o, k, p, act):
    rng = np.random.default_rng(o * k + p)
    w = rng.standard_normal((o, k)).astype(np.float32)
    x = rng.standard_normal((k, p)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    g = PackedGemm(w, b, act, NO_GRID, p, 2)
    out = np.full((g.rows(), p), np.nan, np.float32)
    g(x.reshape(-1), p, out.reshape(-1), p)
    ref = w.astype(np.float64) @ x + b[:, None]
    ref = np.maximum(ref, 0) if act else ref
    ref = np.minimum(ref, 6) if act == 2 else ref
    close(ref, out[:o])
    assert np.isnan(out[o:]).all()       # nothing written past the O output channels
    for by_block in (True, False):       # both walk orders
        g.by_block = by_block
        out[:] = np.nan
        g(x.reshape(-1), p, out.reshape(-1), p)
        close(ref, out[:o])


@needs_avx512
def test_one_thread_runs_the_serial_twin_with_the_same_sums():
    """At one thread PackedGemm calls gemm's serial twin (float_gemm.fitted, as the kernel library does): the
    same tiles in the same k order, so the same floats as the parallel kernel at two threads."""
    from mnntool.runtime.kernels.micro import float_gemm
    rng = np.random.default_rng(7)
    o, k, p = 40, 300, 49 * 3
    w, x, b = (rng.standard_normal(s).astype(np.float32) for s in ((o, k), (k, p), (o,)))
    one, two = PackedGemm(w, b, 1, NO_GRID, p, 1), PackedGemm(w, b, 1, NO_GRID, p, 2)
    assert one.fn.kernel is float_gemm.gemm.serial()
    outs = [np.full((g.rows(), p), np.nan, np.float32) for g in (one, two)]
    for g, out in zip((one, two), outs):
        g(x.reshape(-1), p, out.reshape(-1), p)
    assert np.array_equal(outs[0][:o], outs[1][:o])
    close(np.maximum(w.astype(np.float64) @ x + b[:, None], 0), outs[0][:o])


@needs_avx512
def test_packed_gemm_rounds_to_the_int8_grid_and_blocks_k():
    rng = np.random.default_rng(1)
    o, k, p = 16, 3000, 100
    assert k_block(k, 512, 3) < k            # several k passes, each accumulating onto the output
    w = rng.standard_normal((o, k)).astype(np.float32) * 0.05
    x = rng.standard_normal((k, p)).astype(np.float32)
    grid = grid_of(0.05, -127, 127)
    g = PackedGemm(w, np.zeros(o, np.float32), 1, grid, p, 2)
    out = np.empty((o, p), np.float32)
    from mnntool.runtime.kernels.micro.float_gemm import gemm
    gemm(x.reshape(-1), p, p, g.wp, k, k_block(k, 512, 3), o, g.bias, g.epf, 1, out.reshape(-1), p, False)
    ref = np.clip(np.rint(np.maximum(w.astype(np.float64) @ x, 0) / 0.05), -127, 127) * 0.05
    # values near a rounding midpoint may round either way in fp32: allow one step on a few of them
    diff = np.abs(out - ref)
    assert diff.max() <= 0.05 + 1e-6 and (diff > 1e-5).mean() < 0.01


def _conv(x, w, b, stride=1, pads=(1, 1, 1, 1), dilation=1, act=1):
    n, cin, h, wd = x.shape
    cout, _, kh, kw = w.shape
    t, l, bb, r = pads
    oh = (h + t + bb - dilation * (kh - 1) - 1) // stride + 1
    ow = (wd + l + r - dilation * (kw - 1) - 1) // stride + 1

    class Node:
        param = {"common": {"outputCount": cout, "kernelX": kw, "kernelY": kh, "strideX": stride, "strideY": stride,
                            "dilateX": dilation, "dilateY": dilation, "pads": [t, l, bb, r], "relu": act == 1,
                            "relu6": act == 2}}
    k = convolution_float(Node, [Val((n, cin, h, wd))], [Val((n, cout, oh, ow))], w.reshape(cout, -1), b,
                         Settings(2))
    y = np.full((n, cout, oh, ow), np.nan, np.float32)
    k.fn([x], [y])
    xt = F.pad(torch.from_numpy(x), (l, r, t, bb))
    ref = F.conv2d(xt, torch.from_numpy(w), torch.from_numpy(b), stride=stride, dilation=dilation)
    ref = F.relu(ref) if act == 1 else torch.clamp(ref, 0, 6) if act == 2 else ref
    return ref.numpy(), y


@needs_avx512
@pytest.mark.parametrize("cin, cout, h, w", [(64, 64, 56, 56), (128, 128, 28, 28), (256, 256, 14, 14), (512, 512, 7, 7),
                                             (24, 13, 9, 17), (8, 8, 3, 3), (16, 40, 30, 5), (8, 16, 10, 75),
                                             (8, 8, 12, 64), (8, 8, 10, 14), (16, 8, 23, 15)])
@pytest.mark.parametrize("act", [0, 2])
def test_winograd_matches_torch(cin, cout, h, w, act):
    from mnntool.runtime.kernels.micro.winograd import tile_size
    rng = np.random.default_rng(cin + h)
    x = rng.standard_normal((2, cin, h, w)).astype(np.float32)
    wt = (rng.standard_normal((cout, cin, 3, 3)) / np.sqrt(cin * 9)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    ref, got = _conv(x, wt, b, act=act)
    close(ref, got, 1e-4 if tile_size(h, w) == 4 else 2e-5)


@needs_avx512
@pytest.mark.parametrize("cin, cout, h, w, pads", [(24, 32, 118, 112, (1, 1, 1, 1)), (16, 16, 150, 97, (0, 2, 1, 0)),
                                                   (8, 24, 90, 200, (2, 0, 0, 1))])
def test_winograd_in_chunks_of_tile_rows(monkeypatch, cin, cout, h, w, pads):
    """Large maps run F(4x4) a chunk of tile rows at a time (the chunk's first padded row passed as its
    own top padding, the output rows from the chunk's first on); a small budget here makes chunks of 4
    tile rows and a short last one. Tolerance as the other F(4x4) cases."""
    from mnntool.runtime.kernels.micro import winograd
    monkeypatch.setattr(winograd, "CHUNK_BYTES", 1 << 16)
    rng = np.random.default_rng(h + w)
    x = rng.standard_normal((1, cin, h, w)).astype(np.float32)
    wt = (rng.standard_normal((cout, cin, 3, 3)) / np.sqrt(cin * 9)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    t, l, bb, r = pads
    wi = winograd.Winograd(wt, b, cin, h, w, h + t + bb - 2, w + l + r - 2, t, l, 0, NO_GRID, 1)
    assert 4 == wi.chunk < wi.th and wi.th % 4, "chunks of 4 tile rows, the last one short"
    ref, got = _conv(x, wt, b, pads=pads, act=0)
    close(ref, got, 1e-4)


@needs_avx512
@pytest.mark.parametrize("h, w, pads", [(20, 23, (0, 2, 1, 0)), (17, 30, (2, 0, 0, 1)), (12, 12, (0, 0, 0, 0)),
                                        (9, 40, (1, 2, 2, 1))])
def test_winograd_reads_padding_in_place(h, w, pads):
    """F(4x4) reads its input where it is: uneven padding, none, and maps whose tiles run past the edge."""
    rng = np.random.default_rng(h * w)
    x = rng.standard_normal((1, 16, h, w)).astype(np.float32)
    wt = (rng.standard_normal((24, 16, 3, 3)) / 12).astype(np.float32)
    b = rng.standard_normal(24).astype(np.float32)
    ref, got = _conv(x, wt, b, pads=pads, act=0)
    close(ref, got, 1e-4)


@needs_avx512
@pytest.mark.parametrize("cin, cout, h, k, stride, pads, dilation", [
    (3, 64, 64, 7, 2, (3, 3, 3, 3), 1), (64, 128, 28, 3, 2, (1, 1, 1, 1), 1), (256, 512, 14, 3, 2, (1, 1, 1, 1), 1),
    (5, 7, 11, 3, 1, (0, 1, 2, 0), 1), (16, 24, 20, 3, 1, (2, 2, 2, 2), 2), (6, 10, 13, 5, 3, (1, 2, 0, 1), 1),
    (32, 16, 15, 1, 2, (0, 0, 0, 0), 1), (600, 24, 9, 3, 2, (1, 1, 1, 1), 1), (4, 8, 12, 3, 2, (0, 2, 1, 0), 1),
    (4, 8, 9, 4, 2, (1, 0, 0, 1), 1), (5, 12, 40, 3, 1, (2, 1, 0, 2), 2), (4, 20, 70, 5, 2, (2, 2, 2, 2), 1),
    (3, 16, 29, 3, 1, (1, 1, 1, 1), 1), (8, 16, 20, 3, 2, (1, 1, 1, 1), 1)])
def test_convolution_without_im2col_matches_torch(cin, cout, h, k, stride, pads, dilation):
    """Narrow outputs copy a panel per tile (conv_im2col); outputs 32+ wide (or few taps) with small weights
    read the taps in place (conv_rows, or on the phase planes' width: conv_grouped at one group); outputs of
    at most 64 pixels (not 48) take an im2col matrix and ocgemm."""
    rng = np.random.default_rng(cin * k)
    x = rng.standard_normal((1, cin, h, h + 3)).astype(np.float32)
    w = (rng.standard_normal((cout, cin, k, k)) / np.sqrt(cin * k * k)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    ref, got = _conv(x, w, b, stride, pads, dilation, act=1)
    close(ref, got)


@needs_avx512
@pytest.mark.parametrize("h, w, kh, t", [(17, 17, 7, 3), (9, 5, 3, 1), (6, 40, 5, 0)])
def test_conv_im2col_panels_of_planes_as_wide_as_the_output(h, w, kh, t):
    """A kh x 1 window: the output rows of a tile continue each other in the phase planes, so `_panel` copies
    one run per tap, across output rows (checked against torch, 1e-5 of the largest output)."""
    from mnntool.runtime.kernels.micro import float_gemm as fg
    rng = np.random.default_rng(h * w + kh)
    cin, cout = 12, 20
    x = rng.standard_normal((cin, h, w)).astype(np.float32)
    wt = (rng.standard_normal((cout, cin, kh, 1)) / np.sqrt(cin * kh)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    oh = h + 2 * t - kh + 1
    xq = np.zeros((cin, h + 2 * t, w), np.float32)
    fg.phase_split(x, t, 0, 1, 1, xq)
    koff = fg.tap_offsets(cin, kh, 1, 1, 1, 1, 1, h + 2 * t, w)
    pk = fg.PackedGemm(wt.reshape(cout, -1), b, 0, NO_GRID, oh * w, 1)
    out = np.full(cout * oh * w, np.nan, np.float32)
    fg.conv_im2col(xq, koff, koff.size, oh, w, pk.wp, 16, cout, 1, pk.bias, pk.epf, pk.grid, out)
    ref = F.conv2d(torch.from_numpy(x[None]), torch.from_numpy(wt), torch.from_numpy(b), padding=(t, 0)).numpy()
    assert np.abs(out.reshape(ref.shape) - ref).max() <= 1e-5 * np.abs(ref).max()


@pytest.mark.parametrize("h, ceil, pad", [(112, False, 1), (9, True, 1), (10, False, 1), (15, True, 1),
                                         (4, False, 1), (3, True, 1), (10, True, 0), (9, False, 0), (16, True, 0)])
@pytest.mark.parametrize("avx512", [True, False])
def test_max_pool_3x3_stride2_matches_torch(monkeypatch, h, ceil, pad, avx512):
    """Pooling reads the input where it is: padding, and ceil-mode windows past the end, are -inf. With
    AVX-512 the depthwise IR row kernel does it with max for FMA; without, a Numba row kernel."""
    from mnntool.runtime.kernels.micro import depthwise3x3
    from mnntool.runtime.kernels.ops.pool import pooling
    if avx512 and not depthwise3x3.HAS_AVX512:
        pytest.skip("this CPU has no AVX-512")
    monkeypatch.setattr(depthwise3x3, "HAS_AVX512", avx512)
    rng = np.random.default_rng(h)
    x = rng.standard_normal((2, 5, h, h + 1)).astype(np.float32)
    ref = F.max_pool2d(torch.from_numpy(x), 3, 2, pad, ceil_mode=ceil).numpy()

    class Node:
        param = {"type": "MAXPOOL", "kernelX": 3, "kernelY": 3, "strideX": 2, "strideY": 2, "padX": pad,
                 "padY": pad, "padType": "CAFFE"}
    k = pooling(Node, [Val(x.shape)], [Val(ref.shape)], Settings(2))
    y = np.empty(ref.shape, np.float32)
    k.fn([x], [y])
    np.testing.assert_array_equal(y, ref)


@pytest.mark.parametrize("c, h, w, t, l, sh, sw", [(4, 12, 11, 0, 2, 2, 2), (5, 17, 13, 2, 1, 3, 3), (3, 9, 9, 1, 0, 2, 2),
                                                  (6, 10, 10, 2, 2, 1, 1), (2, 14, 14, 1, 1, 2, 2), (3, 8, 15, 1, 3, 1, 2),
                                                  (2, 5, 70, 1, 1, 2, 2), (3, 4, 37, 0, 0, 2, 2), (2, 3, 33, 2, 3, 2, 2)])
def test_phase_split_matches_padding_and_slicing(c, h, w, t, l, sh, sw):
    """Phase planes against numpy: pad the input (zeros), then plane (c, a, b) = padded[c, a::sh, b::sw],
    cut or zero-filled to the planes' size; the border stays zero. Exact."""
    from mnntool.runtime.kernels.micro.float_gemm import phase_split
    rng = np.random.default_rng(c * h + w)
    x = rng.standard_normal((c, h, w)).astype(np.float32)
    hq, wq = -(-(h + t + 2) // sh), -(-(w + l + 2) // sw)
    got = np.zeros((c * sh * sw, hq, wq), np.float32)
    phase_split(x, t, l, sh, sw, got)
    padded = np.zeros((c, hq * sh, wq * sw), np.float32)
    padded[:, t:t + h, l:l + w] = x[:, :hq * sh - t, :wq * sw - l]
    want = padded.reshape(c, hq, sh, wq, sw).transpose(0, 2, 4, 1, 3).reshape(c * sh * sw, hq, wq)
    np.testing.assert_array_equal(got, want)


def test_winograd_weights_are_g_w_gt_packed_for_the_gemms():
    """transform_weights against G w G^T in float64 (einsum, the textbook form); transform_packed against
    the fgemm packing of it (reference: pack_stacked), for output counts off the block size too."""
    from mnntool.runtime.kernels.micro.float_gemm import pack_stacked
    from mnntool.runtime.kernels.micro.winograd import G2, G4, transform_packed, transform_weights
    rng = np.random.default_rng(3)
    for o, c, block in ((16, 8, 16), (30, 17, 16), (40, 5, 32)):
        w = rng.standard_normal((o, c, 3, 3)).astype(np.float32)
        for m, g in ((2, G2), (4, G4)):
            ref = np.einsum("ai,ocij,bj->aboc", g, w.astype(np.float64), g).reshape(-1, o, c)
            u = transform_weights(w, m)
            np.testing.assert_allclose(u, ref, rtol=1e-6, atol=1e-6)
            packed = transform_packed(w, m, block)
            np.testing.assert_allclose(packed, pack_stacked(u, block), rtol=1e-6, atol=1e-6)
            assert packed.ctypes.data % 64 == 0
