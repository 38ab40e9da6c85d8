"""k x k depthwise convolution (k = 3, 5, 7; stride 1, dilated or not, or stride 2) and the bands 1 x k and k x 1
(k = 3, 5, 7, 11; stride 1) in strips of 16 output columns down a block of rows, as AVX-512 LLVM IR.

EfficientNet, MobileNetV3 and MixNet have 5x5 depthwise layers and ConvNeXt 7x7; the Numba loops
ran them at 4-12 GFLOP/s (a padded copy, rows of 7 or 14 left scalar), a quarter of the 3x3 kernels.
One strip sets up its column masks (lanes outside the row read as zero: no padded copy) and the
epilogue once, then per output row and tap row loads k shifted vectors (stride 2: loads of 16 split
into even and odd pixels by shuffles) and chains k FMAs, so a 5x5 output row costs 25 FMAs for 16
pixels whatever the map's width.

At stride 1 (undilated) the rows go BLOCK_ROWS at a time, their activations finished under one branch
on the fused kind: row by row, each output vector went through the epilogue's switch, whose spills
around it cost more than the FMAs (1.3 cycles an FMA on one channel in L1, 0.85 in blocks; MobileNetV3's
120-channel 5x5 on 28x28: 100 -> 66 us, 960 channels of 7x7 107 -> 78 us, 480 3x3 of 14x14 51 -> 41 us).
"""
from __future__ import annotations

from ..compile.jit import njit, prange, types, intrinsic

from .activation_ir import Finish
from .llvm_ir import data_of, first_lanes, lanes, prefetch, splat as splat_, vector_ops

SIZES = (3, 5, 7)
# band windows (kh, kw), stride 1: GhostNetV2's attention (1x5 then 5x1 on a half-size map) and InceptionNeXt's
# 1x11 / 11x1 ran in the Numba loops at 3-5 GFLOP/s (a padded copy, or channels-last on maps to 16 wide)
BANDS = tuple((1, k) for k in (3, 5, 7, 11)) + tuple((k, 1) for k in (3, 5, 7, 11))
# taps whose weights stay in zmm registers across a strip; past that each FMA broadcasts its weight
# from memory (49 of them would spill)
HOISTED_TAPS = 9
BLOCK_ROWS = 4      # output rows a step at stride 1, undilated


def _make_strip(stride: int, k: int, kw: int | None = None):
    """The strip kernel of a k x k window, or of k x kw (kh = k) at stride 1."""
    kh, kw = k, k if kw is None else kw
    assert stride == 1 or kh == kw

    @intrinsic
    def strip_kernel(typingctx, x, xo, H, W, t, l, d, x0, lanes_, y0, y1, ow, w, wo, bias, zrow, out, oo, epf,
                     on_grid):
        """Output columns x0 .. x0+15 (the first `lanes_`) of rows y0..y1-1 of one channel: out[oo + y*ow + x0 + i]
        = finish(bias + sum_rj w[wo + kw*r + j] * x[xo + (y*stride - t + r*d)*W + (x0 + i)*stride - l + j*d]),
        taps outside the H x W plane reading zero (d is 1 when stride is 2); a row outside the plane
        reads `zrow` (W zeros)."""
        from llvmlite import ir
        ip = types.intp
        sig = types.void(x, ip, ip, ip, ip, ip, ip, ip, ip, ip, ip, ip, w, ip, types.float32, zrow, out, ip, epf, ip)

        def codegen(context, builder, sig, args):
            xa, xo_, H_, W_, t_, l_, d_, x0_, nl_, y0_, y1_, ow_, wa, wo_, bias_, za, oa, oo_, epfa, grid_ = args
            i32, i64, f32 = ir.IntType(32), ir.IntType(64), ir.FloatType()
            f16 = ir.VectorType(f32, 16)
            a = sig.args
            xp = data_of(context, builder, a[0], xa, xo_)
            wp = data_of(context, builder, a[12], wa, wo_)
            zp = data_of(context, builder, a[15], za)
            op = data_of(context, builder, a[16], oa, builder.add(oo_, x0_))
            const = lambda v: ir.Constant(i64, v)   # noqa: E731
            fma, mload, mstore = vector_ops(builder)
            fzero = ir.Constant(f16, [0.0] * 16)

            def weight(tap):
                return splat_(builder, builder.load(builder.gep(wp, [const(tap)])), f16)
            hoisted = [weight(tap) for tap in range(kh * kw)] if kh * kw <= HOISTED_TAPS else None
            bv = splat_(builder, bias_, f16)
            finish = Finish(builder, epfa, builder.icmp_signed("!=", grid_, const(0)))
            base = builder.sub(builder.mul(x0_, const(stride)), l_)      # input column of lane 0, tap 0
            in_row = lambda start: lanes(builder, builder.neg(start), builder.sub(W_, start))  # noqa: E731
            if stride == 1:     # tap j is a load at base + j*d
                starts = [builder.add(base, builder.mul(const(j), d_)) for j in range(kw)]
                masks = [in_row(st) for st in starts]
            else:   # 16 pixels read inputs base .. base + 30 + k - 1: three loads of 16
                starts = [builder.add(base, const(16 * v)) for v in range(3)]
                masks = [in_row(starts[0]), in_row(starts[1]),
                         builder.and_(in_row(starts[2]), first_lanes(builder, const(k - 2)))]
                pick = lambda idx: ir.Constant(ir.VectorType(i32, 16), idx)  # noqa: E731
                evens, odds = pick(list(range(0, 32, 2))), pick(list(range(1, 32, 2)))
                # tap 2m (2m+1) of lane i is the even (odd) input i + m: lanes past 15 come from the
                # second pair's evens (odds), whose lane q is input 16 + 2q (+1)
                shifts = [pick([i + m if i + m < 16 else 16 + i + m - 8 for i in range(16)]) for m in range(k // 2 + 1)]
            keep = first_lanes(builder, nl_)

            def input_row(iy):
                inside = builder.and_(builder.icmp_signed(">=", iy, const(0)), builder.icmp_signed("<", iy, H_))
                return builder.select(inside, builder.gep(xp, [builder.mul(iy, W_)]), zp)

            def load(row, j):
                return builder.call(mload, [builder.bitcast(builder.gep(row, [starts[j]]), f16.as_pointer()),
                                            ir.Constant(i32, 4), masks[j], fzero])

            def row_sum(yv):
                """The sum (bias included) for output row yv, tap row by tap row."""
                top = builder.sub(builder.mul(yv, const(stride)), t_)
                accs = []
                for r in range(kh):
                    iy = builder.add(top, builder.mul(const(r), d_)) if stride == 1 else builder.add(top, const(r))
                    row = input_row(iy)
                    v = [load(row, j) for j in range(len(starts))]
                    if stride == 2:
                        pairs = [(builder.shuffle_vector(v[0], v[1], evens),
                                  builder.shuffle_vector(v[0], v[1], odds))]
                        if k > 2:
                            pairs.append((builder.shuffle_vector(v[1], v[2], evens),
                                          builder.shuffle_vector(v[1], v[2], odds)))
                        taps = []
                        for j in range(k):
                            m, odd = j // 2, j % 2
                            first = pairs[0][odd]
                            taps.append(first if m == 0 else builder.shuffle_vector(first, pairs[1][odd], shifts[m]))
                        v = taps
                    # a one-row window (1 x kw) in two chains, as the blocks do
                    chains = [bv if r == 0 else fzero] + ([fzero] if kh == 1 else [])
                    for j in range(kw):
                        wv = hoisted[kw * r + j] if hoisted else weight(kw * r + j)
                        c = j % len(chains)
                        chains[c] = builder.call(fma, [v[j], wv, chains[c]])
                    accs.extend(chains)
                while len(accs) > 1:        # a tree of adds over the tap rows' chains
                    accs = [builder.fadd(accs[i], accs[i + 1]) if i + 1 < len(accs) else accs[i]
                            for i in range(0, len(accs), 2)]
                return accs[0]

            entry = builder.block
            y_first = y0_
            if stride == 1:
                # BLOCK_ROWS output rows at a time (undilated): each column shift's R + k - 1 input
                # vectors loaded once for k taps of every row, each weight broadcast once for all of them
                # (0.65 loads an FMA at k = 5, against 2 row by row); two sums a row (even and odd tap
                # rows), interleaved, so 2R chains are in flight; the activations finished under one
                # branch. (Stride 2 in blocks of row_sum: slower, 72 -> 85 us for 672 channels 5x5 on
                # 14x14, its shuffles spilled.)
                R = BLOCK_ROWS
                blk, blk_done = builder.append_basic_block("rows4"), builder.append_basic_block("rows4_done")
                fits = lambda yy: builder.icmp_signed("<=", builder.add(yy, const(R)), y1_)  # noqa: E731
                builder.cbranch(builder.and_(builder.icmp_signed("==", d_, const(1)), fits(y0_)), blk, blk_done)
                builder.position_at_end(blk)
                yb = builder.phi(i64)
                yb.add_incoming(y0_, entry)
                top = builder.sub(yb, t_)
                rows_in = [input_row(builder.add(top, const(q))) for q in range(R + kh - 1)]
                # the next block's new input rows, from L2 or L3: 144 channels 3x3 on 56x56 (3.6 MB in and
                # out) 282 -> 165 us (the same ahead of each row at stride 2 gained nothing)
                for q in range(R):
                    prefetch(builder, builder.gep(input_row(builder.add(top, const(R + kh - 1 + q))), [starts[0]]))
                racc = [[bv, fzero] for _ in range(R)]
                for j in range(kw):
                    xs = [load(row, j) for row in rows_in]
                    for i in range(kh):
                        wv = hoisted[kw * i + j] if hoisted else weight(kw * i + j)
                        c = (i if kh > 1 else j) % 2        # a one-row window alternates by column
                        for r in range(R):
                            racc[r][c] = builder.call(fma, [xs[r + i], wv, racc[r][c]])
                sums = [builder.fadd(a0, a1) for a0, a1 in racc]
                done_rows = finish.many(sums)
                for r in range(R):
                    dst = builder.bitcast(builder.gep(op, [builder.mul(builder.add(yb, const(r)), ow_)]),
                                          f16.as_pointer())
                    builder.call(mstore, [done_rows[r], dst, ir.Constant(i32, 4), keep])
                # the last block ends at y1, redoing rows of the one before (the same values): 7 rows
                # are two blocks, not one and three rows alone
                last = builder.sub(y1_, const(R))
                ynext = builder.add(yb, const(R))
                yb.add_incoming(builder.select(builder.icmp_signed("<", ynext, last), ynext, last), builder.block)
                blk_end = builder.block
                builder.cbranch(builder.icmp_signed("<", ynext, y1_), blk, blk_done)
                builder.position_at_end(blk_done)
                y_first = builder.phi(i64)
                y_first.add_incoming(y0_, entry)
                y_first.add_incoming(y1_, blk_end)
                entry = builder.block
            head, done = builder.append_basic_block("row"), builder.append_basic_block("rows_done")
            builder.cbranch(builder.icmp_signed("<", y_first, y1_), head, done)
            builder.position_at_end(head)
            y = builder.phi(i64)
            y.add_incoming(y_first, entry)
            fin = finish(row_sum(y))
            dst = builder.bitcast(builder.gep(op, [builder.mul(y, ow_)]), f16.as_pointer())
            builder.call(mstore, [fin, dst, ir.Constant(i32, 4), keep])
            nxt = builder.add(y, const(1))
            y.add_incoming(nxt, builder.block)
            builder.cbranch(builder.icmp_signed("<", nxt, y1_), head, done)
            builder.position_at_end(done)
            return context.get_dummy_value()
        return sig, codegen
    return strip_kernel


_s1k3, _s2k3 = _make_strip(1, 3), _make_strip(2, 3)
_s1k5, _s2k5 = _make_strip(1, 5), _make_strip(2, 5)
_s1k7, _s2k7 = _make_strip(1, 7), _make_strip(2, 7)
_b1x3, _b1x5, _b1x7, _b1x11 = _make_strip(1, 1, 3), _make_strip(1, 1, 5), _make_strip(1, 1, 7), _make_strip(1, 1, 11)
_b3x1, _b5x1, _b7x1, _b11x1 = _make_strip(1, 3, 1), _make_strip(1, 5, 1), _make_strip(1, 7, 1), _make_strip(1, 11, 1)


@njit(cache=True, inline="always")
def _band(kh, kw, x, xo, H, W, t, l, d, x0, nl, y0, y1, ow, w, wo, bias, zrow, out, oo, epf, grid):
    if kh == 1:
        if kw == 3:
            _b1x3(x, xo, H, W, t, l, d, x0, nl, y0, y1, ow, w, wo, bias, zrow, out, oo, epf, grid)
        elif kw == 5:
            _b1x5(x, xo, H, W, t, l, d, x0, nl, y0, y1, ow, w, wo, bias, zrow, out, oo, epf, grid)
        elif kw == 7:
            _b1x7(x, xo, H, W, t, l, d, x0, nl, y0, y1, ow, w, wo, bias, zrow, out, oo, epf, grid)
        else:
            _b1x11(x, xo, H, W, t, l, d, x0, nl, y0, y1, ow, w, wo, bias, zrow, out, oo, epf, grid)
    elif kh == 3:
        _b3x1(x, xo, H, W, t, l, d, x0, nl, y0, y1, ow, w, wo, bias, zrow, out, oo, epf, grid)
    elif kh == 5:
        _b5x1(x, xo, H, W, t, l, d, x0, nl, y0, y1, ow, w, wo, bias, zrow, out, oo, epf, grid)
    elif kh == 7:
        _b7x1(x, xo, H, W, t, l, d, x0, nl, y0, y1, ow, w, wo, bias, zrow, out, oo, epf, grid)
    else:
        _b11x1(x, xo, H, W, t, l, d, x0, nl, y0, y1, ow, w, wo, bias, zrow, out, oo, epf, grid)


@njit(cache=True, inline="always")
def _strip(s, k, kw, x, xo, H, W, t, l, d, x0, nl, y0, y1, ow, w, wo, bias, zrow, out, oo, epf, grid):
    if k != kw:
        _band(k, kw, x, xo, H, W, t, l, d, x0, nl, y0, y1, ow, w, wo, bias, zrow, out, oo, epf, grid)
    elif k == 3:
        if s == 1:
            _s1k3(x, xo, H, W, t, l, d, x0, nl, y0, y1, ow, w, wo, bias, zrow, out, oo, epf, grid)
        else:
            _s2k3(x, xo, H, W, t, l, d, x0, nl, y0, y1, ow, w, wo, bias, zrow, out, oo, epf, grid)
    elif k == 5:
        if s == 1:
            _s1k5(x, xo, H, W, t, l, d, x0, nl, y0, y1, ow, w, wo, bias, zrow, out, oo, epf, grid)
        else:
            _s2k5(x, xo, H, W, t, l, d, x0, nl, y0, y1, ow, w, wo, bias, zrow, out, oo, epf, grid)
    else:
        if s == 1:
            _s1k7(x, xo, H, W, t, l, d, x0, nl, y0, y1, ow, w, wo, bias, zrow, out, oo, epf, grid)
        else:
            _s2k7(x, xo, H, W, t, l, d, x0, nl, y0, y1, ow, w, wo, bias, zrow, out, oo, epf, grid)


@njit(parallel=True, cache=True)
def depthwise_strips(x, w, b, k, kw, s, d, t, l, epf, grid, zrow, rows, out):
    """x (C, H, W) -> out (C, oh, ow), w (C, k*kw): k x k (kw = k) with k in SIZES, stride s 1 (dilation d) or
    2 (d 1), or a band (k, kw) in BANDS at stride 1 (d 1); padding
    t (top) and l (left), any bottom/right; in 16-column strips down blocks of `rows` output rows (a
    block's input rows stay in L1 across its strips; whole-channel strips re-read a 112-wide plane
    from L2 and walked it against the prefetcher)."""
    C, H, W = x.shape
    oh, ow = out.shape[1], out.shape[2]
    xf, of = x.reshape(-1), out.reshape(-1)
    nstrip = (ow + 15) // 16
    nyb = (oh + rows - 1) // rows
    # one item a (channel, block of rows), not a channel: channels fewer than threads, or not a multiple of
    # them, still spread evenly (24 channels of 112x112 at 16 threads: 2 channels on half the threads, 1 on
    # the rest before; 336 blocks now, 21 a thread)
    for item in prange(C * nyb):
        c, y0 = item // nyb, (item % nyb) * rows
        y1 = min(oh, y0 + rows)
        for j in range(nstrip):
            _strip(s, k, kw, xf, c * H * W, H, W, t, l, d, 16 * j, ow - 16 * j, y0, y1, ow, w, c * k * kw, b[c],
                   zrow, of, c * oh * ow, epf, grid)
