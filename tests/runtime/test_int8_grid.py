"""Int8 convolutions read by the VNNI GEMM straight from the quantized grid in planes of words
(int8_conv.quantize_planes, int8_gemm.gemm_planes: no im2col; strided windows through phase planes;
stride-1 rows at a pitch sharing the side padding), and by the tile with the output channels in the lanes
(int8_lanes_oc.gemm_oc, from the grid or 1x1 layers' blocks), against the im2col path (tested against MNN and numpy
in test_int8_kernels.py): the same accumulators in the same epilogue, so the outputs are equal bit for
bit (tolerance: none), with and without a table op's codes, over padding (uneven, one side only),
dilation, strides 2 and 3 (also one axis only), channel counts not a multiple of 4 or 8, rows not a
multiple of 16, small maps and batches."""
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
    "3x3_7x7_map": (20, 12, (3, 3, 1, 1, 1, 1, 1, 1, 1, 1), (7, 7), 1),
    "left_pad_only": (8, 8, (3, 3, 1, 1, 1, 1, 0, 2, 1, 0), (6, 21), 1),
    "stem_7x7_s2": (3, 16, (7, 7, 2, 2, 1, 1, 3, 3, 3, 3), (30, 30), 1),
    "3x3_s2_odd": (12, 8, (3, 3, 2, 2, 1, 1, 1, 1, 1, 1), (15, 17), 2),
    "3x3_s2_uneven_pad": (8, 16, (3, 3, 2, 2, 1, 1, 0, 0, 1, 1), (14, 14), 1),
    "s2x1_dilated": (9, 8, (3, 3, 2, 1, 2, 2, 2, 2, 2, 2), (13, 19), 1),
    "4x4_s3": (4, 8, (4, 4, 3, 3, 1, 1, 1, 2, 2, 1), (20, 23), 1),
    "3x3_48ch_14x14": (16, 48, (3, 3, 1, 1, 1, 1, 1, 1, 1, 1), (14, 14), 1),
    "1x1_direct_40ch": (20, 40, (1, 1, 1, 1, 1, 1, 0, 0, 0, 0), (7, 7), 2),
    "1x1_s2_direct": (12, 33, (1, 1, 2, 2, 1, 1, 0, 0, 0, 0), (13, 13), 1),
}


def conv_inputs(case):
    """A case (cin, cout, geometry, (h, w), batch)'s seeded int8 weights, scales, bias, input and grids, the
    output shape, and the generator for anything drawn after them (test_int8_amx uses the same layers)."""
    cin, cout, geo, (h, w), n = case
    kh, kw, sh, sw, dh, dw, t, l, b, r = geo
    oh, ow = (h + t + b - dh * (kh - 1) - 1) // sh + 1, (w + l + r - dw * (kw - 1) - 1) // sw + 1
    rng = np.random.default_rng(cin * cout)
    q = rng.integers(-127, 128, (cout, cin * kh * kw)).astype(np.int8)
    alpha = (rng.random(cout) * 2e-3).astype(np.float32)
    bias = rng.standard_normal(cout).astype(np.float32)
    x = (rng.standard_normal((n, cin, h, w)) * 2).astype(np.float32)
    grids = Int8Grids((0.05, -127, 127), (0.1, -128, 127), 0, 0)
    return geo, q, alpha, bias, x, grids, (n, cout, oh, ow), rng


def _conv(monkeypatch, fill, oc_lanes, case, act, table):
    geo, q, alpha, bias, x, grids, out_shape, rng = conv_inputs(CASES[case])
    monkeypatch.setattr(int8_conv, "GRID_FILL", fill)
    monkeypatch.setattr(int8_conv, "OC_LANES", oc_lanes)
    codes = (rng.integers(-128, 128, 256).astype(np.int8), np.float32(2), np.float32(0.25)) if table else None
    fn = int8_conv.int8_convolution(geo, q, alpha, bias, act, grids, x.shape, out_shape, 1, codes)
    y = np.full(out_shape, np.nan, np.float32)
    fn([x], [y])
    return y


PATHS = {"grid": (0.0, np.inf), "oc_lanes": (2.0, 0.0)}     # (GRID_FILL, OC_LANES)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("act,table", [(0, False), (1, True)])
@pytest.mark.parametrize("path", sorted(PATHS))
def test_grid_matches_im2col(monkeypatch, case, act, table, path):
    if table and not int8_gemm.HAS_VBMI:
        pytest.skip("table codes need AVX-512 VBMI")
    got = _conv(monkeypatch, *PATHS[path], case, act, table)
    cols = _conv(monkeypatch, 2.0, np.inf, case, act, table)
    assert not np.isnan(got).any()
    np.testing.assert_array_equal(got, cols)
