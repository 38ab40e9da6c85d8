"""fgemm with the activation rows packed per call (`linear`): fully connected layers over many rows
and batched MatMul, against numpy in float64; tolerance 2e-5 of the output's largest magnitude
(fp32 sums of up to 1025 products)."""
import numpy as np
import pytest

from mnntool.runtime.kernels import serial
from mnntool.runtime.kernels.micro.epilogue import NO_GRID
from mnntool.runtime.kernels.micro.float_gemm import OCB
from mnntool.runtime.kernels.micro.float_gemm import HAS_AVX512
from mnntool.runtime.kernels.ops.linear import BatchedMatMul, RowGemm, pack_rows

pytestmark = pytest.mark.skipif(not HAS_AVX512, reason="the kernels need AVX-512")


def close(ref, got, tol=2e-5):
    assert np.abs(np.asarray(got, np.float64) - ref).max() <= tol * max(np.abs(ref).max(), 1e-6)


@pytest.mark.parametrize("b, m, k", [(1, 8, 16), (2, 13, 37), (1, 1, 1), (3, 20, 5)])
@pytest.mark.parametrize("ones", [0, 1])
def test_pack_rows_layout(b, m, k, ones):
    a = np.random.default_rng(m + k).standard_normal((b, m, k)).astype(np.float32)
    nob, kp = -(-m // OCB), k + ones
    out = np.full(b * nob * kp * OCB, np.nan, np.float32)
    serial(pack_rows)(a, ones, out)
    want = np.zeros((b, nob * OCB, kp), np.float32)
    want[:, :m, :k] = a
    if ones:
        want[:, :m, k] = 1.0
    got = out.reshape(b, nob, kp, OCB).transpose(0, 1, 3, 2).reshape(b, nob * OCB, kp)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("m, k, n", [(128, 256, 768), (128, 1024, 256), (5, 3, 17), (130, 33, 100), (1000, 64, 8),
                                     (20, 40, 60), (17, 64, 256), (9, 64, 70), (11, 16, 33), (20, 40, 197)])
@pytest.mark.parametrize("bias, act", [(True, 0), (False, 1), (True, 2)])
def test_row_gemm_matches_numpy(m, k, n, bias, act):
    rng = np.random.default_rng(m * k + n)
    a = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    bb = rng.standard_normal(n).astype(np.float32)
    y = np.full((m, n), np.nan, np.float32)
    RowGemm(w, bb if bias else None, act, NO_GRID, m, 2).step()([a], [y])
    ref = a.astype(np.float64) @ w + (bb if bias else 0)
    close(np.clip(ref, 0, 6 if act == 2 else np.inf) if act else ref, y)


def test_row_gemm_step_reads_its_buffers_afresh_every_run():
    """The step keeps the flat views of the arrays it saw the run before: new contents of the same
    array, a new array, a strided input (copied, never kept) and a new output all give a @ w."""
    rng = np.random.default_rng(5)
    m, k, n = 9, 64, 48
    w = rng.standard_normal((k, n)).astype(np.float32)
    run = RowGemm(w, None, 0, NO_GRID, m, 1).step()
    a, y = rng.standard_normal((m, k)).astype(np.float32), np.empty((m, n), np.float32)
    wide = rng.standard_normal((m, 2 * k)).astype(np.float32)
    y2 = np.empty((m, n), np.float32)
    for x, out in [(a, y), (a, y), (a.copy(), y), (wide[:, ::2], y), (wide[:, ::2], y2), (a, y2)]:
        if x is a:
            a[...] = rng.standard_normal((m, k))
        else:
            x[...] = rng.standard_normal(x.shape)
        run([x], [out])
        close(x.astype(np.float64) @ w, out)


@pytest.mark.parametrize("batches, m, k, n", [(4, 128, 64, 128), (4, 128, 128, 64), (3, 7, 5, 9), (1, 9, 300, 33)])
def test_batched_matmul_matches_numpy(batches, m, k, n):
    rng = np.random.default_rng(batches + m + k + n)
    a = rng.standard_normal((batches, m, k)).astype(np.float32)
    b = rng.standard_normal((batches, k, n)).astype(np.float32)
    out = np.full((batches, m, n), np.nan, np.float32)
    BatchedMatMul(batches, m, k, n, 2)(a, b, out)
    close(a.astype(np.float64) @ b, out)
