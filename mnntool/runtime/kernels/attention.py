"""FusedAttention (runtime/fusion.py): softmax(scale q k [+ mask]) v in one step, the scores and the
probabilities in work buffers every attention step shares (kernels.Scratch; the same row softmax as
the Softmax kernel, which reads its input after writing its output: not in place).

Scores larger than L2 are computed a slice of leading batch indices at a time: MobileViT's first
attention has 4 patches x 4 heads x 256 x 256 scores (4 MB), which went to memory and back four times
(scores written, read by the softmax, probabilities written, read by P@V); slice by slice they stay in
L2 (1.6 -> 1.33 ms a step at 1 thread)."""
from __future__ import annotations

import numpy as np

from . import PLAN_ONLY, Scratch, direct, sized, writes
from .norm import row_softmax

SLICE_BYTES = 512 * 1024       # scores per slice: with the probabilities, half of a 2 MB L2


def slice_depth(scores_shape: tuple, out_batch: tuple, limit: int | None = None) -> int:
    """How many leading batch axes to index one by one so a slice's scores fit `limit` bytes (0: all at
    once). Only when the output has the scores' batch (v does not broadcast it wider)."""
    limit = SLICE_BYTES if limit is None else limit
    batch = tuple(scores_shape[:-2])
    if out_batch != batch:
        return 0
    for d in range(len(batch) + 1):
        if int(np.prod(scores_shape[d:])) * 4 <= limit:
            return d
    return len(batch)


def _index(a: np.ndarray, idx: tuple, rank: int):
    """a's part at leading index idx of a result of `rank` dims that a broadcasts into (aligned right; a
    size-1 axis gives its only entry)."""
    lead = rank - a.ndim
    key = tuple(0 if a.shape[j - lead] == 1 else idx[j] for j in range(len(idx)) if j >= lead)
    return a[key] if key else a


def fused_attention(node, ins, outs, settings):
    q, k = ins[0].shape, ins[1].shape
    transpose_b = bool(node.param.get("transposeB"))
    lk = k[-2] if transpose_b else k[-1]
    scores_shape = np.broadcast_shapes(q[:-2], k[:-2]) + (q[-2], lk)
    out_shape = outs[0].shape if outs and outs[0] is not None and outs[0].shape is not None else None
    depth = slice_depth(scores_shape, tuple(out_shape[:-2])) if out_shape is not None and \
        all(isinstance(d, int) for d in out_shape) else 0
    count = int(np.prod(scores_shape[depth:]))
    # buffers every attention step shares (scratch): one pair per step was cold at every run
    scores_of = Scratch("attention_scores", scores_shape[depth:])
    probs_of = Scratch("attention_probs", scores_shape[depth:])
    example = np.empty((count // lk, lk), np.float32)
    scale = np.float32(node.param.get("scale", 1.0))    # scalar factors of q and k the planner took in
    rows = direct(sized(row_softmax(), count * 8, settings.threads), example, example, scale)
    guard = bool(node.param.get("guard"))
    rank = len(scores_shape)

    def one(qq, kk, vv, mask, out, scores, probs):
        kk = np.swapaxes(kk, -1, -2) if transpose_b else kk
        np.matmul(qq, kk, out=scores)
        if mask is not None:
            np.add(scores, mask, out=scores)
        flat = probs.reshape(-1, lk)
        rows(scores.reshape(-1, lk), flat, scale)
        if guard:       # a fully masked row: NaN, which the model's own guard turns into 0
            np.copyto(flat, 0.0, where=np.isnan(flat))
        np.matmul(probs, vv, out=out)

    def run(i, o):
        mask = i[3] if len(i) > 3 else None
        scores, probs = scores_of(), probs_of()
        if depth == 0:
            one(i[0], i[1], i[2], mask, o[0], scores, probs)
            return
        for idx in np.ndindex(*scores_shape[:depth]):
            one(_index(i[0], idx, rank), _index(i[1], idx, rank), _index(i[2], idx, rank),
                None if mask is None else _index(mask, idx, rank), o[0][idx], scores, probs)
    return writes(run)


PLAN_ONLY["FusedAttention"] = fused_attention
