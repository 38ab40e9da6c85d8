"""Attention of a few short heads in one compiled call: a tiny transformer's step (GPT-2 of 4 heads x 16
tokens x 16 dims) spent 10.7 us in NumPy's calls (two batched matmuls, the scale, the mask, the NaN
guard), for ~16K multiply-adds.

Per (batch, head) the keys are gathered into a work buffer as dims x keys; then four query rows at a
time: their scores as 16-key vectors (the head's dims as the sum: four independent FMA chains), their
softmax (the four rows' passes interleaved), and their output rows as 16-dim vectors summed over the
keys. A block of fewer than four rows repeats its last row, which computes and writes the same values
again.

Operands are flat float32 arrays with element strides (`geometry`), so the head-split views of a packed
qkv tensor are read where they lie; their last axis must be contiguous (AVX-512 only). No score matrix
is ever whole, so large heads of few dims gain most: MobileViT's 16 x 256 x 256 x 16 1.24 against 2.07
ms in NumPy's products at 1 thread, 4 x 256 x 256 x 32 476 against 668 us (both with a causal mask).
"""
from __future__ import annotations

import numpy as np

from ..compile.jit import intrinsic, njit, numba, prange, types

from ..micro.llvm_ir import data_of, declare, first_lanes, k_loop, pointers, splat, vector_ops

# Where this runs instead of NumPy's batched products (BLAS): heads of at most SMALL_ATTENTION_MAX_DIM
# dims at any size, others up to SMALL_ATTENTION_MAX_WORK multiply-adds (batch x heads x Lq x Lk x D).
# 1 thread, us: 4 x 16 x 16 x 16 4.3 against 11.9; 4 x 64 x 64 x 64 71 against 77; 4 x 256 x 256 x 48
# 773 against 790; 3 x 197 x 197 x 64 406 against 453 with a mask, about even without one
SMALL_ATTENTION_MAX_WORK = 1 << 19
SMALL_ATTENTION_MAX_DIM = 32
ROWS = 4

# geometry: B, H, Lq, Lk, D (q's and k's), Dv (v's and the output's), then per operand (q, k, v, out, mask) its (batch, head, row) strides in
# elements (0 on an axis it broadcasts); every last axis is contiguous
_B, _H, _LQ, _LK, _D, _DV, _Q, _K, _V, _O, _M = 0, 1, 2, 3, 4, 5, 6, 9, 12, 15, 18
GEOMETRY_SIZE = 21


def _f16():
    from llvmlite import ir
    return ir.VectorType(ir.FloatType(), 16)


@intrinsic
def _keys_by_dim(typingctx, k, kb, ksj, lk, d, work, wo, lkp):
    """work[wo + t * lkp + j] = k[kb + j * ksj + t] for j < lk (0 up to lkp): a gather of 16 keys per
    dim, where the scalar copy took ~0.45 us for a 16 x 16 head."""
    from llvmlite import ir
    sig = types.void(k, types.intp, types.intp, types.intp, types.intp, work, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        ka, kb_, ksj_, lk_, d_, wa, wo_, lkp_ = args
        f16, i32, i64 = _f16(), ir.IntType(32), ir.IntType(64)
        l16 = ir.VectorType(i64, 16)
        gather = declare(builder, "llvm.masked.gather.v16f32.v16p0", f16, ir.VectorType(ir.FloatType().as_pointer(), 16),
                         i32, ir.VectorType(ir.IntType(1), 16), f16)
        kp, wp = data_of(context, builder, sig.args[0], ka, kb_), data_of(context, builder, sig.args[5], wa, wo_)
        zero = ir.Constant(f16, [0.0] * 16)
        step = builder.mul(splat(builder, ksj_, l16), ir.Constant(l16, list(range(16))))

        def block(j, _):
            lane = first_lanes(builder, builder.sub(lk_, j))
            rows = builder.add(step, splat(builder, builder.mul(j, ksj_), l16))

            def dim(t, __):
                col = builder.call(gather, [pointers(builder, builder.gep(kp, [t]), rows), ir.Constant(i32, 4), lane, zero])
                at = builder.gep(wp, [builder.add(builder.mul(t, lkp_), j)])
                builder.store(col, builder.bitcast(at, f16.as_pointer()), align=4)
                return []
            k_loop(builder, d_, [], dim)
            return []
        k_loop(builder, lk_, [], block, step=16)
        return context.get_dummy_value()
    return sig, codegen


def _in_pairs(builder, n, emit):
    """emit(j, 2) for j = 0, 32, .. while j + 32 <= n, then emit(j, 1) for a last 16 (n: a multiple of
    16): two 16-lane blocks side by side give 8 independent FMA chains for 4 rows, what a core with two
    512-bit FMA ports needs to stay busy (4 chains of latency 4 fill one port)."""
    from llvmlite import ir
    i64 = ir.IntType(64)
    pairs = builder.and_(n, ir.Constant(i64, ~31))
    k_loop(builder, pairs, [], lambda j, _: emit(j, 2) or [], step=32)
    with builder.if_then(builder.icmp_signed("<", pairs, n)):
        emit(pairs, 1)


def _in_pairs_masked(builder, n, emit):
    """As _in_pairs for any n: the last block a pair when more than 16 remain, else one block (its lanes
    masked by the caller)."""
    from llvmlite import ir
    i64 = ir.IntType(64)
    pairs = builder.and_(n, ir.Constant(i64, ~31))
    k_loop(builder, pairs, [], lambda j, _: emit(j, 2) or [], step=32)
    rest = builder.sub(n, pairs)
    with builder.if_else(builder.icmp_signed(">", rest, ir.Constant(i64, 16))) as (two, one):
        with two:
            emit(pairs, 2)
        with one:
            with builder.if_then(builder.icmp_signed(">", rest, ir.Constant(i64, 0))):
                emit(pairs, 1)


@intrinsic
def _scores(typingctx, q, qrows, kt, ko, lkp, d, lk, m, mrows, score_scale, out, oo):
    """out[oo + r * lkp + j] = score_scale * sum_t q[qrows[r] + t] kt[ko + t * lkp + j] + m[mrows[r] + j]
    for the four rows r and j < lk (32 keys a step: _in_pairs)."""
    from llvmlite import ir
    sig = types.void(q, qrows, kt, types.intp, types.intp, types.intp, types.intp, m, mrows, types.float32,
                     out, types.intp)

    def codegen(context, builder, sig, args):
        qa, qr, ka, ko_, lkp_, d_, lk_, ma, mr, sc, oa, oo_ = args
        f16, i32 = _f16(), ir.IntType(32)
        fma, mload, mstore = vector_ops(builder)
        qp, kp = data_of(context, builder, sig.args[0], qa), data_of(context, builder, sig.args[2], ka, ko_)
        mp, op = data_of(context, builder, sig.args[7], ma), data_of(context, builder, sig.args[10], oa, oo_)
        four, zero = ir.Constant(i32, 4), ir.Constant(f16, [0.0] * 16)
        qrow = [builder.extract_value(qr, r) for r in range(ROWS)]
        mrow = [builder.extract_value(mr, r) for r in range(ROWS)]
        scale = splat(builder, sc, f16)
        vec = lambda p, at: builder.bitcast(builder.gep(p, [at]), f16.as_pointer())  # noqa: E731

        def block(j, halves):
            cols = [builder.add(j, ir.Constant(j.type, 16 * h)) for h in range(halves)]

            def dims(t, accs):
                row = builder.mul(t, lkp_)
                kvs = [builder.load(vec(kp, builder.add(row, c)), align=4) for c in cols]
                new = []
                for r in range(ROWS):
                    qv = splat(builder, builder.load(builder.gep(qp, [builder.add(qrow[r], t)])), f16)
                    new += [builder.call(fma, [qv, kv, accs[r * halves + h]]) for h, kv in enumerate(kvs)]
                return new
            accs = k_loop(builder, d_, [zero] * (ROWS * halves), dims)
            for h, c in enumerate(cols):
                lane = first_lanes(builder, builder.sub(lk_, c))
                for r in range(ROWS):
                    bias = builder.call(mload, [vec(mp, builder.add(mrow[r], c)), four, lane, zero])
                    at = builder.add(builder.mul(ir.Constant(lkp_.type, r), lkp_), c)
                    builder.call(mstore, [builder.fadd(builder.fmul(accs[r * halves + h], scale), bias), vec(op, at),
                                          four, lane])
        _in_pairs(builder, lkp_, block)
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def _weighted(typingctx, p, po, lkp, lk, v, vo, vsj, d, o, orows):
    """o[orows[r] + t] = sum_j p[po + r * lkp + j] v[vo + j * vsj + t] for the four rows r and t < d
    (v's dims, 32 a step as two masked 16-lane blocks: _in_pairs_masked)."""
    from llvmlite import ir
    sig = types.void(p, types.intp, types.intp, types.intp, v, types.intp, types.intp, types.intp, o, orows)

    def codegen(context, builder, sig, args):
        pa, po_, lkp_, lk_, va, vo_, vsj_, d_, oa, orr = args
        f16, i32 = _f16(), ir.IntType(32)
        fma, mload, mstore = vector_ops(builder)
        four = ir.Constant(i32, 4)
        pp, vp = data_of(context, builder, sig.args[0], pa, po_), data_of(context, builder, sig.args[4], va, vo_)
        op = data_of(context, builder, sig.args[8], oa)
        zero = ir.Constant(f16, [0.0] * 16)
        orow = [builder.extract_value(orr, r) for r in range(ROWS)]
        prow = [builder.mul(ir.Constant(lkp_.type, r), lkp_) for r in range(ROWS)]
        vec = lambda ptr, at: builder.bitcast(builder.gep(ptr, [at]), f16.as_pointer())  # noqa: E731

        def block(t, halves):
            cols = [builder.add(t, ir.Constant(t.type, 16 * h)) for h in range(halves)]
            lanes_ = [first_lanes(builder, builder.sub(d_, c)) for c in cols]

            def keys(j, accs):
                row = builder.mul(j, vsj_)
                vvs = [builder.call(mload, [vec(vp, builder.add(row, c)), four, lane, zero])
                       for c, lane in zip(cols, lanes_)]
                new = []
                for r in range(ROWS):
                    pv = splat(builder, builder.load(builder.gep(pp, [builder.add(prow[r], j)])), f16)
                    new += [builder.call(fma, [pv, vv, accs[r * halves + h]]) for h, vv in enumerate(vvs)]
                return new
            accs = k_loop(builder, lk_, [zero] * (ROWS * halves), keys)
            for h, (c, lane) in enumerate(zip(cols, lanes_)):
                for r in range(ROWS):
                    builder.call(mstore, [accs[r * halves + h], vec(op, builder.add(orow[r], c)), four, lane])
        _in_pairs_masked(builder, d_, block)
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def _softmax4(typingctx, w, so, po, lkp, lk, scale, guard):
    """w[po + r * lkp + j] = softmax(scale * w[so + r * lkp + :lk])[j] for the four rows r, their passes
    interleaved (softmax_ir.emit_softmax); under `guard` a NaN is 0."""
    from llvmlite import ir
    sig = types.void(w, types.intp, types.intp, types.intp, types.intp, types.float32, types.boolean)

    def codegen(context, builder, sig, args):
        from ..micro.softmax_ir import emit_softmax
        wa, so_, po_, lkp_, lk_, sc, guard_ = args
        wp = data_of(context, builder, sig.args[0], wa)
        row = [builder.mul(ir.Constant(lkp_.type, r), lkp_) for r in range(ROWS)]
        emit_softmax(builder, [builder.gep(wp, [builder.add(so_, d)]) for d in row],
                     [builder.gep(wp, [builder.add(po_, d)]) for d in row], lk_, sc,
                     builder.icmp_unsigned("!=", guard_, ir.Constant(guard_.type, 0)))
        return context.get_dummy_value()
    return sig, codegen


@njit(cache=True, error_model="numpy", inline="always")
def _head(q, k, v, o, m, geo, work, wo, b, h, score_scale, scale, guard):
    """One (batch, head) of `attend`, its work buffer at wo."""
    lq, lk, d, dv = geo[_LQ], geo[_LK], geo[_D], geo[_DV]
    lkp = (lk + 15) // 16 * 16
    so, po = wo + d * lkp, wo + (d + ROWS) * lkp
    qb, kb = b * geo[_Q] + h * geo[_Q + 1], b * geo[_K] + h * geo[_K + 1]
    vb, ob = b * geo[_V] + h * geo[_V + 1], b * geo[_O] + h * geo[_O + 1]
    mb = b * geo[_M] + h * geo[_M + 1]
    qs, ms, os = geo[_Q + 2], geo[_M + 2], geo[_O + 2]
    _keys_by_dim(k, kb, geo[_K + 2], lk, d, work, wo, lkp)
    for i0 in range(0, lq, ROWS):
        last = min(i0 + ROWS, lq) - 1
        r0, r1, r2, r3 = i0, min(i0 + 1, last), min(i0 + 2, last), min(i0 + 3, last)
        _scores(q, (qb + r0 * qs, qb + r1 * qs, qb + r2 * qs, qb + r3 * qs), work, wo, lkp, d, lk, m,
                (mb + r0 * ms, mb + r1 * ms, mb + r2 * ms, mb + r3 * ms), score_scale, work, so)
        _softmax4(work, so, po, lkp, lk, scale, guard)
        _weighted(work, po, lkp, lk, v, vb, geo[_V + 2], dv, o,
                  (ob + r0 * os, ob + r1 * os, ob + r2 * os, ob + r3 * os))


def work_size(lk: int, d: int) -> int:
    """Floats of work buffer a (batch, head) needs: the keys by dim and four rows of scores and
    probabilities."""
    return (d + 2 * ROWS) * ((lk + 15) // 16 * 16)


@njit(cache=True, error_model="numpy")
def attend(q, k, v, o, m, geo, work, score_scale, scale, guard):
    """o = softmax(scale * (score_scale * q k^T + m)) v per (batch, head); a NaN probability is 0 under
    `guard` (a fully masked row). work: work_size(Lk, D) floats."""
    for b in range(geo[_B]):
        for h in range(geo[_H]):
            _head(q, k, v, o, m, geo, work, 0, b, h, score_scale, scale, guard)


@njit(parallel=True, cache=True, error_model="numpy")
def attend_heads(q, k, v, o, m, geo, work, per, score_scale, scale, guard):
    """`attend` with the (batch, head) pairs spread over the threads, each on its own `per` floats of
    work (at least work_size(Lk, D), for every thread id Numba can give)."""
    nh = geo[_H]
    for bh in prange(geo[_B] * nh):
        _head(q, k, v, o, m, geo, work, numba.get_thread_id() * per, bh // nh, bh % nh, score_scale, scale, guard)


def _flat(a: np.ndarray):
    """a's elements as a flat float32 array from a's first one, or None when a is not float32 or has a
    negative or unaligned stride."""
    if a.dtype != np.float32 or any(s < 0 or s % 4 for s in a.strides):
        return None
    extent = 1 + sum((n - 1) * (s // 4) for n, s in zip(a.shape, a.strides))
    return np.lib.stride_tricks.as_strided(a, shape=(extent,), strides=(4,))


def _strides(x: np.ndarray, shape: tuple):
    """x's element strides as broadcast to `shape` (0 on the axes it repeats), None if it cannot be."""
    if x.ndim > len(shape):
        return None
    lead = len(shape) - x.ndim
    out = [0] * lead
    for n, want, s in zip(x.shape, shape[lead:], x.strides):
        if n != want and n != 1:
            return None
        out.append(s // 4 if n == want and n != 1 else 0)
    return out


def geometry(q, kt, v, o, mask):
    """The flat arrays of q (B?, H?, Lq, D), kt (.., Lk, D), v (.., Lk, Dv), o (.., Lq, Dv) and the
    additive mask (broadcast to .., Lq, Lk), and their geometry; None when a last axis is strided, an
    operand is not float32 with aligned strides, or there are more than two batch axes."""
    lq, d = q.shape[-2:]
    lk, dv = kt.shape[-2], v.shape[-1]
    batch = o.shape[:-2]
    if len(batch) > 2 or kt.shape[-1] != d or v.shape[-2] != lk or o.shape[-2:] != (lq, dv):
        return None
    pad = (1,) * (2 - len(batch))
    geo = np.zeros(GEOMETRY_SIZE, np.int64)
    geo[:6] = pad + batch + (lq, lk, d, dv)
    bufs = []
    operands = [(_Q, q, (lq, d)), (_K, kt, (lk, d)), (_V, v, (lk, dv)), (_O, o, (lq, dv))]
    if mask is not None:
        operands.append((_M, mask, (lq, lk)))
    for at, x, tail in operands:
        flat, strides = _flat(x), _strides(x, batch + tail)
        if flat is None or strides is None or (tail[-1] > 1 and strides[-1] != 1):
            return None
        bufs.append(flat)
        strides = [0] * len(pad) + strides
        geo[at:at + 3] = strides[:3]
    if mask is None:        # a zero row every query reads
        bufs.append(np.zeros(lk + 16, np.float32))
    return bufs, geo
