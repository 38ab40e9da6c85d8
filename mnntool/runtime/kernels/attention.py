"""FusedAttention (runtime/fusion.py): softmax(q k [+ mask]) v in one step, the scores and the
probabilities in buffers of the kernel's own (the same row softmax as the Softmax kernel, which reads
its input after writing its output: not in place)."""
from __future__ import annotations

import numpy as np

from . import PLAN_ONLY, aligned_empty, sized, writes
from .norm import row_softmax


def fused_attention(node, ins, outs, settings):
    q, k = ins[0].shape, ins[1].shape
    transpose_b = bool(node.param.get("transposeB"))
    lk = k[-2] if transpose_b else k[-1]
    scores_shape = np.broadcast_shapes(q[:-2], k[:-2]) + (q[-2], lk)
    count = int(np.prod(scores_shape))
    scores = aligned_empty(count, np.float32).reshape(scores_shape)
    probs = aligned_empty(count, np.float32).reshape(scores_shape)
    rows = sized(row_softmax(), count * 8, settings.threads)
    guard = bool(node.param.get("guard"))

    def run(i, o):
        kk = np.swapaxes(i[1], -1, -2) if transpose_b else i[1]
        np.matmul(i[0], kk, out=scores)
        if len(i) > 3:
            np.add(scores, i[3], out=scores)
        flat = probs.reshape(-1, lk)
        rows(scores.reshape(-1, lk), flat)
        if guard:       # a fully masked row: NaN, which the model's own guard turns into 0
            np.copyto(flat, 0.0, where=np.isnan(flat))
        np.matmul(probs, i[2], out=o[0])
    return writes(run)


PLAN_ONLY["FusedAttention"] = fused_attention
