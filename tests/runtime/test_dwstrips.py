"""depthwise_strips.depthwise_strips (stride 1 undilated: blocks of BLOCK_ROWS output rows, the last block of a
strip ending at its last row and redoing rows of the one before; other rows, dilation and stride 2
row by row) against torch's conv2d, with the fused epilogue. Tolerance 2e-5 of the largest output
(sums of up to 49 products)."""
import numpy as np
import pytest

from mnntool.runtime.kernels.micro.float_gemm import HAS_AVX512, epilogue_of
from mnntool.runtime.kernels.micro.epilogue import NO_GRID, POST_HARDSWISH, POST_SILU

torch = pytest.importorskip("torch")
F = torch.nn.functional
pytestmark = pytest.mark.skipif(not HAS_AVX512, reason="AVX-512 LLVM IR kernel")


@pytest.mark.parametrize("k, s, d", [(3, 1, 1), (5, 1, 1), (7, 1, 1), (5, 1, 2), (3, 2, 1), (5, 2, 1)])
@pytest.mark.parametrize("h, w, t, l, rows", [(7, 7, None, None, 8), (3, 20, None, None, 8), (4, 33, None, None, 8),
                                              (13, 5, 0, 1, 8), (30, 18, 1, 3, 5), (9, 40, 2, 0, 3)])
@pytest.mark.parametrize("post", [0, POST_HARDSWISH, POST_SILU])
def test_depthwise_strips_match_torch(k, s, d, h, w, t, l, rows, post):
    from mnntool.runtime.kernels.micro.depthwise_strips import depthwise_strips
    t = (k // 2) * d if t is None else min(t, (k - 1) * d)
    l = (k // 2) * d if l is None else min(l, (k - 1) * d)
    b_pad, r_pad = (k - 1) * d - t, (k - 1) * d - l     # "same" output size at stride 1
    c = 6
    rng = np.random.default_rng(k * 100 + h * 10 + w + s)
    x = rng.standard_normal((c, h, w)).astype(np.float32)
    wt = rng.standard_normal((c, k * k)).astype(np.float32) / k
    b = rng.standard_normal(c).astype(np.float32)
    ref = F.conv2d(F.pad(torch.from_numpy(x)[None], (l, r_pad, t, b_pad)), torch.from_numpy(wt.reshape(c, 1, k, k)),
                   torch.from_numpy(b), stride=s, dilation=d, groups=c)[0]
    if post == POST_HARDSWISH:
        ref = F.hardswish(ref)
    elif post == POST_SILU:
        ref = F.silu(ref)
    ref = ref.numpy()
    out = np.full(ref.shape, np.nan, np.float32)
    epf, grid = epilogue_of(0, NO_GRID, (post, 0.0, 0.0))
    depthwise_strips(x, wt.reshape(-1), b, k, k, s, d, t, l, epf, grid, np.zeros(w, np.float32), rows, out)
    np.testing.assert_allclose(out, ref, rtol=0, atol=2e-5 * max(1.0, float(np.abs(ref).max())))


@pytest.mark.parametrize("kh, kw", [(1, 3), (1, 5), (1, 11), (5, 1), (7, 1), (11, 1)])
@pytest.mark.parametrize("h, w, rows", [(7, 7, 8), (14, 14, 8), (3, 20, 8), (28, 33, 5), (2, 40, 3)])
@pytest.mark.parametrize("post", [0, POST_SILU])
def test_band_depthwise_strips_match_torch(kh, kw, h, w, rows, post):
    """Band windows (1 x k, k x 1, stride 1, "same" padding): blocks of rows, the rows after them, lanes past
    the row and rows past the plane read as zeros. Tolerance 2e-5 of the largest output."""
    from mnntool.runtime.kernels.micro.depthwise_strips import depthwise_strips
    t, l = kh // 2, kw // 2
    c = 5
    rng = np.random.default_rng(kh * 100 + kw * 10 + h + w)
    x = rng.standard_normal((c, h, w)).astype(np.float32)
    wt = rng.standard_normal((c, kh * kw)).astype(np.float32) / max(kh, kw)
    b = rng.standard_normal(c).astype(np.float32)
    ref = F.conv2d(F.pad(torch.from_numpy(x)[None], (l, kw - 1 - l, t, kh - 1 - t)),
                   torch.from_numpy(wt.reshape(c, 1, kh, kw)), torch.from_numpy(b), groups=c)[0]
    ref = (F.silu(ref) if post == POST_SILU else ref).numpy()
    out = np.full(ref.shape, np.nan, np.float32)
    epf, grid = epilogue_of(0, NO_GRID, (post, 0.0, 0.0))
    depthwise_strips(x, wt.reshape(-1), b, kh, kw, 1, 1, t, l, epf, grid, np.zeros(w, np.float32), rows, out)
    np.testing.assert_allclose(out, ref, rtol=0, atol=2e-5 * max(1.0, float(np.abs(ref).max())))
