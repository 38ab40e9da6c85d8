"""MatMul on BLAS, with a constant right-hand side packed (transposed, contiguous) at prepare time."""
from __future__ import annotations

import numpy as np

from . import kernel, writes


@kernel("MatMul", "BatchMatMul")
def matmul(node, ins, outs):
    ta = bool(node.param.get("transposeA") or node.param.get("adjX"))
    tb = bool(node.param.get("transposeB") or node.param.get("adjY"))
    const_b = ins[1].value
    if const_b is not None:
        b = np.asarray(const_b, np.float32)
        b = np.ascontiguousarray(np.swapaxes(b, -1, -2) if tb and b.ndim > 1 else b)
        if len(ins[0].shape) > 2 and b.ndim == 2 and not ta:
            a_shape = ins[0].shape

            def run_2d(i, o):      # fold batch dims into rows: one sgemm (np.dot: 1.8 us a call, matmul 3.2)
                np.dot(i[0].reshape(-1, a_shape[-1]), b, out=o[0].reshape(-1, b.shape[-1]))
            return writes(run_2d)

        def run_const(i, o):
            a = np.swapaxes(i[0], -1, -2) if ta else i[0]
            np.matmul(a, b, out=o[0])
        return writes(run_const)

    def run(i, o):
        a = np.swapaxes(i[0], -1, -2) if ta else i[0]
        bb = np.swapaxes(i[1], -1, -2) if tb else i[1]
        np.matmul(a, bb, out=o[0])
    return writes(run)
