"""The weight-only matrix-vector kernel (kernels/quant_gemv.py) on its stored codes.

Reference: the same IDSTQuan table dequantized as MNN's loader reads it (format.idst.dequantize, tested
against MNN's converter in tests/quant) and multiplied in float64. Tolerance: max abs error <= 1e-5 x
max |y| (float32 sums in another order). The whole-model check in MNN is tests/quant/test_hqq.py.
"""
import numpy as np
import pytest

from mnntool.format.idst import dequantize
from mnntool.quant.weights import quantize_weight
from mnntool.runtime.kernels.micro.quant_gemv import QMatVec, pack_nibbles


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("asymmetric", [False, True])
@pytest.mark.parametrize("block", [None, 32, 64, 128])
@pytest.mark.parametrize("rows,threads", [(50, 1), (300, 2)])
def test_matches_dequantized_product(bits, asymmetric, block, rows, threads):
    rng = np.random.default_rng(rows + bits)
    k = 256
    w = (rng.standard_t(4, (rows, k)) * 0.05).astype(np.float32)
    x = rng.standard_normal(k).astype(np.float32)
    bias = rng.standard_normal(rows).astype(np.float32)
    qp = quantize_weight(w, bits, asymmetric, rows, chunk=block)
    mv = QMatVec.of(qp, rows, bias, 0, threads)
    assert mv is not None
    y = np.full(rows, np.nan, np.float32)
    mv(x, y)
    ref = dequantize(qp, rows).astype(np.float64) @ x + bias
    assert np.abs(y - ref).max() <= 1e-5 * np.abs(ref).max()


def test_relu_epilogue_and_declined_layouts():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((20, 64)).astype(np.float32)
    x = rng.standard_normal(64).astype(np.float32)
    qp = quantize_weight(w, 8, False, 20)
    y = np.empty(20, np.float32)
    QMatVec.of(qp, 20, None, 1, 1)(x, y)                                    # 1: ReLU
    np.testing.assert_allclose(y, np.maximum(dequantize(qp, 20) @ x, 0), atol=1e-5)
    assert QMatVec.of(quantize_weight(w, 4, True, 20, chunk=16), 20, None, 0, 1) is None   # int4 blocks of 16
    assert QMatVec.of(quantize_weight(w[:, :40], 8, False, 20), 20, None, 0, 1) is None   # 40 codes a row


def test_nibble_layout():
    u = np.arange(64).reshape(1, 64) % 16
    p = pack_nibbles(u)
    assert p.shape == (1, 32)
    assert [p[0, j] & 15 for j in range(16)] == list(u[0, :16])
    assert [p[0, j] >> 4 for j in range(16)] == list(u[0, 16:32])
