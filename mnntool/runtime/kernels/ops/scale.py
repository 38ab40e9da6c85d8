"""Scale: a BatchNorm the converter could not fold into a convolution (DenseNet's pre-activation
BatchNorms read a Concat; BatchNorm1d over tokens), with the activation after it fused
(runtime/plan/fuse_activations.py)."""
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


@njit(parallel=True, cache=True, fastmath=True)
def scale_cols(x, s, b, kind, alpha, beta, out):
    """out[r, j] = post(x[r, j] * s[j] + b[j]): the scale runs along a row. For channels with few values
    each, BatchNorm1d over tokens above all ((tokens, C): one value a channel): scale_rows' rows of one
    float took 48% of LeViT-128s (9.9 of 19.8 ms here; 0.6 ms now)."""
    for r in prange(x.shape[0]):
        src, dst = x[r], out[r]
        if kind == POST_CLIP:
            for j in range(src.shape[0]):
                dst[j] = min(max(src[j] * s[j] + b[j], alpha), beta)
            continue
        for j in range(src.shape[0]):
            dst[j] = src[j] * s[j] + b[j]
        if kind:
            _post_block(dst, kind, alpha, beta)


# channels with fewer values than this each run along rows (scale_cols): a row that short does not vectorize
FEW_PER_CHANNEL = 16


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
    per = int(np.prod(shape[2:]))
    if per < FEW_PER_CHANNEL:
        width = shape[1] * per
        s, b = np.ascontiguousarray(np.repeat(s, per)), np.ascontiguousarray(np.repeat(b, per))
        fn = sized(scale_cols, int(np.prod(shape)) * (8 if kind else 1), settings.threads)
        return writes(lambda i, o: fn(i[0].reshape(-1, width), s, b, kind, alpha, beta, o[0].reshape(-1, width)))
    rows = shape[0] * shape[1]
    fn = sized(scale_rows, int(np.prod(shape)) * (8 if kind else 1), settings.threads)
    return writes(lambda i, o: fn(i[0].reshape(rows, -1), s, b, kind, alpha, beta, o[0].reshape(rows, -1)))
