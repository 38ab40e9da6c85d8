"""Scale: a BatchNorm the converter could not fold into a convolution (DenseNet's pre-activation
BatchNorms read a Concat), with the activation after it fused (runtime/fusion.py)."""
from __future__ import annotations

import numpy as np
from ..compile.jit import njit, prange

from .. import kernel, sized, writes
from ..micro.activation_ir import _post_block
from ..micro.epilogue import NO_POST, POST, POST_CLIP


@njit(parallel=True, cache=True, fastmath=True)
def scale_rows(x, s, b, kind, alpha, beta, out):
    """out[r] = post(x[r] * s[r % C] + b[r % C]) over rows (N*C, P): one pass where NumPy's multiply,
    add and the ReLU after took three (DenseNet's 62 pre-activation BatchNorms: 7.5 + 2.5 ms)."""
    c = s.shape[0]
    for r in prange(x.shape[0]):
        src, dst = x[r], out[r]
        sc, bc = s[r % c], b[r % c]
        if kind == POST_CLIP:       # ReLU/ReLU6 in the same loop: it vectorizes (through _post_block's
            for j in range(src.shape[0]):       # switch, 3x slower)
                dst[j] = min(max(src[j] * sc + bc, alpha), beta)
            continue
        for j in range(src.shape[0]):
            dst[j] = src[j] * sc + bc
        if kind:
            _post_block(dst, kind, alpha, beta)


@kernel("Scale")
def scale(node, ins, outs, settings):
    shape = ins[0].shape
    s = np.asarray(node.param["scaleData"], np.float32).reshape(-1)
    b = node.param.get("biasData")
    b = np.asarray(b, np.float32).reshape(-1) if b is not None and len(b) else np.zeros_like(s)
    kind, alpha, beta = node.param.get(POST, NO_POST)
    kind, alpha, beta = int(kind), np.float32(alpha), np.float32(beta)
    if len(shape) < 2 or shape[1] != s.size or b.size != s.size:
        if kind:
            raise ValueError("a fused activation needs a per-channel Scale")
        s4 = s.reshape((1, -1) + (1,) * (len(shape) - 2))
        b4 = b.reshape(s4.shape)

        def broadcast(i, o):
            np.multiply(i[0], s4, out=o[0])
            o[0] += b4
        return writes(broadcast)
    rows = shape[0] * shape[1]
    fn = sized(scale_rows, int(np.prod(shape)) * (8 if kind else 1), settings.threads)
    return writes(lambda i, o: fn(i[0].reshape(rows, -1), s, b, kind, alpha, beta, o[0].reshape(rows, -1)))
