"""3x3 depthwise convolution (stride 1 or 2) and 3x3 stride-2 max pooling as AVX-512 LLVM IR.

Numba leaves a short row (7 or 14 pixels) to its scalar remainder loop and does not vectorize the
stride-2 reads, and a padded copy of the input costs a pass of its own. Here one call makes 16 output
pixels of a row: per tap row three masked loads (lanes outside the input row or the image read as
zero, so there is no padded copy), and for stride 2 two loads per row split into even and odd pixels
by shuffles; nine FMAs, then bias, activation and the int8 grid before a masked store. Small stride-1
maps run flat (16 pixels across rows per step, per-lane tap masks from a table); max pooling is the
row kernel with max for FMA and -inf for the taps outside.
"""
from __future__ import annotations

import functools

import numpy as np
from ..compile.jit import njit, prange, types, intrinsic

from .activation_ir import Finish
from .llvm_ir import data_of, vector_ops, first_lanes, host_has, lane_bits, lanes, splat as splat_

HAS_AVX512 = host_has("avx512f")
# Strips (16 columns down a block of rows, set up once) beat one call per row 1.1-2x on maps up to 56
# wide; on wider maps read cold from L3 the row walk's sequential reads win (112x112: 0.20 vs 0.35 ms)
ROWS_FROM_WIDTH = 64


def _make_row(stride: int, pool: bool = False):
    @intrinsic
    def row_kernel(typingctx, x, r0, r1, r2, valid, W, base0, ow, w, wo, bias, out, oo, epf, on_grid):
        """out[oo + p] for p < ow = finish(bias + sum_rj w[wo + 3r + j] * x[r_r + stride*p + base0 + j]),
        where a tap outside [0, W) of its row, or on a row whose bit in `valid` is 0, reads as zero. 16
        pixels per step; steps with every tap inside the image take plain loads. With `pool`, the 3x3
        max pooling of the same taps instead (outside taps read as -inf; w and bias unused)."""
        from llvmlite import ir
        sig = types.void(x, types.intp, types.intp, types.intp, types.intp, types.intp, types.intp, types.intp,
                         w, types.intp, types.float32, out, types.intp, epf, types.intp)

        def codegen(context, builder, sig, args):
            xa, r0_, r1_, r2_, va_, W_, base0_, ow_, wa, wo_, bias_, oa, oo_, epfa, grid_ = args
            i1, i32, i64, f32 = ir.IntType(1), ir.IntType(32), ir.IntType(64), ir.FloatType()
            f16, m16 = ir.VectorType(f32, 16), ir.VectorType(i1, 16)
            a = sig.args
            xp = data_of(context, builder, a[0], xa)
            wp = data_of(context, builder, a[8], wa, wo_)
            op = data_of(context, builder, a[11], oa, oo_)
            const = lambda v: ir.Constant(i64, v)   # noqa: E731
            splat = lambda value, vt: splat_(builder, value, vt)  # noqa: E731
            fma, mload, mstore = vector_ops(builder)
            fzero, none = ir.Constant(f16, [0.0] * 16), ir.Constant(m16, [0] * 16)
            fill = ir.Constant(f16, [float("-inf")] * 16) if pool else fzero    # what a tap outside reads
            vmax = lambda a, b: builder.select(builder.fcmp_ordered(">", a, b), a, b)  # noqa: E731

            def in_row(start):
                """Lanes whose index start + lane lies in [0, W)."""
                return lanes(builder, builder.neg(start), builder.sub(W_, start))

            # loop invariants: the rows, the nine weights, the epilogue's bounds (all in registers)
            rows = [builder.gep(xp, [r]) for r in (r0_, r1_, r2_)]
            oks = [builder.icmp_signed("!=", builder.and_(va_, const(1 << r)), const(0)) for r in range(3)]
            all_rows = builder.and_(builder.and_(oks[0], oks[1]), oks[2])
            wv = None if pool else [splat(builder.load(builder.gep(wp, [const(k)])), f16) for k in range(9)]
            bv = splat(bias_, f16)
            finish = Finish(builder, epfa, builder.icmp_signed("!=", grid_, const(0)))
            if stride == 2:
                evens = ir.Constant(ir.VectorType(i32, 16), list(range(0, 32, 2)))
                odds = ir.Constant(ir.VectorType(i32, 16), list(range(1, 32, 2)))
                shift = ir.Constant(ir.VectorType(i32, 16), list(range(1, 17)))
                first = ir.Constant(m16, [1] + [0] * 15)

            def sums(base, masked):
                """The 16 sums of the step at input column `base`."""
                def load(row, start, mask):
                    ptr = builder.bitcast(builder.gep(row, [start]), f16.as_pointer())
                    if mask is None:
                        return builder.load(ptr, align=4)
                    return builder.call(mload, [ptr, ir.Constant(i32, 4), mask, fill])
                if not masked:
                    masks = [None] * 3
                elif stride == 1:       # tap j is a load at base + j
                    masks = [in_row(builder.add(base, const(j))) for j in range(3)]
                else:   # 32 inputs from base (two loads) give the even (tap 0) and odd (tap 1) pixels;
                    # tap 2 is the even ones a lane on, with input base + 32 last
                    masks = [in_row(builder.add(base, const(16 * v))) for v in range(2)]
                    masks.append(builder.and_(in_row(builder.add(base, const(32))), first))
                accs = [bv, fzero, fzero]      # a sum per tap row: three short FMA chains
                for r in range(3):
                    take = [builder.select(oks[r], m, none) for m in masks] if masked else masks
                    if stride == 1:
                        taps = [load(rows[r], builder.add(base, const(j)), take[j]) for j in range(3)]
                    else:
                        v = [load(rows[r], builder.add(base, const(16 * k)), take[k]) for k in range(2)]
                        if masked:
                            last = load(rows[r], builder.add(base, const(32)), take[2])
                        else:
                            last = builder.insert_element(
                                fill, builder.load(builder.gep(rows[r], [builder.add(base, const(32))])),
                                ir.Constant(i32, 0))
                        e = builder.shuffle_vector(v[0], v[1], evens)
                        taps = [e, builder.shuffle_vector(v[0], v[1], odds), builder.shuffle_vector(e, last, shift)]
                    for j in range(3):
                        if pool:
                            accs[r] = taps[j] if j == 0 else vmax(accs[r], taps[j])
                        else:
                            accs[r] = builder.call(fma, [taps[j], wv[3 * r + j], accs[r]])
                if pool:
                    return vmax(vmax(accs[0], accs[1]), accs[2])
                return builder.fadd(builder.fadd(accs[0], accs[1]), accs[2])

            entry = builder.block
            head = builder.append_basic_block("step")
            inner_b, edge_b = builder.append_basic_block("inner"), builder.append_basic_block("edge")
            tail, done = builder.append_basic_block("store"), builder.append_basic_block("done")
            builder.branch(head)
            builder.position_at_end(head)
            x0 = builder.phi(i64)
            x0.add_incoming(const(0), entry)
            base = builder.add(builder.mul(x0, const(stride)), base0_)
            # every tap of the 16 lanes inside the image: base >= 0, base + 16*stride + 3 - stride <= W
            inside = builder.and_(builder.icmp_signed(">=", base, const(0)),
                                  builder.icmp_signed("<=", builder.add(base, const(15 * stride + 3)), W_))
            builder.cbranch(builder.and_(all_rows, inside), inner_b, edge_b)
            builder.position_at_end(inner_b)
            s_inner = sums(base, False)
            builder.branch(tail)
            builder.position_at_end(edge_b)
            s_edge = sums(base, True)
            builder.branch(tail)
            builder.position_at_end(tail)
            acc = builder.phi(f16)
            acc.add_incoming(s_inner, inner_b)
            acc.add_incoming(s_edge, edge_b)
            fin = finish(acc)
            dst = builder.bitcast(builder.gep(op, [x0]), f16.as_pointer())
            builder.call(mstore, [fin, dst, ir.Constant(i32, 4), first_lanes(builder, builder.sub(ow_, x0))])
            nxt = builder.add(x0, const(16))
            x0.add_incoming(nxt, builder.block)
            builder.cbranch(builder.icmp_signed("<", nxt, ow_), head, done)
            builder.position_at_end(done)
            return context.get_dummy_value()
        return sig, codegen
    return row_kernel


_row1, _row2 = _make_row(1), _make_row(2)
_pool2 = _make_row(2, pool=True)


@njit(parallel=True, cache=True)
def max_pool3x3_s2(x, t, l, epf, out):
    """3x3 stride-2 max pooling of x (C, H, W) into out (C, oh, ow), padding t/l (and any past the
    bottom/right edge, as in ceil mode) read as -inf: the depthwise row kernel with max for FMA (Numba
    had left 56-wide rows to its scalar remainder). epf: identity bounds."""
    C, H, W = x.shape
    oh, ow = out.shape[1], out.shape[2]
    xf = x.reshape(-1)
    dummy = np.zeros(9, np.float32)
    for c in prange(C):
        of = out[c].reshape(-1)
        for y in range(oh):
            iy = 2 * y - t
            valid = (1 if 0 <= iy < H else 0) | (2 if 0 <= iy + 1 < H else 0) | (4 if 0 <= iy + 2 < H else 0)
            at = (c * H + iy) * W
            _pool2(xf, at, at + W, at + 2 * W, valid, W, -l, ow, dummy, 0, np.float32(0), of, y * ow, epf, 0)


@njit(parallel=True, cache=True)
def depthwise3x3(x, w, b, s, t, l, epf, grid, out):
    """x (C, H, W) -> out (C, oh, ow); w (C, 9); padding t (top) and l (left), any bottom/right."""
    C, H, W = x.shape
    oh, ow = out.shape[1], out.shape[2]
    xf = x.reshape(-1)
    for c in prange(C):
        of = out[c].reshape(-1)
        for y in range(oh):
            iy = y * s - t
            valid = (1 if 0 <= iy < H else 0) | (2 if 0 <= iy + 1 < H else 0) | (4 if 0 <= iy + 2 < H else 0)
            r0 = (c * H + iy) * W
            if s == 1:
                _row1(xf, r0, r0 + W, r0 + 2 * W, valid, W, -l, ow, w, c * 9, b[c], of, y * ow, epf, grid)
            else:
                _row2(xf, r0, r0 + W, r0 + 2 * W, valid, W, -l, ow, w, c * 9, b[c], of, y * ow, epf, grid)


# 16-pixel steps one call makes: each tap's weight broadcast and offset loaded once for all of them, the
# steps' sums in chains of their own (a step a call: 104 us for 1152 channels of 5x5 on 7x7, with SiLU)
FLAT_STEPS = 4


def _make_flat(k: int):
    """The flat block of k x k taps, its lanes' masks from the table (`flat_masks`)."""
    @intrinsic
    def flat_block(typingctx, x, xo, masks, mo, offs, left, w, wo, bias, out, oo, epf, on_grid):
        """out[oo + i] for i < min(left, 16 * FLAT_STEPS) = finish(bias + sum_q w[wo + q] * x[xo + offs[q] + i])
        over the k*k taps q, where lane i of step s (pixel 16s + i) of tap q reads only when bit i of
        masks[mo + s*k*k + q] is set (else zero)."""
        from llvmlite import ir
        sig = types.void(x, types.intp, masks, types.intp, offs, types.intp, w, types.intp, types.float32, out,
                         types.intp, epf, types.intp)

        def codegen(context, builder, sig, args):
            xa, xo_, ma, mo_, oa_, left_, wa, wo_, bias_, outa, oo_, epfa, grid_ = args
            i32, i64, f32 = ir.IntType(32), ir.IntType(64), ir.FloatType()
            f16 = ir.VectorType(f32, 16)
            a = sig.args
            xp = data_of(context, builder, a[0], xa, xo_)
            mp = data_of(context, builder, a[2], ma, mo_)
            op_ = data_of(context, builder, a[4], oa_)
            wp = data_of(context, builder, a[6], wa, wo_)
            outp = data_of(context, builder, a[9], outa, oo_)
            fma, mload, mstore = vector_ops(builder)
            const = lambda v: ir.Constant(i64, v)   # noqa: E731
            fzero = ir.Constant(f16, [0.0] * 16)
            S, kk = FLAT_STEPS, k * k
            # two chains a step (even and odd taps), 2S sums in flight
            accs = [[splat_(builder, bias_, f16), fzero] for _ in range(S)]
            for q in range(kk):
                wv = splat_(builder, builder.load(builder.gep(wp, [const(q)])), f16)
                at = builder.gep(xp, [builder.load(builder.gep(op_, [const(q)]))])
                for st in range(S):
                    mask = lane_bits(builder, builder.load(builder.gep(mp, [const(st * kk + q)])))
                    ptr = builder.bitcast(builder.gep(at, [const(16 * st)]), f16.as_pointer())
                    v = builder.call(mload, [ptr, ir.Constant(i32, 4), mask, fzero])
                    accs[st][q % 2] = builder.call(fma, [v, wv, accs[st][q % 2]])
            sums = [builder.fadd(a0, a1) for a0, a1 in accs]
            done = Finish(builder, epfa, builder.icmp_signed("!=", grid_, const(0))).many(sums)
            for st in range(S):
                keep = first_lanes(builder, builder.sub(left_, const(16 * st)))
                dst = builder.bitcast(builder.gep(outp, [const(16 * st)]), f16.as_pointer())
                builder.call(mstore, [done[st], dst, ir.Constant(i32, 4), keep])
            return context.get_dummy_value()
        return sig, codegen
    return flat_block


_flat3, _flat5, _flat7 = _make_flat(3), _make_flat(5), _make_flat(7)


@njit(cache=True, inline="always")
def _flat_block(k, x, xo, masks, mo, offs, left, w, wo, bias, out, oo, epf, grid):
    """The flat block of the k x k window."""
    if k == 3:
        _flat3(x, xo, masks, mo, offs, left, w, wo, bias, out, oo, epf, grid)
    elif k == 5:
        _flat5(x, xo, masks, mo, offs, left, w, wo, bias, out, oo, epf, grid)
    else:
        _flat7(x, xo, masks, mo, offs, left, w, wo, bias, out, oo, epf, grid)


FLAT_SIZES = (3, 5, 7)


@functools.lru_cache(maxsize=256)     # the plans of every input shape ask again for the same small maps
def flat_masks(H: int, W: int, t: int, l: int, k: int = 3):
    """For the flat kernel (stride 1, output H x W, a k x k window): per 16-pixel step (their count rounded
    up to FLAT_STEPS; the steps past the map read nothing) and tap (i, j), the lanes whose input
    (y + i - t, x + j - l) lies inside the image, as bits; and each tap's flat offset."""
    import numpy as np
    n = H * W
    steps = -(-n // (16 * FLAT_STEPS)) * FLAT_STEPS
    p = np.arange(steps * 16).reshape(steps, 16)
    y, x = p // W, p % W
    masks = np.zeros((steps, k * k), np.int64)
    for i in range(k):
        for j in range(k):
            yy, xx = y + i - t, x + j - l
            ok = (p < n) & (yy >= 0) & (yy < H) & (xx >= 0) & (xx < W)
            masks[:, k * i + j] = (ok * (1 << np.arange(16))).sum(axis=1)
    offs = np.array([(i - t) * W + (j - l) for i in range(k) for j in range(k)], np.int64)
    return masks.reshape(-1), offs      # shared by plans (cached above): kernels only read them


@njit(parallel=True, cache=True)
def depthwise_flat(x, w, b, k, masks, offs, epf, grid, out):
    """Stride 1 with the output the input's size, a k x k window (k in FLAT_SIZES): a channel is one flat
    run of H*W pixels in blocks of FLAT_STEPS 16-pixel steps, so a 7x7 map is one block of 4 steps, not
    7 rows of 7 (masks and offs from `flat_masks`)."""
    C, H, W = x.shape
    n = H * W
    span = 16 * FLAT_STEPS
    blocks = (n + span - 1) // span
    kk = k * k
    xf, of = x.reshape(-1), out.reshape(-1)
    for c in prange(C):
        for j in range(blocks):
            at = c * n + span * j
            _flat_block(k, xf, at, masks, kk * FLAT_STEPS * j, offs, n - span * j, w, c * kk, b[c], of, at,
                        epf, grid)
