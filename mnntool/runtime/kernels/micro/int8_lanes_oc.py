"""The int8 GEMM with output channels in the vector lanes: for maps whose pixels fill int8_gemm's 16-pixel
blocks badly.

int8_gemm's tile puts 16 pixels in a zmm's lanes, so a 7x7 map (49 pixels) fills 49 of 64 lanes and a 14x14
map read from the grid 196 of 224: ResNet-18's last stage and RepVGG-A0's 14x14 stage ran at 77% and 88%
of the VNNI rate. Here a tile is 7 pixels x 32 output channels: each pixel's 4 bytes broadcast, two
vectors of 16 channels' weights, 14 accumulators of VPDPBUSD; 7 divides 49, 196, 784 and 3136, so those
maps fill every lane. The pixels' words come from anywhere (`pix`[p] + offs[k]: the quantized grid in
planes, int8_conv.quantize_planes, or im2col-style blocks), so no pixel past the output is computed.
The epilogue rescales each accumulator exactly as int8_gemm._store_ir does (the same float32 steps,
per lane the channel's scale and bias), then transposes 7 (+1) pixel vectors to 16 channel rows of 8
and stores each row's pixels: the output bytes equal int8_gemm's (the integer accumulator is the same).
"""
from __future__ import annotations

import numpy as np
from ..compile.jit import njit, prange, types, intrinsic

from .int8_gemm import EP_ROWS, NO_TABLE, EpilogueIR, lut_bytes
from .llvm_ir import data_of, declare, k_loop, splat as splat_

PIXT, OCT = 7, 32           # tile: pixels x output channels (two vectors of 16)
assert EP_ROWS % OCT == 0       # int8_gemm.Int8Weights' epilogue rows hold whole tiles of this kernel


def lane_fill(pixels: int, oc: int) -> float:
    """The share of this kernel's (pixel, channel) slots that are outputs."""
    return pixels / (PIXT * -(-pixels // PIXT)) * oc / (OCT * -(-oc // OCT))


def pack_weights(wq: np.ndarray) -> np.ndarray:
    """(OC, K) int8, K a multiple of 4 -> flat [OC/16][K/4][16][4], OC padded to whole tiles with zeros."""
    oc, k = wq.shape
    rows = -(-oc // OCT) * OCT
    full = np.zeros((rows, k), np.int8)
    full[:oc] = wq
    return np.ascontiguousarray(full.reshape(rows // 16, 16, k // 4, 4).transpose(0, 2, 1, 3)).reshape(-1)


def _transpose_ir(builder, vecs):
    """8 <16 x float> (pixel j, lanes = channels) -> 16 <8 x float> (channel c, lanes = pixels), in three
    stages of two-source shuffles (pairs, groups of four, of eight)."""
    from llvmlite import ir
    i32 = ir.IntType(32)

    def shuf(a, b, idx):
        return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(i32, len(idx)), idx))
    # stage 1: (V_j, V_j+1) -> per channel c the pair (V_j[c], V_j+1[c]); lo holds c < 8, hi c >= 8
    a = [(shuf(vecs[j], vecs[j + 1], [x for c in range(8) for x in (c, 16 + c)]),
          shuf(vecs[j], vecs[j + 1], [x for c in range(8, 16) for x in (c, 16 + c)])) for j in range(0, 8, 2)]
    # stage 2: pairs of (0,1) and (2,3) -> per channel four pixels; four channels a vector
    b = []
    for g in (0, 2):
        parts = []
        for half in (0, 1):
            x, y = a[g][half], a[g + 1][half]
            for cb in (0, 4):
                parts.append(shuf(x, y, [e for c in range(cb, cb + 4) for e in (2 * c, 2 * c + 1, 16 + 2 * c,
                                                                                   17 + 2 * c)]))
        b.append(parts)         # 4 vectors: channels 0-3, 4-7, 8-11, 12-15, each 4 x 4 pixels
    rows = []
    for q in range(4):
        x, y = b[0][q], b[1][q]
        for cb in (0, 2):
            v = shuf(x, y, [e for c in range(cb, cb + 2) for e in [4 * c + i for i in range(4)]
                            + [16 + 4 * c + i for i in range(4)]])
            rows.append(shuf(v, v, list(range(8))))
            rows.append(shuf(v, v, list(range(8, 16))))
    return rows


@intrinsic
def _tile_oc(typingctx, x, pix, p0, offs, w, woff, k4, out, ooff, ostride, npix, rows, ep, epf, tab):
    """out[o, p] for 7 pixels (from p0; their words at x[pix[p0 + j] + offs[k]]) x 32 channels (weights
    at w[woff:], pack_weights), `npix` of the pixels and `rows` of the channels valid; ep = (scale, bias)
    from the tile's first channel (whole vectors readable), epf and tab as int8_gemm._tile's."""
    from llvmlite import ir
    sig = types.void(x, pix, types.intp, offs, w, types.intp, types.intp, out, types.intp, types.intp, types.intp,
                     types.intp, ep, epf, tab)

    def codegen(context, builder, sig, args):
        xa, pa, p0_, fa, wa, wo, nk, oa, oo, os_, np_, rows_, epa, epfa, taba = args
        a = sig.args
        i1, i8, i32, i64, f32 = ir.IntType(1), ir.IntType(8), ir.IntType(32), ir.IntType(64), ir.FloatType()
        v16, f16, f8 = ir.VectorType(i32, 16), ir.VectorType(f32, 16), ir.VectorType(f32, 8)
        const = lambda v: ir.Constant(i64, v)   # noqa: E731
        xp = data_of(context, builder, a[0], xa)
        pp = data_of(context, builder, a[1], pa, p0_)
        fp = data_of(context, builder, a[3], fa)
        wp = data_of(context, builder, a[4], wa, wo)
        op = data_of(context, builder, a[7], oa, oo)
        tp = data_of(context, builder, a[14], taba)
        dpbusd = declare(builder, "llvm.x86.avx512.vpdpbusd.512", v16, v16, v16, v16)
        # a pixel past the valid ones reads the last valid one's words (its results are not stored)
        last = builder.sub(np_, const(1))
        bases = [builder.load(builder.gep(pp, [builder.select(builder.icmp_signed("<", const(j), np_), const(j),
                                                              last)])) for j in range(PIXT)]
        xw = builder.bitcast(xp, i32.as_pointer())

        def step(kk, accs):
            off = builder.load(builder.gep(fp, [kk]))
            wv = [builder.load(builder.bitcast(builder.gep(wp, [builder.mul(builder.add(builder.mul(const(b), nk), kk),
                                                                             const(64))]), v16.as_pointer()), align=1)
                  for b in range(2)]
            new = list(accs)
            for j in range(PIXT):
                xb = splat_(builder, builder.load(builder.gep(xw, [builder.add(bases[j], off)]), align=4), v16)
                for b in range(2):
                    new[b * PIXT + j] = builder.call(dpbusd, [accs[b * PIXT + j], xb, wv[b]])
            return new
        accs = k_loop(builder, nk, [ir.Constant(v16, [0] * 16)] * (2 * PIXT), step)

        fn = lambda name, ret, *t: declare(builder, name, ret, *t)  # noqa: E731
        mstore = fn("llvm.masked.store.v8f32.p0", ir.VoidType(), f8, f8.as_pointer(), i32, ir.VectorType(i1, 8))
        ept = [builder.extract_value(epa, k) for k in range(2)]
        erows = [data_of(context, builder, a[12].types[k], ept[k]) for k in range(2)]
        vec_at = lambda base, b: builder.load(builder.bitcast(builder.gep(base, [const(16 * b)]),  # noqa: E731
                                                              f16.as_pointer()), align=4)
        ep = EpilogueIR(builder, epfa)
        bits = builder.sub(builder.shl(const(1), np_), const(1))
        pmask = builder.bitcast(builder.trunc(bits, i8), ir.VectorType(i1, 8))
        none = ir.Constant(ir.VectorType(i1, 8), [0] * 8)

        def store(looked_up):
            for b in range(2):
                sc, bi = vec_at(erows[0], b), vec_at(erows[1], b)      # per lane its channel's
                vals, idx = [], []
                for j in range(PIXT):
                    val, q = ep.rescaled(accs[b * PIXT + j], sc, bi)
                    if looked_up:
                        idx.append(ep.index(q))
                    else:
                        vals.append(ep.value(val, q))
                if looked_up:
                    idx.append(idx[-1])
                    vals = lut_bytes(builder, tp, idx[:4], ep.z_t, ep.s_t) + lut_bytes(builder, tp, idx[4:], ep.z_t,
                                                                                       ep.s_t)
                else:
                    vals.append(vals[-1])
                for c, row in enumerate(_transpose_ir(builder, vals)):
                    o = 16 * b + c
                    live = builder.select(builder.icmp_signed("<", const(o), rows_), pmask, none)
                    dst = builder.bitcast(builder.gep(op, [builder.mul(const(o), os_)]), f8.as_pointer())
                    builder.call(mstore, [row, dst, ir.Constant(i32, 4), live])
        ep.branches(store)
        return context.get_dummy_value()
    return sig, codegen


@njit(parallel=True, cache=True)
def gemm_oc(x, pix, offs, wt, k4, oc, ep, epf, out, tab):
    """out (OC, P) float: tiles of 7 pixels x 32 channels (_tile_oc), pixel p's word k at x[pix[p] + offs[k]];
    wt from pack_weights; ep = (scale, bias) rows padded to whole tiles; tab: see int8_gemm._tile."""
    P = out.shape[1]
    npt, nob = (P + PIXT - 1) // PIXT, (oc + OCT - 1) // OCT
    of = out.reshape(-1)
    scale, bias = ep
    for t in prange(nob * npt):
        ob, pt = t // npt, t % npt
        o0, p0 = ob * OCT, pt * PIXT
        _tile_oc(x, pix, p0, offs, wt, ob * 2 * k4 * 64, k4, of, o0 * P + p0, P, min(PIXT, P - p0), oc - o0,
                 (scale[o0:], bias[o0:]), epf, tab)


class OcLanesWeights:
    """An int8_gemm.Int8Weights' weights packed for this tile too (pack_weights), sharing its epilogue rows."""

    def __init__(self, base, wq: np.ndarray, work: int, threads: int):
        from .. import sized
        self.base, self.data = base, pack_weights(wq)
        self.gemm = sized(gemm_oc, work, threads)

    def matmul(self, x: np.ndarray, pix: np.ndarray, offs: np.ndarray, epf: tuple, out: np.ndarray,
               tab: np.ndarray = NO_TABLE) -> None:
        """out (OC, P) float32: pixel p's word k at x[pix[p] + offs[k]]."""
        b = self.base
        self.gemm(x, pix, offs, self.data, b.k4, b.oc, b.ep, epf, out, tab)
