"""k x k depthwise convolution (k = 3, 5, 7; stride 1 or 2) on small maps with 16 channels in the vector
lanes, as AVX-512 LLVM IR: NCHW in and out, the channels-in-lanes layout only in an L1 scratch.

On 14x14 and 7x7 maps the NCHW kernels give a row of 14 (or 7) pixels a vector of 16 lanes, set up
masks, weights and the epilogue per channel, and at stride 2 shuffle every tap row into even and odd
pixels: 768 channels of 3x3 on 14x14 took 84 us at one thread here (AMD EPYC), ~3x their FMAs' time,
where onnxruntime's NCHWc kernel (channels in the lanes) took ~50 in the model. Here a block of 16
channels is transposed (16 x 16 in registers, four rounds of two-source shuffles) into a zero-bordered
scratch (pixel-major, a pixel's 16 channels one vector: 14x14 padded by 1 is 16 KB), the next block's
input prefetched meanwhile; each output row then goes TILE pixels at a time, whole-vector FMAs (every
lane used, no shuffles; stride 2 is the same loads at other offsets), a tap row's input vectors loaded
once for all its taps, the TILE sums finished under one branch, and the block is transposed back into
the NCHW output.
"""
from __future__ import annotations

import functools

import numpy as np

from ..compile.jit import intrinsic, njit, prange, types

from .activation_ir import Finish
from .llvm_ir import data_of, first_lanes, k_loop, prefetch, vector_ops

SIZES = (3, 5, 7)
STRIDES = (1, 2)
TILE = 7            # output pixels a step: seven FMA chains in flight


def transpose16(builder, vecs):
    """16 vectors of 16 floats -> their transpose (out[j] lane i = vecs[i] lane j): for each bit b of the
    index, vector pairs (i, i + 2^b) swap the lanes whose bit b differs (two two-source shuffles a pair)."""
    from llvmlite import ir
    i32 = ir.IntType(32)
    v = list(vecs)
    for b in range(4):
        d = 1 << b
        lo = ir.Constant(ir.VectorType(i32, 16), [j if not j & d else 16 + j - d for j in range(16)])
        hi = ir.Constant(ir.VectorType(i32, 16), [j + d if not j & d else 16 + j for j in range(16)])
        nv = list(v)
        for i in range(16):
            if i & d:
                continue
            nv[i] = builder.shuffle_vector(v[i], v[i + d], lo)
            nv[i + d] = builder.shuffle_vector(v[i], v[i + d], hi)
        v = nv
    return v


def _make_block(k: int, stride: int):
    taps = k * k

    @intrinsic
    def block_kernel(typingctx, x, xo, nc, hw, inpos, xt, wt, wo, bt, bo, yt, pw, oh, ow, out, oo, epf, on_grid,
                     pb0, pb1, y0, y1):
        """Output rows y0 <= y < y1 of one block of nc <= 16 channels: x[xo + c*hw + p] (c < nc, p < hw) for the
        16-pixel blocks pb0 <= p // 16 < pb1 (those rows' windows) transposed into the scratch xt at vector
        inpos[p] (xt's border vectors stay zero: the padding; rows pw vectors long), then output pixel (y, i)
        (i < ow) is finish(bt[bo..bo+16] + sum_rj wt[wo + 16*(k*r + j) ..] * xt[(stride*y + r)*pw + stride*i + j])
        (vectors of 16 floats, lanes = channels) into yt[y*ow + i], transposed into out[oo + c*oh*ow + y*ow + i]
        (only the pixels of rows y0..y1-1). inpos has a whole number of 16-pixel blocks (the pixels past hw
        point at a spare vector). Pixels go TILE of a row at a time, the last tile of a row ending at its end
        (overlapping the one before); a row narrower than TILE computes pixels past its end into the next
        row's places (written again when that row comes, or never stored) or yt's slack, from reads that
        stay inside xt's slack (`tables`). Each output pixel is the same FMA chain whatever the row range."""
        from llvmlite import ir
        ip = types.intp
        sig = types.void(x, ip, ip, ip, inpos, xt, wt, ip, bt, ip, yt, ip, ip, ip, out, ip, epf, ip, ip, ip, ip, ip)

        def codegen(context, builder, sig, args):
            (xa, xo_, nc_, hw_, ina, xta, wa, wo_, ba, bo_, yta, pw_, oh_, ow_, oa, oo_, epfa, grid_,
             pb0_, pb1_, y0_, y1_) = args
            ohw_ = builder.mul(oh_, ow_)
            p0_, p1_ = builder.mul(y0_, ow_), builder.mul(y1_, ow_)    # the output pixels stored
            i32, i64, f32 = ir.IntType(32), ir.IntType(64), ir.FloatType()
            f16 = ir.VectorType(f32, 16)
            vp = f16.as_pointer()
            a = sig.args
            xp = data_of(context, builder, a[0], xa, xo_)
            inp = data_of(context, builder, a[4], ina)
            xtp = builder.bitcast(data_of(context, builder, a[5], xta), vp)
            wp = builder.bitcast(data_of(context, builder, a[6], wa, wo_), vp)
            bp = builder.bitcast(data_of(context, builder, a[8], ba, bo_), vp)
            ytp = builder.bitcast(data_of(context, builder, a[10], yta), vp)
            outp = data_of(context, builder, a[14], oa, oo_)
            const = lambda v: ir.Constant(i64, v)   # noqa: E731
            fma, mload, mstore = vector_ops(builder)
            fzero = ir.Constant(f16, [0.0] * 16)
            align = ir.Constant(i32, 4)
            last = builder.sub(nc_, const(1))
            # channel c's plane (channels past nc read the last one again: in bounds, never stored)
            planes = [builder.mul(builder.select(builder.icmp_signed("<", const(c), nc_), const(c), last), hw_)
                      for c in range(16)]
            finish = Finish(builder, epfa, builder.icmp_signed("!=", grid_, const(0)))

            def load_in(pb, _):
                at = builder.mul(builder.add(pb, pb0_), const(16))
                mask = first_lanes(builder, builder.sub(hw_, at))
                rows = [builder.call(mload, [builder.bitcast(builder.gep(xp, [builder.add(planes[c], at)]), vp),
                                             align, mask, fzero]) for c in range(16)]
                for c in range(16):     # the next block's same pixels, a block's work ahead (prefetches never fault)
                    prefetch(builder, builder.gep(xp, [builder.add(builder.mul(const(16 + c), hw_), at)]))
                for p, v in enumerate(transpose16(builder, rows)):
                    pos = builder.load(builder.gep(inp, [builder.add(at, const(p))]))
                    builder.store(v, builder.gep(xtp, [pos]), align=4)
                return []
            k_loop(builder, builder.sub(pb1_, pb0_), [], load_in)

            bias = builder.load(bp, align=4)
            wv = [builder.load(builder.gep(wp, [const(t)]), align=4) for t in range(taps)] if taps <= 9 else None
            ntile = builder.sdiv(builder.add(ow_, const(TILE - 1)), const(TILE))
            last_tile = builder.sub(ow_, const(TILE))
            last_tile = builder.select(builder.icmp_signed(">", last_tile, const(0)), last_tile, const(0))

            # rows from y0 on: the scratches addressed from that row (as for the stores below)
            xtr = builder.gep(xtp, [builder.mul(builder.mul(y0_, const(stride)), pw_)])
            ytr = builder.gep(ytp, [p0_])

            def row(oy, _):
                def tile(ti, _):
                    ox0 = builder.mul(ti, const(TILE))
                    ox0 = builder.select(builder.icmp_signed("<", ox0, last_tile), ox0, last_tile)
                    first = builder.add(builder.mul(builder.mul(oy, const(stride)), pw_),
                                        builder.mul(ox0, const(stride)))
                    accs = [bias] * TILE
                    for r in range(k):
                        # this tap row's input vectors, each shared by the taps of every pixel that reads it
                        at = builder.gep(xtr, [builder.add(first, builder.mul(const(r), pw_))])
                        xs = [builder.load(builder.gep(at, [const(c)]), align=4)
                              for c in range(stride * (TILE - 1) + k)]
                        for j in range(k):
                            w = wv[k * r + j] if wv else builder.load(builder.gep(wp, [const(k * r + j)]), align=4)
                            for i in range(TILE):
                                accs[i] = builder.call(fma, [xs[stride * i + j], w, accs[i]])
                    dst = builder.gep(ytr, [builder.add(builder.mul(oy, ow_), ox0)])
                    for i, v in enumerate(finish.many(accs)):
                        builder.store(v, builder.gep(dst, [const(i)]), align=4)
                    return []
                k_loop(builder, ntile, [], tile)
                return []
            k_loop(builder, builder.sub(y1_, y0_), [], row)

            # the stored pixels from p0 on: the scratch and the output addressed from there (a loop of the same
            # shape as one over the whole block: p0 + 16*pb in its body cost ~8% of the kernel)
            yts, outs, nst = builder.gep(ytp, [p0_]), builder.gep(outp, [p0_]), builder.sub(p1_, p0_)

            def store_out(pb, _):
                at = builder.mul(pb, const(16))
                mask = first_lanes(builder, builder.sub(nst, at))
                none = first_lanes(builder, const(0))
                cols = [builder.load(builder.gep(yts, [builder.add(at, const(p))]), align=4) for p in range(16)]
                for c, v in enumerate(transpose16(builder, cols)):
                    keep = builder.select(builder.icmp_signed("<", const(c), nc_), mask, none)
                    dst = builder.gep(outs, [builder.add(builder.mul(builder.select(
                        builder.icmp_signed("<", const(c), nc_), const(c), const(0)), ohw_), at)])
                    builder.call(mstore, [v, builder.bitcast(dst, vp), align, keep])
                return []
            k_loop(builder, builder.sdiv(builder.add(nst, const(15)), const(16)), [], store_out)
            return context.get_dummy_value()
        return sig, codegen
    return block_kernel


_b1k3, _b2k3 = _make_block(3, 1), _make_block(3, 2)
_b1k5, _b2k5 = _make_block(5, 1), _make_block(5, 2)
_b1k7, _b2k7 = _make_block(7, 1), _make_block(7, 2)


@njit(cache=True, inline="always")
def _block(k, s, x, xo, nc, hw, inpos, xt, wt, wo, bt, bo, yt, pw, oh, ow, out, oo, epf, grid, pb0, pb1, y0, y1):
    if k == 3:
        if s == 1:
            _b1k3(x, xo, nc, hw, inpos, xt, wt, wo, bt, bo, yt, pw, oh, ow, out, oo, epf, grid, pb0, pb1, y0, y1)
        else:
            _b2k3(x, xo, nc, hw, inpos, xt, wt, wo, bt, bo, yt, pw, oh, ow, out, oo, epf, grid, pb0, pb1, y0, y1)
    elif k == 5:
        if s == 1:
            _b1k5(x, xo, nc, hw, inpos, xt, wt, wo, bt, bo, yt, pw, oh, ow, out, oo, epf, grid, pb0, pb1, y0, y1)
        else:
            _b2k5(x, xo, nc, hw, inpos, xt, wt, wo, bt, bo, yt, pw, oh, ow, out, oo, epf, grid, pb0, pb1, y0, y1)
    elif s == 1:
        _b1k7(x, xo, nc, hw, inpos, xt, wt, wo, bt, bo, yt, pw, oh, ow, out, oo, epf, grid, pb0, pb1, y0, y1)
    else:
        _b2k7(x, xo, nc, hw, inpos, xt, wt, wo, bt, bo, yt, pw, oh, ow, out, oo, epf, grid, pb0, pb1, y0, y1)


@njit(parallel=True, cache=True)
def depthwise_lanes(x, wt, bt, k, s, inpos, pw, epf, grid, xt, yt, out):
    """x (C, H, W) -> out (C, oh, ow) by blocks of 16 channels; wt (ceil(C/16), k*k, 16) and bt (ceil(C/16), 16)
    the weights and bias with channels last (`lanes_weights`, `lanes_bias`), k in SIZES, s in STRIDES; inpos and pw
    from `tables`; xt (chunks, input scratch vectors * 16: zero where no input pixel is written) and yt
    (chunks, output scratch vectors * 16) the scratch of each of `chunks` workers.

    The work is the blocks' output rows one after another (block-major), and a chunk runs an equal
    contiguous run of them (`chunks_of`): a block split between two chunks costs each only the input rows its
    own rows' windows reach (k - s more than its share), where whole blocks a chunk (as before) left threads
    idle wherever the blocks were fewer than the threads or not a multiple of them (32 channels on 28x28 at 4
    threads: 2 blocks; 72 channels: 5 blocks, 2 on one thread). One chunk runs every block whole."""
    C, H, W = x.shape
    oh, ow = out.shape[1], out.shape[2]
    hw, ohw = H * W, oh * ow
    xf, of = x.reshape(-1), out.reshape(-1)
    wf, bf = wt.reshape(-1), bt.reshape(-1)
    nb = (C + 15) // 16
    chunks = xt.shape[0]
    total = nb * oh
    t = inpos[0] // pw if hw > 0 else 0      # the top padding (inpos[0] = t*pw + l, l < pw)
    for ch in prange(chunks):
        lo, hi = ch * total // chunks, (ch + 1) * total // chunks
        for blk in range(lo // oh, (hi + oh - 1) // oh):
            y0, y1 = max(lo - blk * oh, 0), min(hi - blk * oh, oh)
            # the 16-pixel input blocks holding the rows these output rows' windows reach
            iy0, iy1 = max(0, y0 * s - t), min(H, (y1 - 1) * s + k - t)
            pb0 = (iy0 * W) // 16
            pb1 = (iy1 * W + 15) // 16 if iy1 > iy0 else pb0
            c0 = 16 * blk
            _block(k, s, xf, c0 * hw, min(16, C - c0), hw, inpos, xt[ch], wf, blk * k * k * 16, bf, blk * 16,
                   yt[ch], pw, oh, ow, of, c0 * ohw, epf, grid, pb0, pb1, y0, y1)


def chunks_of(channels: int, oh: int, threads: int) -> int:
    """The chunks `depthwise_lanes` splits a layer into at `threads`: one a thread, fewer where the blocks'
    output rows are fewer."""
    return max(1, min(threads, -(-channels // 16) * oh))


def lanes_weights(w: np.ndarray, k: int) -> np.ndarray:
    """(C, k*k) weights -> (ceil(C/16), k*k, 16) on a cache line, channels in the lanes (zeros past C):
    kernels.aligned_lanes, the packing matvec_lanes' outputs share."""
    from .. import aligned_lanes
    return aligned_lanes(w.reshape(w.shape[0], k * k))


def lanes_bias(b: np.ndarray) -> np.ndarray:
    """(C,) bias -> (ceil(C/16), 16) on a cache line (zeros past C)."""
    from .. import aligned_empty
    c = b.shape[0]
    bt = aligned_empty(-(-c // 16) * 16)
    bt[:] = 0
    bt[:c] = b
    return bt.reshape(-1, 16)


@functools.lru_cache(maxsize=64)
def tables(h: int, w: int, k: int, s: int, t: int, l: int, oh: int, ow: int):
    """(inpos, pw, input scratch vectors, output scratch vectors). The input scratch is the input padded by
    t/l and whatever the windows reach past the bottom/right (ph x pw vectors, pixel-major), then slack for
    the reads of a tile's pixels past a row narrower than TILE, then one spare vector (where the input
    pixels past the last whole 16-pixel block go); inpos[p] is input pixel p's vector. The output scratch
    holds oh*ow pixels rounded up to 16, then 16 + TILE more (a row range's last 16-pixel store starts at any
    pixel, so it reads up to 15 vectors past the last one)."""
    ph = max(h + t, (oh - 1) * s + k)
    pw = max(w + l, (ow - 1) * s + k)
    spare = ph * pw + s * TILE + k
    nin = -(-h * w // 16) * 16
    p = np.arange(nin)
    inpos = np.where(p < h * w, (p // w + t) * pw + p % w + l, spare).astype(np.int64)
    inpos.setflags(write=False)
    return inpos, pw, spare + 1, -(-oh * ow // 16) * 16 + 16 + TILE
