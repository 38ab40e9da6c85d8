"""MatMul: on `linear`'s float_gemm drivers for float32 on AVX-512 (a constant right-hand side packed with
the bias slot at prepare; equal batch dims of two activations as one batched GEMM), else on BLAS
with a constant right-hand side packed (transposed, contiguous) at prepare time."""
from __future__ import annotations

import numpy as np

from .. import kernel, writes


def _float32(*vals) -> bool:
    return all(v.dtype == "float32" and v.shape is not None for v in vals)


@kernel("MatMul", "BatchMatMul")
def matmul(node, ins, outs, settings):
    from ..micro.float_gemm import HAS_AVX512
    ta = bool(node.param.get("transposeA") or node.param.get("adjX"))
    tb = bool(node.param.get("transposeB") or node.param.get("adjY"))
    const_b = ins[1].value
    if const_b is not None:
        b = np.asarray(const_b, np.float32)
        b = np.ascontiguousarray(np.swapaxes(b, -1, -2) if tb and b.ndim > 1 else b)
        if HAS_AVX512 and b.ndim == 2 and not ta and _float32(ins[0], outs[0]) and len(ins[0].shape) >= 2:
            from ..micro.epilogue import NO_GRID
            from .linear import SMALL_GEMM, RowGemm
            k, n = b.shape
            m = int(np.prod(ins[0].shape[:-1]))
            if m == 1 and k * n >= 65536:
                # one row with weights past L2: the matrix-vector kernel's 16 streams (below, np.dot's
                # call costs less: 1.6 against 2.1 us at 64x256, an unrolled LSTM's recurrence)
                from ..micro.float_gemv import MatVec
                mv = MatVec(b.T, None, 0, settings.threads)

                def run_vector(i, o):
                    mv(i[0].reshape(k), o[0].reshape(n))
                return writes(run_vector)
            if m > 1 and m * k * n >= SMALL_GEMM:
                # batch dims folded into rows: one GEMM
                return writes(RowGemm(b, None, 0, NO_GRID, m, settings.threads).step())
        if len(ins[0].shape) > 2 and b.ndim == 2 and not ta:
            a_shape = ins[0].shape

            def run_2d(i, o):      # fold batch dims into rows: one sgemm (np.dot: 1.8 us a call, matmul 3.2)
                np.dot(i[0].reshape(-1, a_shape[-1]), b, out=o[0].reshape(-1, b.shape[-1]))
            return writes(run_2d)

        def run_const(i, o):
            a = np.swapaxes(i[0], -1, -2) if ta else i[0]
            np.matmul(a, b, out=o[0])
        return writes(run_const)

    sa, sb = ins[0].shape, ins[1].shape
    from .linear import SMALL_GEMM
    if (HAS_AVX512 and not ta and not tb and _float32(ins[0], ins[1], outs[0]) and len(sa) == len(sb) >= 3
            and tuple(sa[:-2]) == tuple(sb[:-2]) and np.prod(sa, dtype=np.int64) * sb[-1] >= SMALL_GEMM):
        from .linear import BatchedMatMul
        batches, (m, k), n = int(np.prod(sa[:-2])), sa[-2:], sb[-1]
        bmm = BatchedMatMul(batches, m, k, n, settings.threads)

        def run_batched(i, o):
            bmm(i[0].reshape(batches, m, k), np.ascontiguousarray(i[1]).reshape(batches, k, n), o[0])
        return writes(run_batched)

    def run(i, o):
        a = np.swapaxes(i[0], -1, -2) if ta else i[0]
        bb = np.swapaxes(i[1], -1, -2) if tb else i[1]
        np.matmul(a, bb, out=o[0])
    return writes(run)
