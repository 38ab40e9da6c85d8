"""Stride-1 int8 convolutions read by the VNNI GEMM straight from the quantized grid (int8_gemm.gemm_grid,
no im2col) against the im2col path (tested against MNN and numpy in test_int8_kernels.py): the same
accumulators in the same epilogue, so the outputs are equal bit for bit (tolerance: none), with and
without a table op's codes, over padding, dilation, channel counts not a multiple of 4 or 8, rows not
a multiple of 16 and batches."""
import numpy as np
import pytest

from mnntool.runtime.kernels.micro import int8_conv, int8_gemm
from mnntool.runtime.kernels.ops.conv import Int8Grids

pytestmark = pytest.mark.skipif(not int8_gemm.HAS_VNNI, reason="the integer kernel needs AVX-512 VNNI")

CASES = {   # cin, cout, (kh, kw, sh, sw, dh, dw, t, l, b, r), (h, w), batch
    "3x3_30wide": (8, 24, (3, 3, 1, 1, 1, 1, 1, 1, 1, 1), (9, 30), 1),
    "cin5_batch2": (5, 10, (3, 3, 1, 1, 1, 1, 1, 1, 1, 1), (16, 16), 2),
    "dilated": (12, 16, (3, 3, 1, 1, 2, 2, 2, 2, 2, 2), (7, 33), 1),
    "5x5_uneven_pad": (6, 9, (5, 5, 1, 1, 1, 1, 2, 1, 2, 3), (14, 17), 1),
    "1x3_no_pad": (16, 8, (1, 3, 1, 1, 1, 1, 0, 0, 0, 0), (4, 50), 1),
}


def _conv(monkeypatch, fill, case, act, table):
    cin, cout, geo, (h, w), n = CASES[case]
    kh, kw, sh, sw, dh, dw, t, l, b, r = geo
    oh, ow = h + t + b - dh * (kh - 1), w + l + r - dw * (kw - 1)
    rng = np.random.default_rng(cin * cout)
    q = rng.integers(-127, 128, (cout, cin * kh * kw)).astype(np.int8)
    alpha = (rng.random(cout) * 2e-3).astype(np.float32)
    bias = rng.standard_normal(cout).astype(np.float32)
    x = (rng.standard_normal((n, cin, h, w)) * 2).astype(np.float32)
    grids = Int8Grids((0.05, -127, 127), (0.1, -128, 127), 0, 0)
    monkeypatch.setattr(int8_conv, "GRID_FILL", fill)
    codes = (rng.integers(-128, 128, 256).astype(np.int8), np.float32(2), np.float32(0.25)) if table else None
    fn = int8_conv.int8_convolution(geo, q, alpha, bias, act, grids, x.shape, (n, cout, oh, ow), 1, codes)
    y = np.full((n, cout, oh, ow), np.nan, np.float32)
    fn([x], [y])
    return y


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("act,table", [(0, False), (1, True)])
def test_grid_matches_im2col(monkeypatch, case, act, table):
    if table and not int8_gemm.HAS_VBMI:
        pytest.skip("table codes need AVX-512 VBMI")
    grid = _conv(monkeypatch, 0.0, case, act, table)
    cols = _conv(monkeypatch, 2.0, case, act, table)
    assert not np.isnan(grid).any()
    np.testing.assert_array_equal(grid, cols)
