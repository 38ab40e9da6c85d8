"""Batch-1 fully connected layer (a 1x1 convolution on a 1x1 map: squeeze-excite FCs, classifier heads) with 16
outputs in the vector lanes, as AVX-512 LLVM IR.

float_gemv.MatVec reads 16 weight rows side by side (16 streams) and sums each row's 16 partial sums by a
transposing add tree per block; its activation past ReLU (an SE block's sigmoid, a SiLU) ran as a pass of
its own. In a model's run those layers cost 2-3x onnxruntime's: HGNetV2-B0's head (1024 -> 2048 and
2048 -> 1000, 16 MB of weights) 1.17 ms against 0.70, an SE block's 48 -> 1152 with its sigmoid 22 us
(14 warm) against ~10. Here the weights are packed at build as (ceil(cout/16), cin, 16): one sequential
stream, each 64-byte line one FMA with the input value broadcast from memory, four chains per block of 16
outputs (their sum the result: no transposing tree), prefetched PREFETCH_LINES ahead, and the convolution
epilogue (bias, ReLU bounds, fused activation, int8 grid) on the 16 sums before one masked store.
"""
from __future__ import annotations

import numpy as np

from ..compile.jit import intrinsic, njit, prange, types

from .activation_ir import Finish
from .llvm_ir import data_of, first_lanes, prefetch, vector_ops

CHAINS = 4              # FMA chains a block (latency 4, one FMA a cycle: four keep it busy)
PREFETCH_LINES = 64     # weight lines (one per input value) read ahead of the FMAs: 4 KB, ~the bytes in flight
                        # from L3 or memory (1024 -> 2048 from L3, us: 16 lines 273, 48 204, 128 196)


@intrinsic
def _block(typingctx, wp, wo, x, k, bias, bo, out, oo, n, epf, on_grid):
    """out[oo + i] = finish(bias[bo + i] + sum_j wp[wo + 16*j + i] * x[j]) for i < n (n <= 16), j < k."""
    from llvmlite import ir
    ip = types.intp
    sig = types.void(wp, ip, x, ip, bias, ip, out, ip, ip, epf, ip)

    def codegen(context, builder, sig, args):
        wa, wo_, xa, k_, ba, bo_, oa, oo_, n_, epfa, grid_ = args
        i32, i64, f32 = ir.IntType(32), ir.IntType(64), ir.FloatType()
        f16 = ir.VectorType(f32, 16)
        vp = f16.as_pointer()
        a = sig.args
        w = builder.bitcast(data_of(context, builder, a[0], wa, wo_), vp)
        xp = data_of(context, builder, a[2], xa)
        bp = data_of(context, builder, a[4], ba, bo_)
        op = data_of(context, builder, a[6], oa, oo_)
        const = lambda v: ir.Constant(i64, v)   # noqa: E731
        fma, mload, mstore = vector_ops(builder)
        zero = ir.Constant(f16, [0.0] * 16)
        undef = ir.Constant(f16, ir.Undefined)
        splat_mask = ir.Constant(ir.VectorType(i32, 16), [0] * 16)

        def tap(j, acc):
            xv = builder.insert_element(undef, builder.load(builder.gep(xp, [j])), ir.Constant(i32, 0))
            xv = builder.shuffle_vector(xv, undef, splat_mask)
            return builder.call(fma, [builder.load(builder.gep(w, [j]), align=4), xv, acc])

        # the main loop: CHAINS values a step, each into its own chain
        steps = builder.sdiv(k_, const(CHAINS))
        entry = builder.block
        loop, done = builder.append_basic_block("mv"), builder.append_basic_block("mv_done")
        builder.cbranch(builder.icmp_signed(">", steps, const(0)), loop, done)
        builder.position_at_end(loop)
        s = builder.phi(i64)
        s.add_incoming(const(0), entry)
        accs = []
        for _ in range(CHAINS):
            phi = builder.phi(f16)
            phi.add_incoming(zero, entry)
            accs.append(phi)
        j0 = builder.mul(s, const(CHAINS))
        for c in range(CHAINS):
            prefetch(builder, builder.gep(w, [builder.add(j0, const(PREFETCH_LINES + c))]))
        new = [tap(builder.add(j0, const(c)), accs[c]) for c in range(CHAINS)]
        nxt = builder.add(s, const(1))
        s.add_incoming(nxt, builder.block)
        for acc, v in zip(accs, new):
            acc.add_incoming(v, builder.block)
        builder.cbranch(builder.icmp_signed("<", nxt, steps), loop, done)
        builder.position_at_end(done)
        sums = []
        for c in range(CHAINS):
            phi = builder.phi(f16)
            phi.add_incoming(zero, entry)
            phi.add_incoming(new[c], loop)
            sums.append(phi)
        # the last k % CHAINS values
        total = builder.fadd(builder.fadd(sums[0], sums[1]), builder.fadd(sums[2], sums[3]))
        for r in range(CHAINS - 1):
            j = builder.add(builder.mul(steps, const(CHAINS)), const(r))
            has = builder.icmp_signed("<", j, k_)
            safe = builder.select(has, j, const(0))
            total = builder.select(has, tap(safe, total), total)
        keep = first_lanes(builder, n_)
        bv = builder.call(mload, [builder.bitcast(bp, vp), ir.Constant(i32, 4), keep, zero])
        fin = Finish(builder, epfa, builder.icmp_signed("!=", grid_, const(0)))(builder.fadd(total, bv))
        builder.call(mstore, [fin, builder.bitcast(op, vp), ir.Constant(i32, 4), keep])
        return context.get_dummy_value()
    return sig, codegen


@njit(parallel=True, cache=True)
def matvec_lanes(wp, x, bias, epf, grid, chunks, out):
    """out (cout,) = finish(wp . x + bias): wp (ceil(cout/16), cin, 16) from `pack`, x (cin,), bias (cout,);
    `chunks` workers each take a contiguous run of the 16-output blocks."""
    nb, k = wp.shape[0], wp.shape[1]
    cout = out.shape[0]
    wf = wp.reshape(-1)
    for ch in prange(chunks):
        for b in range(ch * nb // chunks, (ch + 1) * nb // chunks):
            _block(wf, b * k * 16, x, k, bias, 16 * b, out, 16 * b, min(16, cout - 16 * b), epf, grid)


def pack(weight: np.ndarray) -> np.ndarray:
    """(cout, cin) weights -> (ceil(cout/16), cin, 16) on a cache line, 16 outputs in the lanes (zeros past
    cout): kernels.aligned_lanes, the packing depthwise_lanes' channels share."""
    from .. import aligned_lanes
    return aligned_lanes(weight)
