"""The batch-1 fully connected kernel (`float_gemv.matvec`) against numpy in float64; tolerance 2e-5 of the
output's largest magnitude (fp32 sums of up to 2048 products)."""
import numpy as np
import pytest

from mnntool.runtime.kernels import serial
from mnntool.runtime.kernels.micro.float_gemv import HAS_AVX512, matvec

pytestmark = pytest.mark.skipif(not HAS_AVX512, reason="the kernel needs AVX-512")


@pytest.mark.parametrize("o, k", [(1000, 1280), (17, 5), (16, 16), (33, 100), (1, 1), (10, 2048), (31, 15)])
@pytest.mark.parametrize("bounds", [(-np.inf, np.inf), (0, 6)])
@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("ahead", [False, True])       # with the next block's rows prefetched or not
def test_matvec_matches_numpy(o, k, bounds, parallel, ahead):
    rng = np.random.default_rng(o * 7 + k)
    w = rng.standard_normal((o, k)).astype(np.float32)
    x = rng.standard_normal(k).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    out = np.full(o + 5, np.nan, np.float32)        # lanes past O must stay untouched
    (matvec if parallel else serial(matvec))(w, x, b, np.float32(bounds[0]), np.float32(bounds[1]), ahead, out[:o])
    ref = np.clip(w.astype(np.float64) @ x + b, *bounds)
    assert np.abs(out[:o] - ref).max() <= 2e-5 * max(np.abs(ref).max(), 1e-6)
    assert np.isnan(out[o:]).all()
