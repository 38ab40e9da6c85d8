"""fp32 GEMM for few pixels: output channels in the vector lanes, pixels broadcast.

`float_gemm` puts pixels in the lanes; a 7x7 map (49 pixels) then fills 49 of 64 lanes, and a Winograd
position of a 7x7 map (16 tiles) needs one broadcast weight per FMA, so both run at 60-80 GFLOP/s.
Here a tile is 32 output channels (two zmm of packed weights, [O/32][K][32]) x NP <= 8 pixels: per k
two weight loads, NP pixel broadcasts and 2*NP FMAs. 49 pixels are seven tiles of 7, 16 are two of 8.
k runs in blocks of 128 (a channel block's weights stay in L1) with the partial sums channels-last in
a small buffer; the last block adds the bias, applies the activation and int8 grid, transposes the
tile in registers and stores each channel's NP pixels into its NCHW row (masked past O). A block's first tile prefetches the next
block's weights, which come from memory.
"""
from __future__ import annotations

import numpy as np
from ..compile.jit import njit, prange, types, intrinsic

from .. import sized
from ..weight_cache import packed_once, shape_free
from .epilogue import NO_POST
from .float_gemm import epilogue_of, pack_weights
from .activation_ir import Finish
from .llvm_ir import columns_to_rows, data_of, declare, host_has, k_loop, prefetch, splat as splat_

OCB = 32
HAS_AVX512 = host_has("avx512f")


def _make_tile(np_: int):
    @intrinsic
    def tile(typingctx, x, xoff, xs, w, woff, nk, out, ooff, os_, rows, bias, boff, epf, on_grid, part, po, flags):
        """out[ooff + o*os_ + p] for o < min(32, rows), p < np_ = finish(bias[boff + o] + sum_k
        w[woff + 32k + o] x[xoff + k*xs + p]). With k in blocks, the sums so far live channels-last in
        `part` (pixel p's 32 at po + 32p): flags = (start from them, final: finish and store to out;
        else back to part)."""
        from llvmlite import ir
        sig = types.void(x, types.intp, types.intp, w, types.intp, types.intp, out, types.intp, types.intp,
                         types.intp, bias, types.intp, epf, types.intp, part, types.intp, flags)

        def codegen(context, builder, sig, args):
            xa, xo, xs_, wa, wo, nk_, oa, oo, ostr, rows_, ba, bo, epfa, grid_, pa, po_, fla = args
            i1, i32, i64, f32 = ir.IntType(1), ir.IntType(32), ir.IntType(64), ir.FloatType()
            f16 = ir.VectorType(f32, 16)
            a = sig.args
            xp = data_of(context, builder, a[0], xa, xo)
            wp = data_of(context, builder, a[3], wa, wo)
            op = data_of(context, builder, a[6], oa, oo)
            bp = data_of(context, builder, a[10], ba, bo)
            const = lambda v: ir.Constant(i64, v)   # noqa: E731
            fma = declare(builder, "llvm.fma.v16f32", f16, f16, f16, f16)
            zero = ir.Constant(f16, [0.0] * 16)
            pp = data_of(context, builder, a[14], pa, po_)
            part_at = lambda p, h: builder.bitcast(builder.gep(pp, [const(32 * p + 16 * h)]), f16.as_pointer())  # noqa: E731
            resume = builder.icmp_signed("!=", builder.extract_value(fla, 0), const(0))
            final = builder.icmp_signed("!=", builder.extract_value(fla, 1), const(0))
            start = builder.block
            load_b, first_b = builder.append_basic_block("resume"), builder.append_basic_block("begin")
            builder.cbranch(resume, load_b, first_b)
            builder.position_at_end(load_b)
            saved = [builder.load(part_at(p, h), align=4) for p in range(np_) for h in range(2)]
            builder.branch(first_b)
            builder.position_at_end(first_b)
            init = []
            for i in range(2 * np_):
                phi = builder.phi(f16)
                phi.add_incoming(zero, start)
                phi.add_incoming(saved[i], load_b)
                init.append(phi)

            ahead = builder.extract_value(fla, 2)

            def step(kk, accs):
                wrow = builder.gep(wp, [builder.mul(kk, const(OCB))])
                for h in range(2):      # the same k of the next channel block's weights (flags[2] on)
                    prefetch(builder, builder.gep(wrow, [builder.add(ahead, const(16 * h))]), 2)
                wv = [builder.load(builder.bitcast(builder.gep(wrow, [const(16 * h)]), f16.as_pointer()), align=4)
                      for h in range(2)]
                xrow = builder.gep(xp, [builder.mul(kk, xs_)])
                new = []
                for p in range(np_):
                    xb = splat_(builder, builder.load(builder.gep(xrow, [const(p)]), align=4), f16)
                    for h in range(2):
                        new.append(builder.call(fma, [wv[h], xb, accs[2 * p + h]]))
                return new
            result = k_loop(builder, nk_, init, step)
            keep_b, fin_b, end_b = (builder.append_basic_block(n) for n in ("keep", "finish", "end"))
            builder.cbranch(final, fin_b, keep_b)
            builder.position_at_end(keep_b)          # a partial sum: back to part, channels-last
            for p in range(np_):
                for h in range(2):
                    builder.store(result[2 * p + h], part_at(p, h), align=4)
            builder.branch(end_b)
            builder.position_at_end(fin_b)
            finish = Finish(builder, epfa, builder.icmp_signed("!=", grid_, const(0)))
            # channels back to rows: transpose 16 channels x np_ pixels in registers, then one masked
            # store of np_ pixels per channel row (a scatter per pixel cost 20% of the layer)
            f8, m8 = ir.VectorType(f32, 8), ir.VectorType(i1, 8)
            store8 = declare(builder, "llvm.masked.store.v8f32.p0", ir.VoidType(), f8, f8.as_pointer(), i32, m8)
            pixels, none8 = ir.Constant(m8, [1] * np_ + [0] * (8 - np_)), ir.Constant(m8, [0] * 8)
            for h in range(2):
                bv = builder.load(builder.bitcast(builder.gep(bp, [const(16 * h)]), f16.as_pointer()), align=4)
                rows = columns_to_rows(builder, finish.many([builder.fadd(result[2 * p + h], bv) for p in range(np_)]))
                for c, row in enumerate(rows):
                    chan = 16 * h + c
                    keep = builder.select(builder.icmp_signed("<", const(chan), rows_), pixels, none8)
                    at = builder.bitcast(builder.gep(op, [builder.mul(const(chan), ostr)]), f8.as_pointer())
                    builder.call(store8, [row, at, ir.Constant(i32, 4), keep])
            builder.branch(end_b)
            builder.position_at_end(end_b)
            return context.get_dummy_value()
        return sig, codegen
    return tile


_t1, _t2, _t3, _t4 = _make_tile(1), _make_tile(2), _make_tile(3), _make_tile(4)
_t5, _t6, _t7, _t8 = _make_tile(5), _make_tile(6), _make_tile(7), _make_tile(8)


@njit(cache=True, inline="always")
def _tile(n, x, xo, xs, w, wo, nk, out, oo, os_, rows, bias, bo, epf, grid, part, po, flags):
    if n == 8:
        _t8(x, xo, xs, w, wo, nk, out, oo, os_, rows, bias, bo, epf, grid, part, po, flags)
    elif n == 7:
        _t7(x, xo, xs, w, wo, nk, out, oo, os_, rows, bias, bo, epf, grid, part, po, flags)
    elif n == 6:
        _t6(x, xo, xs, w, wo, nk, out, oo, os_, rows, bias, bo, epf, grid, part, po, flags)
    elif n == 5:
        _t5(x, xo, xs, w, wo, nk, out, oo, os_, rows, bias, bo, epf, grid, part, po, flags)
    elif n == 4:
        _t4(x, xo, xs, w, wo, nk, out, oo, os_, rows, bias, bo, epf, grid, part, po, flags)
    elif n == 3:
        _t3(x, xo, xs, w, wo, nk, out, oo, os_, rows, bias, bo, epf, grid, part, po, flags)
    elif n == 2:
        _t2(x, xo, xs, w, wo, nk, out, oo, os_, rows, bias, bo, epf, grid, part, po, flags)
    else:
        _t1(x, xo, xs, w, wo, nk, out, oo, os_, rows, bias, bo, epf, grid, part, po, flags)


@njit(cache=True, inline="always")
def pixel_step(P):
    """Pixels per tile: 7 for 49 (seven tiles), else 8 with a narrower last tile."""
    return 7 if P % 7 == 0 and P % 8 != 0 else 8


K_BLOCK = 128     # k per pass: a channel block's weights (32 x 128) stay in L1 while its tiles use them


@njit(parallel=True, cache=True)
def ocgemm(x, xs, xstride, P, wp, wstride, K, O, bias, epf, grid, out, os_, ostride, batches):
    """`batches` GEMMs (one for a convolution, the positions for Winograd): out[b][o, p] (row stride
    os_) = finish(bias[o] + sum_k wp_b[o, k] x_b[k, p]); x_b row k at b*xstride + k*xs, weights of
    batch b at b*wstride packed by `pack32`, out_b at b*ostride. k runs in blocks of K_BLOCK, the
    partial sums of a (batch, channel block) kept channels-last in a buffer of its own."""
    nob = (O + OCB - 1) // OCB
    step = pixel_step(P)
    for j in prange(batches * nob):
        b, ob = j // nob, j % nob
        o0 = ob * OCB
        part = np.empty(P * OCB, np.float32)
        for k0 in range(0, K, K_BLOCK):
            kn = min(K_BLOCK, K - k0)
            for p0 in range(0, P, step):
                # the first tile also asks for the next channel block's weights (they come from memory)
                ahead = K * OCB if p0 == 0 and ob + 1 < nob else 0
                flags = (1 if k0 > 0 else 0, 1 if k0 + kn >= K else 0, ahead)
                _tile(min(step, P - p0), x, b * xstride + k0 * xs + p0, xs, wp, b * wstride + ob * K * OCB + k0 * OCB,
                      kn, out, b * ostride + o0 * os_ + p0, os_, O - o0, bias, o0, epf, grid, part, p0 * OCB, flags)


def pack32(w: np.ndarray) -> np.ndarray:
    """(O, K) -> flat [O/32][K][32] float32, the rows past O zero."""
    return pack_weights(w, OCB)


def suits(pixels: int, weight_bytes: int) -> bool:
    """Where this kernel beat `float_gemm` (measured, 1 thread): pixel counts that leave float_gemm's 16-pixel
    vectors part empty (49: 98-112 vs 78 GFLOP/s), and 16 pixels when the weights (per GEMM) pass L2
    (a 7x7 map's Winograd positions at 512 channels: 82 vs 65 GFLOP/s; at 256, float_gemm's 108 wins)."""
    # callers are AVX-512 strategies, offered by `conv_strategies.pick` only where the host has it
    if pixels > 64:
        return False
    return pixels % 16 != 0 or (pixels == 16 and weight_bytes > 512 * 1024)


def _shape_free_parts(weight: np.ndarray, bias: np.ndarray, act: int, grid, post) -> tuple:
    """OcGemm's weights packed (packed_once), its bias padded to whole channel blocks, its epilogue."""
    o, k = weight.shape
    wp = packed_once(pack32, weight)
    padded = np.zeros(wp.size // k, np.float32)
    padded[:o] = bias
    return (wp, padded) + epilogue_of(act, grid, post)


class OcGemm:
    """A convolution's weights packed for `few_pixel_gemm`, with its epilogue; called like float_gemm.PackedGemm."""

    def __init__(self, weight: np.ndarray, bias: np.ndarray, act: int, grid, pixels: int, threads: int,
                 post=NO_POST):
        o, k = weight.shape
        self.o, self.k, self.pixels = o, k, pixels
        # shared by the plans of every input shape (weight_cache.shape_free)
        self.wp, self.bias, self.epf, self.grid = shape_free(
            "OcGemm", weight, (bias, grid, post), (act,), lambda: _shape_free_parts(weight, bias, act, grid, post))
        self.fn = sized(ocgemm, o * k * pixels // 16, threads)

    def __call__(self, x: np.ndarray, xs: int, out: np.ndarray, os_: int) -> None:
        """x flat with row k at k * xs; out flat, O rows of stride os_."""
        self.fn(x, xs, 0, self.pixels, self.wp, 0, self.k, self.o, self.bias, self.epf, self.grid, out, os_, 0, 1)
