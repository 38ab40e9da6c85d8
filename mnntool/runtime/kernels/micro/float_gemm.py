"""fp32 GEMM with the convolution epilogue fused: out[o, p] = finish(sum_k w[o, k] x[k, p] + bias[o]).

OpenBLAS packs both operands on every call and leaves bias, activation and int8-grid rounding to a
second pass over the output; at batch 1 most convolutions are small or thin GEMMs (a 1x1 layer of
MobileNetV2, a Winograd position with 16 tiles) where that costs as much as the multiply. Here the
weights are packed once at prepare ([O/8][K][8]) and the activations are read where they are (an NCHW
plane, an im2col matrix or a Winograd position: row k at x + k * xs), so nothing is copied per call.

The micro-kernel is LLVM IR for AVX-512 (Numba does not keep a register tile of accumulators): a tile
of NV x 16 pixels x 8 output channels in NV * 8 zmm accumulators, one FMA per (16 pixels, channel, k)
with the weight broadcast into a register; masked loads and stores handle the tile at the row end and
the channels past O, so the output needs no padding rows.
"""
from __future__ import annotations

import numpy as np
from ..compile.jit import njit, prange, types, intrinsic

from .. import aligned_empty, serial, sized
from ..weight_cache import packed_once, shape_free
from .epilogue import NO_POST
from .activation_ir import Finish
from .llvm_ir import data_of, declare, vector_ops, first_lanes, host_has, k_loop, prefetch, splat as splat_

OCB = 8          # output channels per tile
WEIGHT_BLOCK = 128 * 1024   # floats: the weights one pass over the output streams per tile, kept in L2
BY_BLOCK_X = 256 * 1024     # floats: an activation matrix this small is re-read from L2 per channel block


def walk_by_block(k: int, pixels: int, o: int, threads: int = 1) -> bool:
    """Whether `gemm` walks a channel block's tiles in a row (its 8 output rows written as sequential streams,
    x re-read per block) rather than a tile's channel blocks (x's panel read once, every output row written a
    tile at a time): for x small enough to re-read from L2, and for layers with at least as many output
    channels as inputs, whose outputs written across all rows cost more than re-reading x. Serial kernels
    alone, 1 thread, Intel Xeon, ms tiles / by block (tmp_dev/xp/pw_walk.py, warm; after a 256 MB pass):
    128->128 on 56x56 1.50 / 1.27 (1.98 / 1.33), 64->256 on 56x56 2.41 / 1.61, 16->96 on 112x112 2.40 / 0.88;
    fewer outputs than inputs: 256->64 on 56x56 1.22 / 2.20, 96->24 0.28 / 0.34. (AMD EPYC: 128->128 on 56x56
    1.11 / 1.14.) The second case at one thread only, where it was measured: at more, the threads take channel
    blocks and each would stream all of a large x."""
    return k * pixels <= BY_BLOCK_X or (o >= k and threads <= 1)


# At one thread the serial twins of this module's parallel kernels, as the kernel library (compile-kernels)
# runs them: Numba's parallel build of the same loop ran slower at one thread (Intel Xeon, ms parallel /
# twin: 1x1 64->256 on 56x56 1.05 / 0.86, 256->128 1.92 / 1.83, 128->512 on 28x28 0.88 / 0.82, conv_im2col
# 3x3/2 128->128 to 28x28 2.42 / 2.15, phase_split 512 x 14 x 14 0.138 / 0.041; AMD EPYC phase_split 0.075 /
# 0.038; tmp_dev/xgemm/diag.py, exp2.py). Whole layer models on a noisier Xeon: 0.93-0.96 on 8 of 20
# layers, 1.08-1.12 on 3 (abs.py). Overridable (a benchmark flips it before building a session).
SERIAL_AT_ONE = True


def fitted(fn, work: int, threads: int):
    """`sized(fn, work, threads)`, the serial twin at one thread when SERIAL_AT_ONE."""
    return sized(serial(fn) if threads <= 1 and SERIAL_AT_ONE else fn, work, threads)


def k_block(k: int, rows: int, tiles: int) -> int:
    """k per pass over the output: all of it when one tile reads the weights once, else balanced blocks
    whose weights (rows x kc) stay in L2 while every tile uses them."""
    if tiles <= 1:
        return k
    limit = max(64, WEIGHT_BLOCK // rows)
    passes = -(-k // limit)
    return -(-k // passes)


HAS_AVX512 = host_has("avx512f")


def _asm_parser() -> None:
    """The tiles' inline asm needs LLVM's native asm parser, which Numba does not initialize: called where a
    tile is generated (not at import: a session on the kernel library imports no llvmlite)."""
    import llvmlite.binding as llvm
    llvm.initialize_native_asmparser()


# rows of x the micro-kernel prefetches ahead (one prefetch a 16-float vector; a prefetch past the end of x is
# a hint, never a fault). Serial pointwise GEMMs alone, 1 thread, Intel Xeon, GFLOP/s without -> with (8):
# 448->256 on 56x56 108 -> 117, 128->128 on 56x56 97 -> 113, 64->64 on 112x112 74 -> 86, 256->64 on 56x56
# 106 -> 119, 2048->512 on 7x7 99 -> 112, 736->512 on 28x28 123 -> 132 (onnxruntime 151), 1024->256 on
# 14x14 137 -> 141; 4 and 16 rows ahead within a few percent of 8 (tmp_dev/xp/pf.py)
X_AHEAD = 8


def _make_tile(nv: int, ocb: int = OCB, in_register: bool = True):
    """The micro-kernel for nv x 16 pixels x ocb channels (ocb <= 8: the first ocb of a packed block of 8).
    `in_register`: each weight broadcast once into a register (inline asm) for its nv FMAs; LLVM otherwise
    folds the broadcast into every FMA ({1to16}): 27 loads a k for 24 FMAs, where Intel's two FMA ports
    want fewer loads than FMAs. Serial kernels alone, Intel Xeon (tmp_dev/xgemm/exp1.py): 1x1 on 7x7 maps
    x0.84-0.88, on 14x14 to 56x56 x0.95-1.03; AMD EPYC within its noise (x0.89-1.06)."""
    @intrinsic
    def tile(typingctx, x, xoff, xs, w, woff, nk, out, ooff, os_, left, rows, bias, epf, flags):
        """out[o0 + o, p0 + j] for 8 channels x nv*16 pixels. x row k at xoff + k*xs, or at xoff + xs[k]
        when xs is an array of offsets (a convolution's taps, read where they are); weights at woff
        as [k][8]; `left` valid pixels and `rows` valid channels (out has no rows past them); bias row
        at the tile's channel; epf = (act_lo, act_hi, 1/s, s, q_lo, q_hi); flags = (accumulate onto
        out, final: bias + activation, round to the grid)."""
        from llvmlite import ir
        indirect = isinstance(xs, types.Array)
        sig = types.void(x, types.intp, xs if indirect else types.intp, w, types.intp, types.intp, out, types.intp,
                         types.intp, types.intp, types.intp, bias, epf, flags)

        def codegen(context, builder, sig, args):
            if in_register:
                _asm_parser()
            xa, xo, xs_, wa, wo, nk_, oa, oo, ostride, left_, rows_, ba, epfa, fla = args
            i1, i32, i64, f32 = ir.IntType(1), ir.IntType(32), ir.IntType(64), ir.FloatType()
            f16, m16 = ir.VectorType(f32, 16), ir.VectorType(i1, 16)
            a = sig.args
            xp = data_of(context, builder, a[0], xa, xo)
            wp = data_of(context, builder, a[3], wa, wo)
            op = data_of(context, builder, a[6], oa, oo)
            bp = data_of(context, builder, a[11], ba)
            const = lambda v: ir.Constant(i64, v)   # noqa: E731
            fma, mload, mstore = vector_ops(builder)
            fzero = ir.Constant(f16, [0.0] * 16)
            splat = lambda value, vt: splat_(builder, value, vt)  # noqa: E731

            masks = [first_lanes(builder, builder.sub(left_, const(16 * v))) for v in range(nv)]
            accumulate = builder.icmp_signed("!=", builder.extract_value(fla, 0), const(0))
            final = builder.icmp_signed("!=", builder.extract_value(fla, 1), const(0))
            on_grid = builder.icmp_signed("!=", builder.extract_value(fla, 2), const(0))
            none = ir.Constant(m16, [0] * 16)

            def store_mask(o, v):
                """Vector v's pixels on channel o, none past `rows`. Built where it is used: masks kept
                live across the k loop would not fit AVX-512's eight mask registers."""
                return builder.select(builder.icmp_signed("<", const(o), rows_), masks[v], none)

            def out_ptr(o, v):
                at = builder.add(builder.mul(const(o), ostride), const(16 * v))
                return builder.bitcast(builder.gep(op, [at]), f16.as_pointer())

            # the sums so far only when accumulating: masked loads with an empty mask still cost (k16
            # tiles ran 80 -> 91 GFLOP/s without them)
            start = builder.block
            resume, begin = builder.append_basic_block("resume"), builder.append_basic_block("begin")
            builder.cbranch(accumulate, resume, begin)
            builder.position_at_end(resume)
            saved = [builder.call(mload, [out_ptr(o, v), ir.Constant(i32, 4), store_mask(o, v), fzero])
                     for o in range(ocb) for v in range(nv)]
            builder.branch(begin)
            builder.position_at_end(begin)
            init = []
            for value in saved:
                phi = builder.phi(f16)
                phi.add_incoming(fzero, start)
                phi.add_incoming(value, resume)
                init.append(phi)

            def step(kk, accs):
                if indirect:
                    offs = data_of(context, builder, a[2], xs_)
                    row = builder.gep(xp, [builder.load(builder.gep(offs, [kk]))])
                    # tap k + X_AHEAD of this tile (the offset table read at most at its last tap): scattered
                    # rows the prefetchers do not follow. Prefetching the next tile's taps at tap k instead
                    # (as before) ran slower on the Xeon: 1 thread, GFLOP/s before -> now, 64->64 3x3/2 to
                    # 28x28 67.6 -> 90.5, 32->32 3x3/2 to 56x56 58.5 -> 65.1, 128->128 3x3/2 to 28x28
                    # 72.8 -> 77.5, 5x5 48->64 on 35x35 92.9 -> 99.5, 7x7/2 stem 90.5 -> 95.3 (tmp_dev/xp/pf2.py)
                    ka = builder.add(kk, const(X_AHEAD))
                    ka = builder.select(builder.icmp_signed("<", ka, nk_), ka, kk)
                    ahead = builder.gep(xp, [builder.load(builder.gep(offs, [ka]))])
                    for v in range(nv):
                        prefetch(builder, builder.gep(ahead, [const(16 * v)]))
                else:
                    row = builder.gep(xp, [builder.mul(kk, xs_)])
                    # row k + X_AHEAD, a row stride on (a plane, 12.5 KB at 56x56): strides past 2 KB are
                    # beyond the L1 stride prefetcher, and rows a page apart beyond the L2 streamer
                    ahead = builder.gep(xp, [builder.mul(builder.add(kk, const(X_AHEAD)), xs_)])
                    for v in range(nv):
                        prefetch(builder, builder.gep(ahead, [const(16 * v)]))
                xv = [builder.call(mload, [builder.bitcast(builder.gep(row, [const(16 * v)]), f16.as_pointer()),
                                           ir.Constant(i32, 4), masks[v], fzero]) for v in range(nv)]
                wrow = builder.gep(wp, [builder.mul(kk, const(OCB))])
                new = []
                for o in range(ocb):
                    if in_register:
                        wb = builder.asm(ir.FunctionType(f16, [wrow.type]), f"vbroadcastss {4 * o}($1), $0", "=v,r",
                                         [wrow], False)
                    else:
                        wb = splat(builder.load(builder.gep(wrow, [const(o)]), align=4), f16)
                    for v in range(nv):
                        new.append(builder.call(fma, [xv[v], wb, accs[o * nv + v]]))
                return new
            result = k_loop(builder, nk_, init, step)
            # the epilogue (bias, activations, grid) only after the last k block: one branch for the tile
            summed = builder.block
            fin_b, store_b = builder.append_basic_block("finish"), builder.append_basic_block("store")
            builder.cbranch(final, fin_b, store_b)
            builder.position_at_end(fin_b)
            biases = [splat(builder.load(builder.gep(bp, [const(o)])), f16) for o in range(ocb)]
            done = Finish(builder, epfa, on_grid).many(
                [builder.fadd(result[o * nv + v], biases[o]) for o in range(ocb) for v in range(nv)])
            finished = builder.block
            builder.branch(store_b)
            builder.position_at_end(store_b)
            vals = []
            for raw, fin in zip(result, done):      # every phi first: they head the block
                vals.append(builder.phi(f16))
                vals[-1].add_incoming(raw, summed)
                vals[-1].add_incoming(fin, finished)
            for o in range(ocb):
                for v in range(nv):
                    builder.call(mstore, [vals[o * nv + v], out_ptr(o, v), ir.Constant(i32, 4), store_mask(o, v)])
            return context.get_dummy_value()
        return sig, codegen
    return tile


_tile1, _tile2, _tile3 = _make_tile(1), _make_tile(2), _make_tile(3)
# 49..64 pixels (7x7 maps) as one tile of 64 x 4 channels, twice per block: a second 48-pixel tile
# for the last pixel would stream all the weights again
_tile4 = _make_tile(4, 4)
# a last block of at most 4 channels (rows) or of one: the 8-row tile computed all 8 (a tiny ViT's 17
# tokens as rows of its linear layers: a third of every GEMM's FMAs on one row)
_tile1_4, _tile2_4, _tile3_4 = _make_tile(1, 4), _make_tile(2, 4), _make_tile(3, 4)
_tile1_1, _tile2_1, _tile3_1 = _make_tile(1, 1), _make_tile(2, 1), _make_tile(3, 1)


TAIL_MAX = 8        # pixels a tail tile takes: a last tile of 1..8 pixels (17x17 and 14x14 maps, 197 tokens)
# from 49 pixels: a 7x7 map as one 48-pixel tile and a 1-pixel tail, where one 64-pixel tile of 4 channels
# (16 accumulators) read the activations twice per block of 8 channels
TAIL_FROM = 48


def _make_tail(np_: int, blocks: int):
    """The last 1..8 pixels of a GEMM with the channels in the lanes: `blocks` packed blocks of 8
    channels x np_ pixels in <8 x float> accumulators (16 at most), one broadcast per pixel and one load
    per block a k: np_ / 2 zmm FMAs' work a k per channel block, where the 16-pixel tile spent 8 on them
    (the 1 pixel past 6 x 48 of a 17x17 map cost a third of a full tile at every channel block, 5% of
    the layer)."""
    @intrinsic
    def tail(typingctx, x, xoff, xs, w, woff, wbs, nk, out, ooff, os_, rows, bias, epf, on_grid):
        """out[ooff + o*os_ + p] for p < np_, o < min(rows, 8*blocks) = finish(bias[o] + sum_k
        w[woff + (o // 8)*wbs + 8k + o % 8] x[xoff + k*xs + p]), all nk at once."""
        from llvmlite import ir
        sig = types.void(x, types.intp, types.intp, w, types.intp, types.intp, types.intp, out, types.intp,
                         types.intp, types.intp, bias, epf, types.intp)

        def codegen(context, builder, sig, args):
            xa, xo, xs_, wa, wo, wbs_, nk_, oa, oo, ostride, rows_, ba, epfa, grid_ = args
            i32, i64, f32 = ir.IntType(32), ir.IntType(64), ir.FloatType()
            f8, f16 = ir.VectorType(f32, 8), ir.VectorType(f32, 16)
            a = sig.args
            xp = data_of(context, builder, a[0], xa, xo)
            wp = data_of(context, builder, a[3], wa, wo)
            op = data_of(context, builder, a[7], oa, oo)
            bp = data_of(context, builder, a[11], ba)
            const = lambda v: ir.Constant(i64, v)   # noqa: E731
            fma8 = declare(builder, "llvm.fma.v8f32", f8, f8, f8, f8)
            _, mload, _ = vector_ops(builder)
            # blocks past `rows` read block 0 (their sums are never stored): no read past the weights
            wblocks = [builder.select(builder.icmp_signed("<", const(8 * b), rows_),
                                      builder.gep(wp, [builder.mul(wbs_, const(b))]), wp) for b in range(blocks)]
            init = [ir.Constant(f8, [0.0] * 8)] * (blocks * np_)

            def step(kk, accs):
                xrow = builder.gep(xp, [builder.mul(kk, xs_)])
                xb = [splat_(builder, builder.load(builder.gep(xrow, [const(p)]), align=4), f8) for p in range(np_)]
                new = []
                for b in range(blocks):
                    wv = builder.load(builder.bitcast(builder.gep(wblocks[b], [builder.mul(kk, const(OCB))]),
                                                      f8.as_pointer()), align=4)
                    for p in range(np_):
                        new.append(builder.call(fma8, [wv, xb[p], accs[b * np_ + p]]))
                return new
            result = k_loop(builder, nk_, init, step)
            finish = Finish(builder, epfa, builder.icmp_signed("!=", grid_, const(0)))
            fzero = ir.Constant(f16, [0.0] * 16)
            wide = ir.Constant(ir.VectorType(i32, 16), list(range(16)))
            for h in range(blocks // 2):
                bv = builder.call(mload, [builder.bitcast(builder.gep(bp, [const(16 * h)]), f16.as_pointer()),
                                          ir.Constant(i32, 4), first_lanes(builder, builder.sub(rows_, const(16 * h))),
                                          fzero])
                sums = [builder.fadd(builder.shuffle_vector(result[2 * h * np_ + p], result[(2 * h + 1) * np_ + p], wide),
                                     bv) for p in range(np_)]
                done = finish.many(sums)
                for c in range(16):
                    with builder.if_then(builder.icmp_signed("<", const(16 * h + c), rows_)):
                        row = builder.gep(op, [builder.mul(const(16 * h + c), ostride)])
                        for p in range(np_):
                            builder.store(builder.extract_element(done[p], ir.Constant(i32, c)),
                                          builder.gep(row, [const(p)]), align=4)
            return context.get_dummy_value()
        return sig, codegen
    return tail


_tail1, _tail2, _tail3, _tail4 = (_make_tail(n, 4) for n in range(1, 5))
_tail5, _tail6, _tail7, _tail8 = (_make_tail(n, 2) for n in range(5, 9))


@njit(cache=True, inline="always")
def tail_blocks(n):
    """Channel blocks of 8 per `_tail` call for n pixels: 16 accumulators at most."""
    return 4 if n <= 4 else 2


@njit(cache=True, inline="always")
def _tail(n, x, xo, xs, w, wo, wbs, nk, out, oo, os_, rows, bias, epf, grid):
    if n == 1:
        _tail1(x, xo, xs, w, wo, wbs, nk, out, oo, os_, rows, bias, epf, grid)
    elif n == 2:
        _tail2(x, xo, xs, w, wo, wbs, nk, out, oo, os_, rows, bias, epf, grid)
    elif n == 3:
        _tail3(x, xo, xs, w, wo, wbs, nk, out, oo, os_, rows, bias, epf, grid)
    elif n == 4:
        _tail4(x, xo, xs, w, wo, wbs, nk, out, oo, os_, rows, bias, epf, grid)
    elif n == 5:
        _tail5(x, xo, xs, w, wo, wbs, nk, out, oo, os_, rows, bias, epf, grid)
    elif n == 6:
        _tail6(x, xo, xs, w, wo, wbs, nk, out, oo, os_, rows, bias, epf, grid)
    elif n == 7:
        _tail7(x, xo, xs, w, wo, wbs, nk, out, oo, os_, rows, bias, epf, grid)
    else:
        _tail8(x, xo, xs, w, wo, wbs, nk, out, oo, os_, rows, bias, epf, grid)


@njit(cache=True, inline="always")
def _tile(nv, x, xo, xs, w, wo, nk, out, oo, os_, left, rows, bias, epf, flags):
    if nv == 4:
        _tile4(x, xo, xs, w, wo, nk, out, oo, os_, left, rows, bias, epf, flags)
        if rows > 4:
            _tile4(x, xo, xs, w, wo + 4, nk, out, oo + 4 * os_, os_, left, rows - 4, bias[4:], epf, flags)
    elif rows == 1:
        if nv == 3:
            _tile3_1(x, xo, xs, w, wo, nk, out, oo, os_, left, rows, bias, epf, flags)
        elif nv == 2:
            _tile2_1(x, xo, xs, w, wo, nk, out, oo, os_, left, rows, bias, epf, flags)
        else:
            _tile1_1(x, xo, xs, w, wo, nk, out, oo, os_, left, rows, bias, epf, flags)
    elif rows <= 4:
        if nv == 3:
            _tile3_4(x, xo, xs, w, wo, nk, out, oo, os_, left, rows, bias, epf, flags)
        elif nv == 2:
            _tile2_4(x, xo, xs, w, wo, nk, out, oo, os_, left, rows, bias, epf, flags)
        else:
            _tile1_4(x, xo, xs, w, wo, nk, out, oo, os_, left, rows, bias, epf, flags)
    elif nv == 3:
        _tile3(x, xo, xs, w, wo, nk, out, oo, os_, left, rows, bias, epf, flags)
    elif nv == 2:
        _tile2(x, xo, xs, w, wo, nk, out, oo, os_, left, rows, bias, epf, flags)
    else:
        _tile1(x, xo, xs, w, wo, nk, out, oo, os_, left, rows, bias, epf, flags)


@njit(cache=True, inline="always")
def _tiles(P):
    """Pixel tiles of 48 and one tail tile as narrow as its pixels need: (count, full tiles, tail nv);
    49..64 pixels are one tile of 64."""
    if 48 < P <= 64:
        return 1, 0, 4
    full = P // 48
    rest = P - full * 48
    tail_nv = (rest + 15) // 16
    return full + (1 if rest else 0), full, tail_nv


@njit(cache=True, inline="always")
def tail_pixels(P):
    """The last pixels `_tail` takes (channels in the lanes): 1..TAIL_MAX past whole 48-pixel tiles, else 0."""
    rest = P % 48
    return rest if P > TAIL_FROM and rest <= TAIL_MAX else 0


@njit(cache=True, inline="always")
def _spread(j, nmain, items):
    """The item at position j of a region of `nmain` tiles then `items - nmain` tails, the tiles spread
    evenly over the positions (tile i at i * items // nmain) in their order, tails between them. Numba
    hands each thread one contiguous run of positions: with the tails last, the few heavy tiles of a
    7x7 map (its channel-block parts) all fell to the first thread and the 32 tails to the others
    (3x3/2 512->1024 to 7x7: 1.06x from 1 to 2 threads on the EPYC, 1.26x from 1 to 4 on the Xeon)."""
    c = (j * nmain + items - 1) // items     # tiles at positions before j
    if c < nmain and (c * items) // nmain == j:
        return c
    return nmain + j - c


@njit(cache=True, inline="always")
def _gemm_body(x, xo, xs, P, wp, wo, K, O, nob, bias, epf, out, oo, os_, idx, k0, kn, flags, by_block):
    ntile, full, tail_nv = _tiles(P)
    if by_block:      # a channel block's tiles in a row: its output rows are written as 8 streams
        ob, t = idx // ntile, idx % ntile
    else:             # a tile's channel blocks in a row: its panel stays in L1
        t, ob = idx // nob, idx % nob
    p0 = t * 48
    nv = 3 if t < full else tail_nv
    o0 = ob * OCB
    _tile(nv, x, xo + k0 * xs + p0, xs, wp, wo + ob * K * OCB + k0 * OCB, kn, out, oo + o0 * os_ + p0, os_,
          P - p0, O - o0, bias[o0:], epf, flags)


@njit(parallel=True, cache=True)
def gemm(x, xs, P, wp, K, kc, O, bias, epf, grid, out, os_, by_block):
    """out[:O, :P] (row stride os_) from x (row k at k * xs) and packed weights; the epilogue adds the
    bias, applies epf's activation bounds and, when `grid`, rounds to epf's int8 grid."""
    nob = (O + OCB - 1) // OCB
    nt = tail_pixels(P)
    main = P - nt
    nmain = _tiles(main)[0] * nob
    tb = tail_blocks(nt)
    ng = (nob + tb - 1) // tb if nt else 0
    for k0 in range(0, K, kc):
        # (these three lines stay inline in the four kernels: a helper's returned tuple unpacked here made
        # Numba's parfor array analysis fail, IndexError in array_analysis)
        kn = min(kc, K - k0)
        last = 1 if k0 + kn >= K else 0
        flags = (1 if k0 > 0 else 0, last, grid)
        # the tail's channel groups (all of K at once) in the last K block's region: one region fewer
        items = nmain + ng * last     # no conditional inside prange(): Numba then runs the loop serially
        for j in prange(items):
            idx = _spread(j, nmain, items)
            if idx < nmain:
                _gemm_body(x, 0, xs, main, wp, 0, K, O, nob, bias, epf, out, 0, os_, idx, k0, kn, flags, by_block)
            else:
                o0 = (idx - nmain) * tb * OCB
                _tail(nt, x, main, xs, wp, o0 * K, K * OCB, K, out, o0 * os_ + main, os_, O - o0, bias[o0:], epf,
                      grid)


@njit(parallel=True, cache=True)
def gemm_batched(x, xs, xstride, P, wp, wstride, K, kc, O, bias, epf, grid, out, os_, ostride, batches, by_block):
    """`batches` independent GEMMs (Winograd positions, batched MatMul) as `gemm`, every batch's tiles in
    one parallel loop: x, packed weights and out advance by their strides."""
    nob = (O + OCB - 1) // OCB
    nt = tail_pixels(P)
    main = P - nt
    per = _tiles(main)[0] * nob
    nmain = batches * per
    tb = tail_blocks(nt)
    ng = (nob + tb - 1) // tb if nt else 0
    for k0 in range(0, K, kc):
        kn = min(kc, K - k0)
        last = 1 if k0 + kn >= K else 0
        flags = (1 if k0 > 0 else 0, last, grid)
        items = nmain + batches * ng * last     # no conditional inside prange(): Numba then runs the loop serially
        for i in prange(items):     # the tails in the last K block's region
            j = _spread(i, nmain, items)
            if j < nmain:
                b, idx = j // per, j % per
                _gemm_body(x, b * xstride, xs, main, wp, b * wstride, K, O, nob, bias, epf, out, b * ostride, os_, idx,
                           k0, kn, flags, by_block)
            else:
                b, o0 = (j - nmain) // ng, ((j - nmain) % ng) * tb * OCB
                _tail(nt, x, b * xstride + main, xs, wp, b * wstride + o0 * K, K * OCB, K, out,
                      b * ostride + o0 * os_ + main, os_, O - o0, bias[o0:], epf, grid)


PANEL = 48      # pixels of a panel of `pack_panels`: one full tile


@intrinsic
def prefetch_lines(typingctx, x, xo, n):
    """Prefetch (into L2) the cache lines of x[xo:xo + n]: the next rows (gemv)."""
    from llvmlite import ir
    sig = types.void(x, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        xa, xo_, n_ = args
        i64 = ir.IntType(64)
        base = builder.bitcast(data_of(context, builder, sig.args[0], xa, xo_), ir.IntType(8).as_pointer())
        nbytes = builder.mul(n_, ir.Constant(i64, 4))

        def body(off, accs):
            prefetch(builder, builder.gep(base, [off]), 2)
            return []
        k_loop(builder, nbytes, [], body, step=64)
        return context.get_dummy_value()
    return sig, codegen


def pack_panels(b: np.ndarray) -> np.ndarray:
    """(K, P) -> flat [P/48][K][48] float32, the columns past P zero: the constant right operand of a
    row GEMM (`gemm_panels`) in the order the tiles read it."""
    from .. import aligned_empty
    k, p = b.shape
    tiles = -(-p // PANEL)
    full = np.zeros((k, tiles * PANEL), np.float32)
    full[:, :p] = b
    out = aligned_empty(tiles * k * PANEL)
    out.reshape(tiles, k, PANEL)[:] = full.reshape(k, tiles, PANEL).transpose(1, 0, 2)
    return out


@njit(parallel=True, cache=True)
def gemm_panels(x, P, wp, K, kc, O, bias, epf, grid, out, os_):
    """`gemm` on x packed by `pack_panels`: tile t reads its K x 48 panel as one sequential stream. Read
    in place ([K][P], row k at k * P), a tile's 48 columns were K short runs a page apart that the
    prefetchers did not follow: a transformer's linear layers, their weights cold from L3 each run,
    took 0.47 ms against 0.31 with the weights in L2 (ViT-tiny fc1, 197 x 192 x 768). A panel's row
    blocks in a row, the panel reused from L1. No software prefetch of the next panel: in a chain of
    layers with cold weights (as in a model) the hardware's stream prefetch does better without it
    (1 thread, 16 layers: 16 x 384 x 768 2.13 against 2.92 ms with it, 49 x 384 x 1152 7.7 / 8.8,
    197 x 192 x 768 10.0 / 10.3; tmp_dev/tspeed/panel_exp.py)."""
    nob = (O + OCB - 1) // OCB
    full = P // PANEL
    nt = tail_pixels(P)
    ntile = full if nt else (P + PANEL - 1) // PANEL
    tail_nv = (P - full * PANEL + 15) // 16
    nmain = ntile * nob
    tb = tail_blocks(nt)
    ng = (nob + tb - 1) // tb if nt else 0
    for k0 in range(0, K, kc):
        kn = min(kc, K - k0)
        last = 1 if k0 + kn >= K else 0
        flags = (1 if k0 > 0 else 0, last, grid)
        items = nmain + ng * last     # no conditional inside prange(): Numba then runs the loop serially
        for j in prange(items):
            idx = _spread(j, nmain, items)
            if idx < nmain:
                t, ob = idx // nob, idx % nob
                p0 = t * PANEL
                o0 = ob * OCB
                _tile(3 if t < full else tail_nv, x, (t * K + k0) * PANEL, PANEL, wp, ob * K * OCB + k0 * OCB, kn,
                      out, o0 * os_ + p0, os_, P - p0, O - o0, bias[o0:], epf, flags)
            else:   # the last panel's nt columns, channels in the lanes, in the last K block's region
                o0 = (idx - nmain) * tb * OCB
                _tail(nt, x, full * K * PANEL, PANEL, wp, o0 * K, K * OCB, K, out, o0 * os_ + full * PANEL, os_,
                      O - o0, bias[o0:], epf, grid)


@intrinsic
def _deinterleave16(typingctx, src, so, pairs, dst, de, do):
    """dst[de + k] = src[so + 2k] and dst[do + k] = src[so + 2k + 1] for k < min(pairs, 16): two masked
    loads, two shuffles, two masked stores."""
    from llvmlite import ir
    sig = types.void(src, types.intp, types.intp, dst, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        sa, so_, n_, da, de_, do_ = args
        i32, i64, f32 = ir.IntType(32), ir.IntType(64), ir.FloatType()
        f16 = ir.VectorType(f32, 16)
        _, mload, mstore = vector_ops(builder)
        sp = data_of(context, builder, sig.args[0], sa, so_)
        const = lambda v: ir.Constant(i64, v)   # noqa: E731
        fzero = ir.Constant(f16, [0.0] * 16)
        two_n = builder.add(n_, n_)
        halves = [builder.call(mload, [builder.bitcast(builder.gep(sp, [const(16 * h)]), f16.as_pointer()),
                                       ir.Constant(i32, 4), first_lanes(builder, builder.sub(two_n, const(16 * h))),
                                       fzero]) for h in range(2)]
        keep = first_lanes(builder, n_)
        for parity, off in ((0, de_), (1, do_)):
            pick = ir.Constant(ir.VectorType(i32, 16), list(range(parity, 32, 2)))
            v = builder.shuffle_vector(halves[0], halves[1], pick)
            dst = builder.bitcast(data_of(context, builder, sig.args[3], da, off), f16.as_pointer())
            builder.call(mstore, [v, dst, ir.Constant(i32, 4), keep])
        return context.get_dummy_value()
    return sig, codegen


@njit(parallel=True, cache=True, fastmath=True)
def phase_split(x, t, l, sh, sw, xq):
    """xq[(c*sh + a)*sw + b, u, v] = padded x[c, u*sh + a, v*sw + b]: a strided convolution's taps become
    stride-1 reads of one phase plane. Only the interior is written; xq's zero border is the padding.
    x C-contiguous. On flat offsets (unsigned: no negative-index fix-up, so the copies vectorize): with
    a row view and slices per input row, RegNetY's 768 channels of 14x14 took 0.146 ms, 1 ns a float.
    With the row offsets hoisted and stride-2 rows in IR (1 thread): 320 channels of 28x28 102 -> 60 us,
    768 of 14x14 107 -> 61, stride 1 on 320 of 14x14 37 -> 12."""
    C, H, W = x.shape
    Hq, Wq = xq.shape[1], xq.shape[2]
    xf, qf = x.reshape(-1), xq.reshape(-1)
    plane = Hq * Wq
    # per input row, its phase row's offset in a channel's phases: integer divisions by the run-time
    # stride, once per row instead of once per row of every channel (with 28-wide rows they cost more
    # than the copy)
    row_at = np.empty(H, np.int64)
    for yy in range(H):
        py = yy + t
        row_at[yy] = (py % sh) * sw * plane + (py // sh) * Wq
    # stride-2 columns: padded column ix + l goes to phase (ix + l) % 2 at (ix + l) // 2
    ve, vo = l // 2, (l + 1) // 2
    npair = max(0, min(W // 2, Wq - ve, Wq - vo))
    even_at, odd_at = (l % 2) * plane + ve, (1 - l % 2) * plane + vo
    for c in prange(C):
        for yy in range(H):
            src = (c * H + yy) * W
            s0 = np.uint64(src)     # unsigned, for the loops LLVM vectorizes
            base = c * sh * sw * plane + row_at[yy]       # phase (a, b = 0)'s row u
            if sw == 1:
                n = min(W, Wq - l)
                d0 = np.uint64(base + l)
                for k in range(np.uint64(n)):
                    qf[d0 + k] = xf[s0 + k]
                continue
            if sw == 2:
                # both column phases at once, 16 pairs a step in IR (two loads, two shuffles): LLVM's
                # vectorized loop left rows of 28 (14 pairs) to its scalar remainder
                for k in range(0, npair, 16):
                    _deinterleave16(xf, src + 2 * k, npair - k, qf, base + even_at + k, base + odd_at + k)
                for ix in range(2 * npair, W):
                    q = ix + l
                    if q // 2 < Wq:
                        qf[base + (q % 2) * plane + q // 2] = xf[src + ix]
                continue
            for b in range(sw):
                # output column v takes input column v*sw + b - l
                v0 = max(0, (l - b + sw - 1) // sw)
                v1 = min(Wq, (W + l - b + sw - 1) // sw)
                d0 = np.uint64(base + b * plane + v0)
                s1, step = s0 + np.uint64(v0 * sw + b - l), np.uint64(sw)
                for v in range(np.uint64(max(0, v1 - v0))):
                    qf[d0 + v] = xf[s1 + v * step]


@intrinsic
def _copy_run(typingctx, src, so, dst, do, n):
    """dst[do:do + n] = src[so:so + n] for n <= 64, 16 floats a masked load and store: Numba's loop took
    a vector body, a scalar remainder and its set-up for each run of a panel (7-35 floats), ~8% of a 1x7
    layer on 17x17 maps."""
    from llvmlite import ir
    sig = types.void(src, types.intp, dst, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        sa, so_, da, do_, n_ = args
        i32, i64 = ir.IntType(32), ir.IntType(64)
        f16 = ir.VectorType(ir.FloatType(), 16)
        _, mload, mstore = vector_ops(builder)
        sp = data_of(context, builder, sig.args[0], sa, so_)
        dp = data_of(context, builder, sig.args[2], da, do_)
        fzero = ir.Constant(f16, [0.0] * 16)
        for v in range(4):
            left = builder.sub(n_, ir.Constant(i64, 16 * v))
            with builder.if_then(builder.icmp_signed(">", left, ir.Constant(i64, 0))):
                mask = first_lanes(builder, left)
                at = lambda p: builder.bitcast(builder.gep(p, [ir.Constant(i64, 16 * v)]), f16.as_pointer())  # noqa: E731
                val = builder.call(mload, [at(sp), ir.Constant(i32, 4), mask, fzero])
                builder.call(mstore, [val, at(dp), ir.Constant(i32, 4), mask])
        return context.get_dummy_value()
    return sig, codegen


PANEL_TAPS = 64     # taps a thread copies at a time into conv_im2col's shared panels


@njit(cache=True, inline="always")
def _runs(p0, lanes, width, ow, Wq):
    """Output pixels p0 .. p0+lanes-1 as runs along the phase planes' rows: (first lane, length, offset in a
    plane) each, and their count."""
    runs = np.empty((width, 3), np.int64)
    nrun, q = 0, 0
    while q < lanes:
        p = p0 + q
        y, x = p // ow, p % ow
        length = min(ow - x, lanes - q)
        if nrun > 0 and runs[nrun - 1, 2] + runs[nrun - 1, 1] == y * Wq + x:
            # the next output row continues the run in the plane (planes as wide as the output: a kh x 1
            # window, a strided 1x1): one copy per tap, not one per output row (Inception's 7x1 on 17x17
            # maps copied three runs of <= 17 floats per tap)
            runs[nrun - 1, 1] += length
        else:
            runs[nrun, 0], runs[nrun, 1], runs[nrun, 2] = q, length, y * Wq + x
            nrun += 1
        q += length
    return runs, nrun


@njit(cache=True, inline="always")
def _panel(xf, koff, base, k0, kn, p0, lanes, width, ow, Wq):
    """The (kn x width) panel of taps k0.. for output pixels p0 .. p0+lanes-1, copied as runs along
    output rows from the phase planes at `base`."""
    runs, nrun = _runs(p0, lanes, width, ow, Wq)
    panel = np.empty(kn * width, np.float32)
    _copy_taps(xf, koff, base, k0, kn, runs, nrun, width, panel, 0)
    return panel


@njit(cache=True, inline="always")
def _copy_taps(xf, koff, base, k0, kn, runs, nrun, width, dst, do):
    """Taps k0 .. k0+kn-1 of a panel's runs (`_panel`) into dst at do, a row of `width` floats a tap."""
    for k in range(kn):
        at = base + koff[k0 + k]
        for u in range(nrun):
            _copy_run(xf, at + runs[u, 2], dst, do + k * width + runs[u, 0], runs[u, 1])


@njit(parallel=True, cache=True, fastmath=True)
def conv_im2col(xq, koff, K, oh, ow, wp, kc, O, split, bias, epf, grid, out):
    """A convolution (group 1) without an im2col matrix: each 48-pixel tile copies its own (K x 48)
    panel, hot in L1 for the channel blocks that use it, from the phase planes xq (`phase_split`):
    tap (c, i, j) of output pixel (y, x) is plane (c, i*dh % sh, j*dw % sw) at (y + i*dh // sh,
    x + j*dw // sw) (`tap_offsets`), so every copy is contiguous. `split` divides the channel blocks
    when there are fewer tiles than threads: then every tile's whole panel is copied once, the copies
    split across threads by taps, before the channel blocks run (each of a tile's `split` parts copied
    the tile's whole panel again: ResNet-50's 512->512 3x3/2 to 7x7, one tile of 4608 taps, ran 1.25x
    faster at 4 threads than at 1 on a 16-core Xeon). out (O, oh*ow) flat."""
    nob = (O + OCB - 1) // OCB
    Wq = xq.shape[2]
    P = oh * ow
    xf = xq.reshape(-1)
    nt = tail_pixels(P)
    main = P - nt
    ntile, full, tail_nv = _tiles(main)
    width = 64 if tail_nv == 4 else 48      # panel columns
    per = (nob + split - 1) // split
    nmain = ntile * split
    tb = tail_blocks(nt)
    ng = (nob + tb - 1) // tb if nt else 0
    # the tail pixels' taps (K x nt), copied once before the regions: their channel groups run in the last
    # K block's region (one region fewer)
    tail = _panel(xf, koff, 0, 0, K, main, nt, nt, ow, Wq) if nt else np.empty(0, np.float32)
    shared = np.empty(ntile * K * width if split > 1 else 0, np.float32)
    if split > 1:
        chunks = (K + PANEL_TAPS - 1) // PANEL_TAPS
        copies = ntile * chunks
        for j in prange(copies):
            t, c0 = j // chunks, (j % chunks) * PANEL_TAPS
            p0 = t * 48
            runs, nrun = _runs(p0, min(width, main - p0), width, ow, Wq)
            _copy_taps(xf, koff, 0, c0, min(PANEL_TAPS, K - c0), runs, nrun, width, shared, (t * K + c0) * width)
    for k0 in range(0, K, kc):
        kn = min(kc, K - k0)
        last = 1 if k0 + kn >= K else 0
        flags = (1 if k0 > 0 else 0, last, grid)
        items = nmain + ng * last     # no conditional inside prange(): Numba then runs the loop serially
        for i in prange(items):
            j = _spread(i, nmain, items)
            if j < nmain:
                t, part = j // split, j % split
                p0 = t * 48
                lanes = min(width, main - p0)
                if split > 1:
                    panel = shared[(t * K + k0) * width:(t * K + k0 + kn) * width]
                else:
                    panel = _panel(xf, koff, 0, k0, kn, p0, lanes, width, ow, Wq)
                nv = 4 if width == 64 else 3 if lanes == 48 else (lanes + 15) // 16
                for ob in range(part * per, min(nob, (part + 1) * per)):
                    o0 = ob * OCB
                    _tile(nv, panel, 0, width, wp, ob * K * OCB + k0 * OCB, kn, out, o0 * P + p0, P, lanes, O - o0,
                          bias[o0:], epf, flags)
            else:
                o0 = (j - nmain) * tb * OCB
                _tail(nt, tail, 0, nt, wp, o0 * K, K * OCB, K, out, o0 * P + main, P, O - o0, bias[o0:], epf, grid)


@njit(parallel=True, cache=True)
def conv_grouped(xq, koff, G, planes, P, wp, K, O, bias, epf, grid, out):
    """A grouped convolution (G groups of O output channels, K = C*kh*kw taps each) with its taps read
    in place: output pixel p of a group is computed on the phase planes' own width (p = y*Wq + x, the
    columns x >= ow are thrown away by the caller), so tap k of 48 consecutive pixels is one run at
    koff[k] + p of the group's planes (`planes` floats from the last) and no panel is copied (with
    2 channel blocks a group, RegNet's copy cost as much as its multiply). Packed weights [G][O/8][K][8],
    bias [G][O/8*8]; out (G*O, P) flat."""
    nob = (O + OCB - 1) // OCB
    nt = tail_pixels(P)
    main = P - nt
    ntile = (main + 47) // 48
    xf = xq.reshape(-1)
    flags = (0, 1, grid)
    for j in prange(G * ntile):
        gi, t = j // ntile, j % ntile
        p0 = t * 48
        lanes = min(48, main - p0)
        for ob in range(nob):
            o0 = ob * OCB
            _tile((lanes + 15) // 16, xf, gi * planes + p0, koff, wp, (gi * nob + ob) * K * OCB, K, out,
                  (gi * O + o0) * P + p0, P, lanes, O - o0, bias[gi * nob * OCB + o0:], epf, flags)
    if nt:      # the last pixels with the channels in the lanes, from a (K x nt) copy of their taps
        for gi in prange(G):
            tail = np.empty(K * nt, np.float32)
            for k in range(K):
                at = gi * planes + koff[k] + main
                for p in range(nt):
                    tail[k * nt + p] = xf[at + p]
            for ob in range(0, nob, tail_blocks(nt)):
                o0 = ob * OCB
                _tail(nt, tail, 0, nt, wp, (gi * nob + ob) * K * OCB, K * OCB, K, out, (gi * O + o0) * P + main, P,
                      O - o0, bias[gi * nob * OCB + o0:], epf, grid)


@njit(parallel=True, cache=True)
def crop_rows(wide, out):
    """out (C, oh, ow) = wide[:, :, :ow]: `conv_grouped`'s output cut to its width, on flat unsigned
    offsets (numpy's strided copy looped per row of 7-28 floats: 320 x 14 x 14 in 17 us, 8 here)."""
    C, oh, ow = out.shape
    wq = wide.shape[2]
    wf, of = wide.reshape(-1), out.reshape(-1)
    for r in prange(C * oh):
        s0, d0 = np.uint64(r * wq), np.uint64(r * ow)
        for x in range(np.uint64(ow)):
            of[d0 + x] = wf[s0 + x]


@njit(parallel=True, cache=True)
def conv_rows(xq, koff, oh, ow, Wq, wp, K, O, bias, epf, grid, out):
    """A convolution (group 1) whose output rows are wide: each tile is up to 48 pixels of one output
    row, and the micro-kernel reads tap k of pixel (y, x) at koff[k] + y*Wq + x of the phase planes
    (`phase_split`) directly, with no panel copy (for the 3-channel stems the copy cost as much as the
    multiply). Weights whole (no k blocks): for layers whose K x O weights stay in L2."""
    nob = (O + OCB - 1) // OCB
    per_row = (ow + 47) // 48
    xf = xq.reshape(-1)
    P = oh * ow
    flags = (0, 1, grid)
    for j in prange(oh * per_row):
        y, r = j // per_row, j % per_row
        x0 = r * 48
        lanes = min(48, ow - x0)
        for ob in range(nob):
            o0 = ob * OCB
            _tile((lanes + 15) // 16, xf, y * Wq + x0, koff, wp, ob * K * OCB, K, out, o0 * P + y * ow + x0, P, lanes,
                  O - o0, bias[o0:], epf, flags)


def tap_offsets(cin, kh, kw, sh, sw, dh, dw, hq, wq) -> np.ndarray:
    """Tap (c, i, j)'s offset in the phase planes of `phase_split` (c, i*dh % sh, j*dw % sw), moved by
    (i*dh // sh, j*dw // sw)."""
    # per channel plus per tap (planned at every new input shape: a meshgrid of the three took ~0.1 ms)
    plane = hq * wq
    taps = [((i * dh) % sh * sw + (j * dw) % sw) * plane + (i * dh // sh) * wq + j * dw // sw
            for i in range(kh) for j in range(kw)]
    off = (np.arange(cin, dtype=np.int64) * (sh * sw * plane))[:, None] + np.array(taps, np.int64)[None, :]
    return off.reshape(-1)


def pack_weights(w: np.ndarray, block: int = OCB) -> np.ndarray:
    """(O, K) -> flat [O/block][K][block] float32, the rows past O zero."""
    return pack_stacked(w[None], block)


def pack_stacked(u: np.ndarray, block: int = OCB) -> np.ndarray:
    """(P, O, K) -> flat [P][O/block][K][block] float32 (P matrices packed one after the other, the
    layout of Winograd's positions, which winograd.transform_packed writes directly), rows past O zero:
    one strided copy into a cache-line aligned buffer, not a zero-padded copy and another."""
    p, o, k = u.shape
    nb, whole = -(-o // block), o // block
    out = aligned_empty(p * nb * k * block)
    v = out.reshape(p, nb, k, block)
    if whole:
        v[:, :whole] = u[:, :whole * block].reshape(p, whole, block, k).transpose(0, 1, 3, 2)
    if whole < nb:
        v[:, whole] = 0
        v[:, whole, :, :o - whole * block] = u[:, whole * block:].transpose(0, 2, 1)
    return out


def epilogue(act: int, grid, post=NO_POST) -> tuple:
    """epf for `gemm`: the activation bounds (ReLU's, ReLU6's), the fused activation `post` (kind,
    alpha, beta), then the int8 grid (grid = grid.grid_of tuple or NO_GRID)."""
    f32 = np.float32
    lo = f32(0) if act else f32(-np.inf)
    hi = f32(6) if act == 2 else f32(np.inf)
    return (lo, hi, f32(grid[0]), f32(grid[1]), f32(grid[2]), f32(grid[3]), f32(post[0]), f32(post[1]), f32(post[2]))


def epilogue_of(act: int, grid, post=NO_POST) -> tuple:
    """(epf, on_grid): what the IR kernels finish with, and 1 when they round to the int8 grid."""
    return epilogue(act, grid, post), 1 if grid[1] > 0 else 0


IDENTITY = epilogue(0, (1, 0, 0, 0))     # no activation, no grid: what a kernel leaves as it is


def tile_count(pixels: int) -> int:
    """The pixel tiles `gemm` and `conv_im2col` run for `pixels` output pixels."""
    return _tiles.py_func(pixels)[0]      # the Python function: a call through Numba's dispatcher cost ~10 us


def _shape_free_parts(weight: np.ndarray, bias: np.ndarray, act: int, grid, post) -> tuple:
    """PackedGemm's weights packed (packed_once), its bias padded to whole channel blocks, its epilogue."""
    o = weight.shape[0]
    padded = np.zeros(-(-o // OCB) * OCB, np.float32)
    padded[:o] = bias
    return (packed_once(pack_weights, weight), padded) + epilogue_of(act, grid, post)


class PackedGemm:
    """A convolution's weights packed for `gemm` (bias padded to whole tiles), its epilogue, and the
    walk that suits its pixel count, all decided at prepare."""

    def __init__(self, weight: np.ndarray, bias: np.ndarray, act: int, grid, pixels: int, threads: int,
                 post=NO_POST):
        o, k = weight.shape
        self.o, self.k, self.nob, self.pixels = o, k, -(-o // OCB), pixels
        # what the input shape does not change, kept per layer while the session plans (weight_cache.shape_free)
        self.wp, self.bias, self.epf, self.grid = shape_free(
            "PackedGemm", weight, (bias, grid, post), (act,), lambda: _shape_free_parts(weight, bias, act, grid, post))
        self.tiles = tile_count(pixels)
        self.kc = k_block(k, self.rows(), self.tiles)
        self.by_block = walk_by_block(k, pixels, o, threads)
        self.fn = fitted(gemm, self.rows() * pixels * k // 16, threads)

    def rows(self) -> int:
        return self.nob * OCB

    def __call__(self, x: np.ndarray, xs: int, out: np.ndarray, os_: int) -> None:
        """x flat with row k at k * xs; out flat, O rows of stride os_."""
        self.fn(x, xs, self.pixels, self.wp, self.k, self.kc, self.o, self.bias, self.epf, self.grid, out, os_,
                self.by_block)
