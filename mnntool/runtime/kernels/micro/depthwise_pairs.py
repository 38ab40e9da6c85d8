"""k x k depthwise convolution (k = 3, 5, 7; stride 1 or 2) on maps at most 8 output pixels wide, two
output rows to a vector, as AVX-512 LLVM IR.

The strips give a 7-wide output row a vector of its own (7 of 16 lanes), and at stride 2 split every
tap row into even and odd pixels by three to seven shuffles before its FMAs: MobileNetV4's 576 channels
of 3x3 from 14x14 to 7x7 took 48 us where onnxruntime's NCHWc kernel took 13; the flat kernel (stride 1,
7x7) pays a scalar mask load for each of its masked loads. Here a vector holds output rows 2p and 2p+1
(lanes 0..ow-1 and ow..2ow-1, contiguous in the output, one masked store): each tap is the two input
rows' loads (shared by the taps of the other rows that read them) and one two-source permute
(vpermi2ps) picking every s-th pixel of each, then an FMA. Column masks are made once per channel; a
row outside the plane reads a row of zeros. The same kernel with max for FMA and -inf for taps outside is
3x3/2 max pooling (max_pool3x3_s2_pairs), also one row a vector to 16 wide (its second source the same row
16 columns on).
"""
from __future__ import annotations

import functools

import numpy as np

from ..compile.jit import intrinsic, njit, prange, types

from .activation_ir import Finish
from .llvm_ir import data_of, declare, first_lanes, lanes, splat as splat_, vector_ops

SIZES = (3, 5, 7)
MAX_WIDTH = 8       # two output rows fill at most 16 lanes
ROW_MAX_WIDTH = 16  # one row a vector (stride 2: the permute's two sources are 32 input columns)


@functools.lru_cache(maxsize=64)
def pick_index(ow: int, stride: int) -> np.ndarray:
    """The vpermi2ps index: lane i < ow takes pixel stride*i of the first row's load, lane ow + i pixel
    stride*i of the second's (16 + ...); the lanes past 2*ow are not stored."""
    if ow > MAX_WIDTH:      # one row a vector: its 32 input columns in two loads
        return np.array([stride * i if i < ow else 0 for i in range(16)], np.int32)
    idx = [stride * i for i in range(ow)] + [16 + stride * i for i in range(ow)]
    idx += [0] * (16 - len(idx))
    return np.array(idx, np.int32)


def _make_pairs(k: int, stride: int, pool: bool = False, rows: int = 2):
    """The kernel of a k x k window at `stride`; with `pool`, the window's maximum (taps outside read -inf:
    masked lanes fill with it, rows outside read `zrow`, which the caller fills with it; w, bias unused).
    rows=1 (stride 2, ow <= 16): a vector holds one output row, its permute's second source the same input
    row 16 columns on (for pooling only: in convolutions the strips' even/odd split, shared by a tap row's
    taps, is ahead: 240 channels 3x3 28 -> 14 35 us against 55)."""
    assert rows == 2 or stride == 2
    @intrinsic
    def pairs_kernel(typingctx, x, xo, H, W, t, l, oh, ow, idx, w, wo, bias, zrow, out, oo, epf, on_grid):
        """One channel: out[oo + y*ow + i] = finish(bias + sum_rj w[wo + k*r + j] *
        x[xo + (stride*y - t + r)*W + stride*i - l + j]) for y < oh, i < ow (ow <= 8), taps outside the
        H x W plane reading zero; idx is pick_index(ow, stride)."""
        from llvmlite import ir
        ip = types.intp
        sig = types.void(x, ip, ip, ip, ip, ip, ip, ip, idx, w, ip, types.float32, zrow, out, ip, epf, ip)

        def codegen(context, builder, sig, args):
            xa, xo_, H_, W_, t_, l_, oh_, ow_, ia, wa, wo_, bias_, za, oa, oo_, epfa, grid_ = args
            i32, i64, f32 = ir.IntType(32), ir.IntType(64), ir.FloatType()
            f16, v16i = ir.VectorType(f32, 16), ir.VectorType(i32, 16)
            a = sig.args
            xp = data_of(context, builder, a[0], xa, xo_)
            ipt = data_of(context, builder, a[8], ia)
            wp = data_of(context, builder, a[9], wa, wo_)
            zp = data_of(context, builder, a[12], za)
            op = data_of(context, builder, a[13], oa, oo_)
            const = lambda v: ir.Constant(i64, v)   # noqa: E731
            fma, mload, mstore = vector_ops(builder)
            perm = declare(builder, "llvm.x86.avx512.vpermi2var.ps.512", f16, f16, v16i, f16)
            fzero = ir.Constant(f16, [float("-inf") if pool else 0.0] * 16)      # what a tap outside reads
            index = builder.load(builder.bitcast(ipt, v16i.as_pointer()), align=4)
            wv = None if pool else \
                [splat_(builder, builder.load(builder.gep(wp, [const(q)])), f16) for q in range(k * k)]
            bv = splat_(builder, bias_, f16)
            vmax = lambda a, b: builder.select(builder.fcmp_ordered(">", a, b), a, b)  # noqa: E731
            finish = Finish(builder, epfa, builder.icmp_signed("!=", grid_, const(0)))
            starts = [builder.sub(const(j), l_) for j in range(k)]
            masks = [lanes(builder, builder.neg(st), builder.sub(W_, st)) for st in starts]
            if rows == 1:
                on16 = [builder.add(st, const(16)) for st in starts]
                masks16 = [lanes(builder, builder.neg(st), builder.sub(W_, st)) for st in on16]
            two_ow = builder.mul(ow_, const(rows))
            npairs = builder.sdiv(builder.add(oh_, const(rows - 1)), const(rows))

            entry = builder.block
            head, done = builder.append_basic_block("pair"), builder.append_basic_block("pairs_done")
            builder.cbranch(builder.icmp_signed(">", npairs, const(0)), head, done)
            builder.position_at_end(head)
            p = builder.phi(i64)
            p.add_incoming(const(0), entry)
            top = builder.sub(builder.mul(p, const(rows * stride)), t_)
            loaded = {}

            def tap_load(q, j, h=0):
                """Input row top + q at tap column j, or 16 columns on (h=1) (masked to the row; zeros past
                the plane)."""
                if (q, j, h) not in loaded:
                    iy = builder.add(top, const(q))
                    inside = builder.and_(builder.icmp_signed(">=", iy, const(0)), builder.icmp_signed("<", iy, H_))
                    row = builder.select(inside, builder.gep(xp, [builder.mul(iy, W_)]), zp)
                    st = builder.add(starts[j], const(16)) if h else starts[j]
                    ptr = builder.bitcast(builder.gep(row, [st]), f16.as_pointer())
                    mask = (masks16 if h else masks)[j]
                    loaded[(q, j, h)] = builder.call(mload, [ptr, ir.Constant(i32, 4), mask, fzero])
                return loaded[(q, j, h)]

            # a chain per tap column, summed as a tree: one pair is too little work for the out-of-order
            # window to overlap the next pair's chains with this one's
            accs = [None if pool else bv] + [None if pool else fzero] * (k - 1)
            for r in range(k):
                for j in range(k):
                    second = tap_load(r, j, 1) if rows == 1 else tap_load(r + stride, j)
                    v = builder.call(perm, [tap_load(r, j), index, second])
                    if pool:
                        accs[j] = v if accs[j] is None else vmax(accs[j], v)
                    else:
                        accs[j] = builder.call(fma, [v, wv[k * r + j], accs[j]])
            join = (lambda a, b: vmax(a, b)) if pool else builder.fadd
            while len(accs) > 1:
                accs = [join(accs[i], accs[i + 1]) if i + 1 < len(accs) else accs[i]
                        for i in range(0, len(accs), 2)]
            fin = finish(accs[0])
            at = builder.mul(builder.mul(p, const(rows)), ow_)
            left = builder.sub(builder.mul(oh_, ow_), at)
            keep = first_lanes(builder, builder.select(builder.icmp_signed("<", left, two_ow), left, two_ow))
            builder.call(mstore, [fin, builder.bitcast(builder.gep(op, [at]), f16.as_pointer()), ir.Constant(i32, 4),
                                  keep])
            nxt = builder.add(p, const(1))
            p.add_incoming(nxt, builder.block)
            builder.cbranch(builder.icmp_signed("<", nxt, npairs), head, done)
            builder.position_at_end(done)
            return context.get_dummy_value()
        return sig, codegen
    return pairs_kernel


_p1k3, _p2k3 = _make_pairs(3, 1), _make_pairs(3, 2)
_p1k5, _p2k5 = _make_pairs(5, 1), _make_pairs(5, 2)
_p1k7, _p2k7 = _make_pairs(7, 1), _make_pairs(7, 2)
_pool3s2 = _make_pairs(3, 2, pool=True)
_pool3s2_row = _make_pairs(3, 2, pool=True, rows=1)


@njit(cache=True, inline="always")
def _pairs(k, s, x, xo, H, W, t, l, oh, ow, idx, w, wo, bias, zrow, out, oo, epf, grid):
    if k == 3:
        if s == 1:
            _p1k3(x, xo, H, W, t, l, oh, ow, idx, w, wo, bias, zrow, out, oo, epf, grid)
        else:
            _p2k3(x, xo, H, W, t, l, oh, ow, idx, w, wo, bias, zrow, out, oo, epf, grid)
    elif k == 5:
        if s == 1:
            _p1k5(x, xo, H, W, t, l, oh, ow, idx, w, wo, bias, zrow, out, oo, epf, grid)
        else:
            _p2k5(x, xo, H, W, t, l, oh, ow, idx, w, wo, bias, zrow, out, oo, epf, grid)
    elif s == 1:
        _p1k7(x, xo, H, W, t, l, oh, ow, idx, w, wo, bias, zrow, out, oo, epf, grid)
    else:
        _p2k7(x, xo, H, W, t, l, oh, ow, idx, w, wo, bias, zrow, out, oo, epf, grid)


@njit(parallel=True, cache=True)
def depthwise_pairs(x, w, b, k, s, t, l, idx, epf, grid, zrow, out):
    """x (C, H, W) -> out (C, oh, ow) with ow <= MAX_WIDTH; w (C, k*k), k in SIZES, stride s (1 or 2),
    undilated; padding t (top) and l (left), any bottom/right; idx = pick_index(ow, s); zrow: W zeros.
    w is the layer's own layout, not kernels.aligned_lanes' (depthwise_lanes): a channel a call, each tap one
    broadcast scalar over a vector of pixels, so nothing to pack."""
    C, H, W = x.shape
    oh, ow = out.shape[1], out.shape[2]
    xf, of = x.reshape(-1), out.reshape(-1)
    for c in prange(C):
        _pairs(k, s, xf, c * H * W, H, W, t, l, oh, ow, idx, w, c * k * k, b[c], zrow, of, c * oh * ow, epf, grid)


@njit(parallel=True, cache=True)
def max_pool3x3_s2_pairs(x, t, l, idx, epf, fill, out):
    """3x3 stride-2 max pooling of x (C, H, W) into out (C, oh, ow), ow <= ROW_MAX_WIDTH (two rows a vector to
    MAX_WIDTH, then one), padding t/l (and any past the bottom/right edge, as in ceil mode) read as -inf;
    idx = pick_index(ow, 2), fill: W values of -inf, epf: identity bounds. The row kernel
    (depthwise3x3.max_pool3x3_s2) gives a 7-wide row a whole vector and three shuffles a tap row (768
    channels 14 -> 7: 101 us against onnxruntime's 45)."""
    C, H, W = x.shape
    oh, ow = out.shape[1], out.shape[2]
    xf, of = x.reshape(-1), out.reshape(-1)
    for c in prange(C):
        if ow <= MAX_WIDTH:
            _pool3s2(xf, c * H * W, H, W, t, l, oh, ow, idx, fill, 0, np.float32(0), fill, of, c * oh * ow, epf, 0)
        else:
            _pool3s2_row(xf, c * H * W, H, W, t, l, oh, ow, idx, fill, 0, np.float32(0), fill, of, c * oh * ow, epf, 0)
