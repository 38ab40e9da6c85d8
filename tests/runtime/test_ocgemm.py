"""The channels-in-lanes fp32 GEMM (`few_pixel_gemm`) for few pixels, against numpy in float64; tolerance 2e-5
of the output's largest magnitude (fp32 sums over up to 960 products)."""
import numpy as np
import pytest

from mnntool.runtime.kernels.micro.epilogue import NO_GRID, grid_of
from mnntool.runtime.kernels.micro.few_pixel_gemm import HAS_AVX512, OcGemm, ocgemm, pack32, suits

pytestmark = pytest.mark.skipif(not HAS_AVX512, reason="the micro-kernel needs AVX-512")


def close(ref, got, tol=2e-5):
    assert np.abs(np.asarray(got, np.float64) - ref).max() <= tol * max(np.abs(ref).max(), 1e-6)


@pytest.mark.parametrize("o, k, p", [(960, 160, 49), (160, 960, 49), (13, 7, 1), (40, 16, 13), (33, 64, 63),
                                     (32, 5, 8), (64, 300, 16), (1280, 320, 49)])
@pytest.mark.parametrize("act", [0, 2])
def test_ocgemm_matches_numpy(o, k, p, act):
    rng = np.random.default_rng(o + k + p)
    w = rng.standard_normal((o, k)).astype(np.float32)
    x = rng.standard_normal((k, p)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    out = np.full((o + 3, p), np.nan, np.float32)      # rows past O must stay untouched
    OcGemm(w, b, act, NO_GRID, p, 2)(x.reshape(-1), p, out.reshape(-1), p)
    ref = w.astype(np.float64) @ x + b[:, None]
    ref = np.clip(ref, 0, 6) if act == 2 else ref
    close(ref, out[:o])
    assert np.isnan(out[o:]).all()


def test_ocgemm_batches_with_strides_and_rounds_to_the_grid():
    """Winograd's use: several GEMMs, each with its own weights, input and output; and the int8 grid."""
    rng = np.random.default_rng(3)
    batches, o, k, p = 4, 40, 24, 16
    w = rng.standard_normal((batches, o, k)).astype(np.float32) * 0.1
    x = rng.standard_normal((batches, k, p)).astype(np.float32)
    wp = np.concatenate([pack32(w[i]) for i in range(batches)])
    bias = np.zeros(64, np.float32)
    out = np.empty((batches, 48, p), np.float32)
    grid = grid_of(0.05, -127, 127)
    from mnntool.runtime.kernels.micro.float_gemm import epilogue
    ocgemm(x.reshape(-1), p, k * p, p, wp, wp.size // batches, k, o, bias, epilogue(1, grid), 1, out.reshape(-1), p,
           48 * p, batches)
    ref = np.clip(np.rint(np.maximum(np.einsum("bok,bkp->bop", w.astype(np.float64), x), 0) / 0.05), -127, 127) * 0.05
    diff = np.abs(out[:, :o] - ref)
    assert diff.max() <= 0.05 + 1e-6 and (diff > 1e-5).mean() < 0.01


def test_suits_few_pixels_only():
    assert suits(49, 1 << 20) and suits(7, 1024) and suits(16, 1 << 20)
    assert not suits(16, 256 * 1024) and not suits(48, 1 << 20) and not suits(196, 1 << 20)
