"""FusedAttention (runtime/fusion.py): softmax(scale q k [+ mask]) v in one step, the scores and the
probabilities in work buffers every attention step shares (kernels.Scratch; the same row softmax as
the Softmax kernel, which reads its input after writing its output: not in place).

Scores larger than L2 are computed a slice of leading batch indices at a time: MobileViT's first
attention has 4 patches x 4 heads x 256 x 256 scores (4 MB), which went to memory and back four times
(scores written, read by the softmax, probabilities written, read by P@V); slice by slice they stay in
L2 (1.6 -> 1.33 ms a step at 1 thread)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ...host_tuning import parallel_min_work
from .. import PLAN_ONLY, Scratch, direct, sized, writes
from ..micro.llvm_ir import host_has
from .norm import row_softmax
from .small_attention import (SMALL_ATTENTION_MAX_DIM, SMALL_ATTENTION_MAX_WORK, attend, attend_heads, geometry,
                              work_size)

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


def _replay(x: np.ndarray, chain) -> np.ndarray:
    """The Permutes and Reshapes the planner took in (fusion._view_chain), as numpy views of x."""
    for kind, arg in chain:
        x = x.transpose(arg) if kind == "T" else x.reshape(arg)
    return x


class _Views:
    """An operand's views, kept for the array of the run before when they share its memory (the
    planner hands a step the same buffers every run; a reshape numpy could not view is a copy, made
    again every run)."""

    def __init__(self, chain):
        self.chain, self.src, self.view = chain, None, None

    def __call__(self, x):
        if not self.chain:
            return x
        if x is self.src:
            return self.view
        v = _replay(x, self.chain)
        if np.shares_memory(v, x):
            self.src, self.view = x, v
        return v


def fused_attention(node, ins, outs, settings):
    chains = node.param.get("views") or [[], [], []]
    # the shapes of q, k and v as the attention reads them (after the views)
    shape_of = [tuple(_replay(np.broadcast_to(np.float32(0), tuple(v.shape)), c).shape) for v, c in zip(ins, chains)]
    ins = [replace(v, shape=sh) for v, sh in zip(ins, shape_of)] + list(ins[3:])
    views = [_Views(c) for c in chains]
    out_perm = node.param.get("out_perm")
    if out_perm is not None:     # the step writes the Permute's output through its inverse
        inverse = tuple(int(d) for d in np.argsort(out_perm))
        outs = [replace(outs[0], shape=tuple(outs[0].shape[d] for d in inverse))]
    score_scale = np.float32(node.param.get("score_scale", 1.0))
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
        if score_scale != 1:
            np.multiply(scores, score_scale, out=scores)
        if mask is not None:
            np.add(scores, mask, out=scores)
        flat = probs.reshape(-1, lk)
        rows(scores.reshape(-1, lk), flat, scale)
        if guard:       # a fully masked row: NaN, which the model's own guard turns into 0
            np.copyto(flat, 0.0, where=np.isnan(flat))
        np.matmul(probs, vv, out=out)

    out_view = _Views([("T", inverse)] if out_perm is not None else [])
    # the compiled heads where they are ahead of NumPy's products (small_attention), their heads spread
    # over the threads when there is the work (MobileViT-xxs at 2 threads 11.6 -> 10.5 ms). Not for
    # larger heads at more threads: ViT-tiny's 3 x 197 x 197 x 64 took 231 us on 2 threads alone
    # against BLAS's 409 on one, but 463 in the model, where the q, k and v it reads were just
    # written by both threads (19.0 -> 19.5 ms)
    head_dim, work = q[-1], int(np.prod(scores_shape)) * q[-1]
    small = _Small(views + [out_view], transpose_b, score_scale, scale, guard, lk, head_dim,
                   settings.threads if work >= parallel_min_work(settings.threads) else 1) \
        if (head_dim <= SMALL_ATTENTION_MAX_DIM or work <= SMALL_ATTENTION_MAX_WORK) \
        and all(v.dtype == "float32" for v in ins) and host_has("avx512f") else None

    def run(i, o):
        if small is not None and small(i, o):
            return
        mask = i[3] if len(i) > 3 else None
        qq, kk, vv, out = views[0](i[0]), views[1](i[1]), views[2](i[2]), out_view(o[0])
        scores, probs = scores_of(), probs_of()
        if depth == 0:
            one(qq, kk, vv, mask, out, scores, probs)
            return
        for idx in np.ndindex(*scores_shape[:depth]):
            one(_index(qq, idx, rank), _index(kk, idx, rank), _index(vv, idx, rank),
                None if mask is None else _index(mask, idx, rank), out[idx], scores, probs)
    return writes(run)


def _places(arrays) -> tuple:
    """Where each array's elements lie (first address, shape, strides; None for None): arrays equal here
    read the same memory the same way (the arrays bound before are kept alive, so their memory is not
    another's)."""
    return tuple(None if a is None else (a.__array_interface__["data"][0], a.shape, a.strides, a.dtype.char)
                 for a in arrays)


class _Small:
    """small_attention.attend, its geometry worked out once for the operands of the run before when they
    are the same arrays and its views of them share their memory (the planner hands a step the same
    buffers every run)."""

    def __init__(self, views, transpose_b, score_scale, scale, guard, lk, head_dim, threads):
        from ...settings import cores
        self.views, self.transpose_b = views, transpose_b
        self.scalars = (np.float32(score_scale), np.float32(scale), bool(guard))
        if threads > 1:     # a part of the work buffer for every thread id Numba may give
            per = work_size(lk, head_dim)
            self.kernel, self.per = attend_heads, (per,)
            self.work = Scratch("attention_small", (per * cores(),))
        else:
            self.kernel, self.per = attend, ()
            self.work = Scratch("attention_small", (work_size(lk, head_dim),))
        self.seen, self.call, self.places, self.entry = None, None, None, None

    def __call__(self, i, o) -> bool:
        """Ran it (False: an operand it cannot read; the caller runs NumPy's products)."""
        mask = i[3] if len(i) > 3 else None
        seen = self.seen
        if seen is None or seen[0] is not i[0] or seen[1] is not i[1] or seen[2] is not i[2] or seen[3] is not mask \
                or seen[4] is not o[0]:
            raw = (i[0], i[1], i[2], mask, o[0])
            # a view step (a Squeeze, an unbound Reshape) hands a new array object over the same memory
            # every run: binding again took ~370 us (PVT-v2-b0's 8 attentions: 2.9 of 23 ms a run)
            if seen is not None and _places(raw) == self.places:
                self.seen = raw
            else:
                self._bind(*raw)
        if self.call is None:
            return False
        fn, args = self.call
        fn(*args, self.work(), *self.per, *self.scalars)
        return True

    def _bind(self, *raw):
        q, k, v, out = (view(x) for view, x in zip(self.views, raw[:3] + raw[4:]))
        # a view numpy could not make without a copy is new every run: bind again then
        shared = all(np.may_share_memory(x, y) for x, y in zip((q, k, v, out), raw[:3] + raw[4:]))
        self.seen = raw if shared else None
        self.places = _places(raw) if shared else None
        got = geometry(q, k if self.transpose_b else np.swapaxes(k, -1, -2), v, out, raw[3])
        if got is None:         # layouts it cannot read: NumPy's products, without asking again
            self.call = None
            return
        bufs, geo = got
        writable = all(b.flags.writeable for b in bufs)
        fn = self.kernel
        if writable:
            # the compiled entry for these argument types, looked up once (~350 us: an operand whose
            # view is a copy binds again every run, gcvit's and TinyViT's window attentions)
            kinds = tuple((b.dtype.char, b.flags.c_contiguous) for b in bufs)
            if self.entry is None or self.entry[0] != kinds:
                self.entry = (kinds, direct(self.kernel, *bufs, geo, self.work(), *self.per, *self.scalars))
            fn = self.entry[1]
        self.call = (fn, tuple(bufs) + (geo,))


PLAN_ONLY["FusedAttention"] = fused_attention
