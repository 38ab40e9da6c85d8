"""Quantized weights in a row-interleaved layout, for the decode GEMV and the prefill GEMM alike.

The file stores a linear layer row by row (4 bits: two values a byte, high nibble first). Here the same
stored values (not requantized, not widened) are rearranged once at load into groups of 16 output rows:

    packed[g][c][r]   a 32-bit word holding KC consecutive input channels of row 16g + r
                      (u4: 8 values, u8: 4), so that one 64-byte load brings KC channels of 16 rows

and inside the word the values sit so that a shift and a mask give int16 pairs (channels 2j, 2j+1 of
each row) for vpmaddwd:
    u4   channel 2j in bits 4j..4j+3, channel 2j+1 in bits 16+4j..      (v_j = (word >> 4j) & 0x000F000F)
    u8   channel 2j in byte j, channel 2j+1 in byte j+2                  (v_j = (word >> 8j) & 0x00FF00FF)
The input is quantized per block of the weights to int16 (xq = round(x / sx), |xq| <= qmax), its pairs
read as one 32-bit word broadcast to the 16 lanes; each lane accumulates one row in int32, and per
block the sums become float once for 16 rows:
    y[rows] += float(acc) * (scale[b, rows] * sx[b]) + offset[b, rows] * sum(x_b)
(offset = zero - 2^(bits-1) * scale, weights.py). A tile is M tokens x 16 rows: the unpacked weights
are used M times, so the same kernel is the GEMV (M = 1, 4 accumulators for the latency) and the GEMM.
The only approximation is the input's rounding: 1 / (2 qmax) of each block's largest |x| (1.5e-5).

With AVX-512 VNNI (VNNI below) the same words feed vpdpbusd: a mask (and one shift for 4 bits) gives the
codes as unsigned bytes, 4 channels a lane, and the int16 input is stored split into signed bytes,
x = 256 x_high + x_low (|x| <= 32639), so that sum(w x) = 256 sum(w x_high) + sum(w x_low) is the same
integer: the outputs equal the vpmaddwd tiles' at the same qmax, from half the instructions.
"""
from __future__ import annotations

import numpy as np

from ...runtime.kernels.compile.jit import intrinsic, njit, prange, types
from ...runtime.kernels.micro.llvm_ir import data_of, first_lanes, host_has, k_loop, prefetch, splat, vector_ops
from .steps import _norm_row

LANES = 16
KC = {4: 8, 8: 4}               # channels per 32-bit word
NO_VNNI = False                 # tests flip it (before a PackedLinear is made): the vpmaddwd tiles on a VNNI host
GEMM_CHUNK = 2                  # groups of rows per scheduling chunk of the GEMM at > 1 thread
TOKENS = 6                      # tokens per GEMM tile (6 int32 + 6 float accumulators + 4 unpacked weights)
GEMM_PARALLEL_MIN = 1 << 18    # tokens x packed words below which the GEMM runs serially at any thread count
TOKEN_BLOCK = 10 * TOKENS       # tokens per GEMM work item (x 16 rows): 60 x 4864 int16 inputs = 580 KB


# ------------------------------------------------------------------------------------------ packing

def _nibble_table() -> np.ndarray:
    """byte (high nibble = even channel, low = odd) -> its two channels in a packed word's slots 0."""
    b = np.arange(256, dtype=np.uint32)
    return ((b >> 4) | ((b & 15) << 16)).astype(np.uint32)


NIBBLES = _nibble_table()


@njit(cache=True, inline="always")
def _compress(x):
    """four bytes each holding a nibble (bytes 0..3) -> the nibbles side by side in bits 0..15."""
    x = (x | (x >> np.uint32(4))) & np.uint32(0x00FF00FF)
    return (x | (x >> np.uint32(8))) & np.uint32(0x0000FFFF)


@njit(parallel=True, cache=True)
def pack_u4(codes, oc, ic, table, out):
    """codes (oc, ic/2) as the file stores them -> out (G, ic/8, 16) uint32 (rows past oc: zero).
    Four bytes b0..b3 (channels 8c..8c+7, high nibble first) read as one little-endian word v: the
    even channels are v's high nibbles, the odd ones its low nibbles."""
    G = out.shape[0]
    nc = ic // 8
    m = np.uint32(0x0F0F0F0F)
    for g in prange(G):
        n = min(LANES, oc - g * LANES)
        for lane in range(LANES):
            if lane >= n:
                for c in range(nc):
                    out[g, c, lane] = 0
                continue
            row = codes[g * LANES + lane]
            for c in range(nc):
                j = c * 4
                v = (np.uint32(row[j]) | (np.uint32(row[j + 1]) << np.uint32(8)) | (np.uint32(row[j + 2]) << np.uint32(16))
                     | (np.uint32(row[j + 3]) << np.uint32(24)))
                out[g, c, lane] = _compress((v >> np.uint32(4)) & m) | (_compress(v & m) << np.uint32(16))


@njit(parallel=True, cache=True)
def pack_u8(codes, oc, ic, table, out):
    """codes (oc, ic) -> out (G, ic/4, 16) uint32: channels 4c, 4c+1, 4c+2, 4c+3 in bytes 0, 2, 1, 3."""
    G = out.shape[0]
    nc = ic // 4
    for g in prange(G):
        n = min(LANES, oc - g * LANES)
        for c in range(nc):
            for lane in range(n):
                r = g * LANES + lane
                b0 = np.uint32(codes[r, 4 * c])
                b1 = np.uint32(codes[r, 4 * c + 1])
                b2 = np.uint32(codes[r, 4 * c + 2])
                b3 = np.uint32(codes[r, 4 * c + 3])
                out[g, c, lane] = b0 | (b2 << 8) | (b1 << 16) | (b3 << 24)
            for lane in range(n, LANES):
                out[g, c, lane] = 0


def pack_blocks(a: np.ndarray, G: int) -> np.ndarray:
    """(oc, nb) per-row block values -> (G, nb, 16), rows past oc zero."""
    oc, nb = a.shape
    out = np.zeros((G * LANES, nb), np.float32)
    out[:oc] = a
    return np.ascontiguousarray(out.reshape(G, LANES, nb).transpose(0, 2, 1))


# --------------------------------------------------------------------------------------- the kernel

def _make_tile(bits: int, M: int, NG: int = 1, ahead: int = 0, vnni: bool = False):
    """The M-token x 16-row tile. ahead > 0: each 64-byte load of packed words prefetches (into L1) the
    line `ahead` bytes on in the same stream (the GEMV, which reads every weight once: see PREFETCH).
    vnni: the input split into bytes (quantize_row's vnni layout) and vpdpbusd (see VNNI)."""
    kc = KC[bits]
    pairs = kc // 2
    shift, mask = (4, 0x000F000F) if bits == 4 else (8, 0x00FF00FF)
    A = pairs if M == 1 else 1          # accumulators per token (M = 1: independent chains)
    P = 2 if bits == 4 else 1           # vnni: byte vectors per word (u4: low and high nibbles)
    U = 2 if M == 1 else 1              # vnni: words per step (a block's words must be a multiple: vnni_suits)
    if vnni:
        mask = 0x0F0F0F0F
        A = 2 * U * P if M == 1 else 2  # (U words a step) x (low, high input bytes) x parts; M > 1: low, high

    def tile(typingctx, w, wo, nchunks, blk, s, so, off, xq, xqo, xqs, sx, sxo, sxs, xs, out, oo, os_, mtok, nrows):
        """out[t*os_ + oo + 16*q + lane] (lanes < nrows - 16*q, tokens t < mtok <= M) for NG groups q of 16
        rows, each over nchunks words: w words from wo (the next group nchunks*16 words on), s/off (nb, 16)
        per group from so; xq token t's int16 at xqo + t*xqs; sx/xs token t's blocks at sxo + t*sxs."""
        from llvmlite import ir
        sig = types.void(w, types.intp, types.intp, types.intp, s, types.intp, off, xq, types.intp, types.intp,
                         sx, types.intp, types.intp, xs, out, types.intp, types.intp, types.intp, types.intp)

        def codegen(context, builder, sig, args):
            from ...runtime.kernels.micro.llvm_ir import declare
            (wa, wo_, nch, blk_, sa, so_, offa, xqa, xqo_, xqs_, sxa, sxo_, sxs_, xsa, oa, oo_, os__, mt, nr) = args
            i32, i64, f32 = ir.IntType(32), ir.IntType(64), ir.FloatType()
            i16v, f16v, w32 = ir.VectorType(i32, LANES), ir.VectorType(f32, LANES), ir.VectorType(ir.IntType(16), 32)
            fma, _, mstore = vector_ops(builder)
            madd = declare(builder, "llvm.x86.avx512.pmaddw.d.512", i16v, w32, w32)
            dpb = declare(builder, "llvm.x86.avx512.vpdpbusd.512", i16v, i16v, i16v, i16v) if vnni else None
            const = lambda v: ir.Constant(i64, v)   # noqa: E731
            nb = builder.sdiv(builder.mul(nch, const(kc)), blk_)
            wps, sps, ops_, outs = [], [], [], []
            for q in range(NG):
                wps.append(data_of(context, builder, sig.args[0], wa, builder.add(wo_, builder.mul(const(q * LANES), nch))))
                at = builder.add(so_, builder.mul(const(q * LANES), nb))
                sps.append(data_of(context, builder, sig.args[4], sa, at))
                ops_.append(data_of(context, builder, sig.args[6], offa, at))
                outs.append(data_of(context, builder, sig.args[14], oa, builder.add(oo_, const(q * LANES))))
            xqp = builder.bitcast(data_of(context, builder, sig.args[7], xqa, xqo_), i32.as_pointer())
            sxp = data_of(context, builder, sig.args[10], sxa, sxo_)
            xsp = data_of(context, builder, sig.args[13], xsa, sxo_)
            zero, izero = ir.Constant(f16v, [0.0] * LANES), ir.Constant(i16v, [0] * LANES)
            maskv = ir.Constant(i16v, [mask] * LANES)
            live = [builder.icmp_signed("<", const(m), mt) for m in range(M)]
            # tokens past mtok read token 0 again (in bounds) and are never stored
            tok = [builder.select(live[m], const(m), const(0)) for m in range(M)]
            xrow = [builder.gep(xqp, [builder.sdiv(builder.mul(tok[m], xqs_), const(2))]) for m in range(M)]
            sxrow = [builder.mul(tok[m], sxs_) for m in range(M)]
            per_block = builder.sdiv(blk_, const(kc))
            per_group = M * A

            def block(b, tots):
                c0 = builder.mul(b, per_block)

                def step_vnni(cc, flat):
                    # one step: U words (M = 1: two, for twice the independent accumulator chains)
                    new = list(flat)
                    for u in range(U):
                        c = builder.add(c0, builder.add(builder.mul(cc, const(U)), const(u)))
                        base = builder.mul(c, const(pairs))
                        xb = [[splat(builder, builder.load(builder.gep(xrow[m], [builder.add(base, const(j))]), align=2), i16v)
                               for j in range(pairs)] for m in range(M)]
                        for q in range(NG):
                            at_w = builder.gep(wps[q], [builder.mul(c, const(LANES))])
                            if ahead:
                                prefetch(builder, builder.gep(at_w, [const(ahead // 4)]), 3)
                            word = builder.load(builder.bitcast(at_w, i16v.as_pointer()), align=4)
                            parts = [word] if bits == 8 else \
                                [builder.and_(word, maskv), builder.and_(builder.lshr(word, ir.Constant(i16v, [4] * LANES)), maskv)]
                            for m in range(M):
                                for lh in range(2):
                                    for p_ in range(P):
                                        at = q * per_group + m * A + ((u * 2 + lh) * P + p_ if M == 1 else lh)
                                        new[at] = builder.call(dpb, [new[at], parts[p_], xb[m][lh * P + p_]])
                    return new

                def step(cc, flat):
                    c = builder.add(c0, cc)
                    base = builder.mul(c, const(pairs))
                    xb = [[builder.bitcast(splat(builder, builder.load(builder.gep(xrow[m], [builder.add(base, const(j))]),
                                                                       align=2), i16v), w32)
                           for j in range(pairs)] for m in range(M)]
                    new = list(flat)
                    for q in range(NG):
                        at_w = builder.gep(wps[q], [builder.mul(c, const(LANES))])
                        if ahead:
                            prefetch(builder, builder.gep(at_w, [const(ahead // 4)]), 3)
                        word = builder.load(builder.bitcast(at_w, i16v.as_pointer()), align=4)
                        unpacked = []
                        for j in range(pairs):
                            v = builder.lshr(word, ir.Constant(i16v, [shift * j] * LANES)) if j else word
                            unpacked.append(builder.bitcast(builder.and_(v, maskv), w32))
                        for m in range(M):
                            for j in range(pairs):
                                at = q * per_group + m * A + j % A
                                new[at] = builder.add(new[at], builder.call(madd, [unpacked[j], xb[m][j]]))
                    return new

                if vnni:
                    flat = k_loop(builder, builder.sdiv(per_block, const(U)), [izero] * (NG * per_group), step_vnni)
                else:
                    flat = k_loop(builder, per_block, [izero] * (NG * per_group), step)
                out = list(tots)
                sxb = [builder.load(builder.gep(sxp, [builder.add(sxrow[m], b)])) for m in range(M)]
                xsb = [builder.load(builder.gep(xsp, [builder.add(sxrow[m], b)])) for m in range(M)]
                for q in range(NG):
                    svec = builder.load(builder.bitcast(builder.gep(sps[q], [builder.mul(b, const(LANES))]), f16v.as_pointer()), align=4)
                    ovec = builder.load(builder.bitcast(builder.gep(ops_[q], [builder.mul(b, const(LANES))]), f16v.as_pointer()), align=4)
                    for m in range(M):
                        if vnni:        # sum(w x) = 256 sum(w x_high) + sum(w x_low), in int32 (wrapping: exact)
                            lo = hi = None
                            for k in range(A):
                                lh = (k // P) % 2 if M == 1 else k
                                v = flat[q * per_group + m * A + k]
                                if lh:
                                    hi = v if hi is None else builder.add(hi, v)
                                else:
                                    lo = v if lo is None else builder.add(lo, v)
                            acc = builder.add(builder.shl(hi, ir.Constant(i16v, [8] * LANES)), lo)
                        else:
                            acc = flat[q * per_group + m * A]
                            for k in range(1, A):
                                acc = builder.add(acc, flat[q * per_group + m * A + k])
                        i = q * M + m
                        t = builder.call(fma, [builder.sitofp(acc, f16v), builder.fmul(svec, splat(builder, sxb[m], f16v)), tots[i]])
                        out[i] = builder.call(fma, [ovec, splat(builder, xsb[m], f16v), t])
                return out
            tots = k_loop(builder, nb, [zero] * (NG * M), block)
            for q in range(NG):
                lanes = first_lanes(builder, builder.sub(nr, const(q * LANES)))
                for m in range(M):
                    with builder.if_then(live[m]):
                        dst = builder.bitcast(builder.gep(outs[q], [builder.mul(const(m), os__)]), f16v.as_pointer())
                        builder.call(mstore, [tots[q * M + m], dst, ir.Constant(i32, 4), lanes])
            return context.get_dummy_value()
        return sig, codegen
    tile.__name__ = tile.__qualname__ = f"packed_tile_u{bits}_m{M}_g{NG}" + (f"_a{ahead}" if ahead else "") + (
        "_vnni" if vnni else "")
    return intrinsic(tile)


# The GEMV's software prefetch, bytes ahead in the packed words. The hardware prefetchers alone left the
# one-thread GEMV at ~16-17 GB/s from memory (0.5B 4-bit: gate/up + down of 24 layers + head, 283 MB,
# CPU time, AMD EPYC VM) against ~33 GB/s from L2; 2 KB ahead gave 20.0, 4 KB 21.4-21.9, 8 KB (L2) 21.6-22.1,
# bit-identical outputs (/tmp script, decode notes). (An earlier try that prefetched whole later groups of
# rows into L2 ran slower.) vpdpwssd (VNNI) instead of vpmaddwd + vpaddd: no faster there from L2.
PREFETCH = 4096
tile_u4_1 = _make_tile(4, 1, ahead=PREFETCH)
tile_u8_1 = _make_tile(8, 1, ahead=PREFETCH)
tile_u4_m = _make_tile(4, TOKENS)
tile_u8_m = _make_tile(8, TOKENS)

# VNNI (vpdpbusd: 4 products of unsigned by signed bytes summed into each int32 lane): the same integer
# sums from fewer instructions. The int16 input x = 256 x_high + x_low (x_low in -128..127, so |x| <= 32639)
# is stored as bytes, and sum(w x) = 256 sum(w x_high) + sum(w x_low) exactly (int32, wrapping). A 64-byte
# word of 4-bit codes costs a shift, two ands and four vpdpbusd instead of three shifts, four ands, four
# vpmaddwd and four vpaddd: decode's GEMV is bound by memory, not by its arithmetic, from fewer cores.
VNNI = host_has("avx512vnni")
VNNI_QMAX = 127 * 256 + 127
tile_u4_1v = _make_tile(4, 1, ahead=PREFETCH, vnni=True)
tile_u8_1v = _make_tile(8, 1, ahead=PREFETCH, vnni=True)
tile_u4_mv = _make_tile(4, TOKENS, vnni=True)
tile_u8_mv = _make_tile(8, TOKENS, vnni=True)


@njit(cache=True, inline="always")
def _tile1(vnni, bits, wf, wo, nch, blk, sf, so, of, xq, sx, xs, y, oo, n):
    """One token x 16 rows (the GEMVs): the tile for the bits and the input layout."""
    if vnni:
        if bits == 4:
            tile_u4_1v(wf, wo, nch, blk, sf, so, of, xq, 0, 0, sx, 0, 0, xs, y, oo, 0, 1, n)
        else:
            tile_u8_1v(wf, wo, nch, blk, sf, so, of, xq, 0, 0, sx, 0, 0, xs, y, oo, 0, 1, n)
    elif bits == 4:
        tile_u4_1(wf, wo, nch, blk, sf, so, of, xq, 0, 0, sx, 0, 0, xs, y, oo, 0, 1, n)
    else:
        tile_u8_1(wf, wo, nch, blk, sf, so, of, xq, 0, 0, sx, 0, 0, xs, y, oo, 0, 1, n)


@njit(cache=True, inline="always")
def _tilem(vnni, bits, wf, wo, nch, blk, sf, so, of, xq, xqo, xqs, sx, sxo, sxs, xs, y, oo, os_, mt, n):
    """Up to TOKENS tokens x 16 rows (the GEMM)."""
    if vnni:
        if bits == 4:
            tile_u4_mv(wf, wo, nch, blk, sf, so, of, xq, xqo, xqs, sx, sxo, sxs, xs, y, oo, os_, mt, n)
        else:
            tile_u8_mv(wf, wo, nch, blk, sf, so, of, xq, xqo, xqs, sx, sxo, sxs, xs, y, oo, os_, mt, n)
    elif bits == 4:
        tile_u4_m(wf, wo, nch, blk, sf, so, of, xq, xqo, xqs, sx, sxo, sxs, xs, y, oo, os_, mt, n)
    else:
        tile_u8_m(wf, wo, nch, blk, sf, so, of, xq, xqo, xqs, sx, sxo, sxs, xs, y, oo, os_, mt, n)


@njit(cache=True, inline="always")
def _wgroup(g, G, inter):
    """The packed group holding output group g: g itself, or with gate/up interleaved (PackedLinear.inter)
    gate group g at 2g and up group g at 2g + 1."""
    if inter:
        Gh = G // 2
        return 2 * g if g < Gh else 2 * (g - Gh) + 1
    return g


@njit(cache=True)
def quantize_rows(x, blk, qmax, xq, sx, xs, vnni, bits):
    """Per token t and block b: sx[t, b] = max|x| / qmax, xq = round(x / sx) (int16), xs = sum(x)."""
    for t in range(x.shape[0]):
        quantize_row(x, t, blk, qmax, xq, sx, xs, vnni, bits)


@njit(cache=True)
def quantize_row(x, t, blk, qmax, xq, sx, xs, vnni, bits):
    """quantize_rows for token t. vnni: each value v as bytes h = (v + 128) >> 8, l = v - 256 h, laid out
    per word of packed codes (kc channels) as the vnni tile reads them: kc/2 int16 (l_i, l_{i+kc/2}),
    then kc/2 (h_i, h_{i+kc/2}) (the order of the codes' bytes in the word: pack_u4 / pack_u8)."""
    K = x.shape[1]
    nb = K // blk
    kc = 8 if bits == 4 else 4
    half = kc // 2
    for b in range(nb):
        m = np.float32(0)
        tot = np.float32(0)
        for j in range(b * blk, (b + 1) * blk):
            v = x[t, j]
            tot += v
            a = abs(v)
            if a > m:
                m = a
        s = m / np.float32(qmax) if m > 0 else np.float32(1)
        sx[t, b] = s
        xs[t, b] = tot
        inv = np.float32(1) / s
        if not vnni:
            for j in range(b * blk, (b + 1) * blk):
                xq[t, j] = np.int16(np.floor(x[t, j] * inv + np.float32(0.5)))
            continue
        for c0 in range(b * blk, (b + 1) * blk, kc):
            for i in range(half):
                v0 = np.int32(np.floor(x[t, c0 + i] * inv + np.float32(0.5)))
                v1 = np.int32(np.floor(x[t, c0 + i + half] * inv + np.float32(0.5)))
                h0 = (v0 + 128) >> 8
                h1 = (v1 + 128) >> 8
                xq[t, c0 + i] = np.int16(((v0 - (h0 << 8)) & 255) | ((v1 - (h1 << 8)) << 8))
                xq[t, c0 + half + i] = np.int16((h0 & 255) | (h1 << 8))


@njit(parallel=True, cache=True)
def gemv(w, bits, vnni, s, off, bias, x, blk, qmax, xq, sx, xs, y, inter):
    """y (O,) = W x + bias, x (1, K): one token, parallel over groups of 16 rows (one stream through
    the packed words, prefetched PREFETCH bytes ahead by the tile; a prefetch of whole later groups
    into L2 made it slower, 14 -> 12 GB/s)."""
    G, nch, _ = w.shape
    O = y.size
    nb = s.shape[1]
    quantize_rows(x, blk, qmax, xq, sx, xs, vnni, bits)
    wf, sf, of = w.reshape(-1), s.reshape(-1), off.reshape(-1)
    for g in prange(G):
        n = min(LANES, O - g * LANES)
        wg = _wgroup(g, G, inter)
        _tile1(vnni, bits, wf, wg * nch * LANES, nch, blk, sf, wg * nb * LANES, of, xq, sx, xs, y, g * LANES, n)
        for r in range(g * LANES, g * LANES + n):
            y[r] += bias[r]


@njit(parallel=True, cache=True)
def gemv_glu(w, bits, vnni, s, off, bias, x, blk, qmax, xq, sx, xs, y, act, out):
    """Gate and up packed together, interleaved (gate group g's words at 2g, up's at 2g + 1; outputs: gate
    rows in groups 0..G/2, up's in G/2..G; oc a multiple of 16):
    out (I,) = act(gate x + b) * (up x + b), act 0 silu, 1 gelu (tanh). Each item computes a group of
    gate rows and the matching group of up rows, then the activation of those 16: decode's activation
    leaves the serial part of the step (one call, no region of its own). y (O,): scratch."""
    G, nch, _ = w.shape
    Gh = G // 2
    I = out.size
    nb = s.shape[1]
    quantize_rows(x, blk, qmax, xq, sx, xs, vnni, bits)
    wf, sf, of = w.reshape(-1), s.reshape(-1), off.reshape(-1)
    for g in prange(Gh):
        for half in range(2):
            q = g + half * Gh           # the output group; its words at 2g + half (interleaved)
            wq = 2 * g + half
            _tile1(vnni, bits, wf, wq * nch * LANES, nch, blk, sf, wq * nb * LANES, of, xq, sx, xs, y, q * LANES, LANES)
        for r in range(g * LANES, g * LANES + LANES):
            a = y[r] + bias[r]
            u = y[r + I] + bias[r + I]
            if act == 0:
                a = a / (np.float32(1) + np.exp(-a))
            else:
                a = np.float32(0.5) * a * (np.float32(1) + np.tanh(np.float32(0.7978845608028654)
                                                                   * (a + np.float32(0.044715) * a * a * a)))
            out[r] = a * u


# Decode's fused calls (kernels.decode_step): a layer's norm and residual adds ride in its GEMVs' calls,
# so that one token is four GEMV calls and two small steps per layer instead of nine calls (each call
# from Python unboxes its arrays: a few us; at 4+ threads the serial steps between the parallel regions
# are what does not scale). The arithmetic is the separate steps', in the same order (bit-identical).

@njit(parallel=True, cache=True)
def gemv_norm(w, bits, vnni, s, off, bias, h, gamma, beta, has_beta, eps, rms, x, blk, qmax, xq, sx, xs, y, inter):
    """x = norm(h) (h, x (1, K): the layer's input norm), then y = W x + bias as `gemv`."""
    _norm_row(h[0], gamma, beta, has_beta, eps, rms, x[0])
    G, nch, _ = w.shape
    O = y.size
    nb = s.shape[1]
    quantize_rows(x, blk, qmax, xq, sx, xs, vnni, bits)
    wf, sf, of = w.reshape(-1), s.reshape(-1), off.reshape(-1)
    for g in prange(G):
        n = min(LANES, O - g * LANES)
        wg = _wgroup(g, G, inter)
        _tile1(vnni, bits, wf, wg * nch * LANES, nch, blk, sf, wg * nb * LANES, of, xq, sx, xs, y, g * LANES, n)
        for r in range(g * LANES, g * LANES + n):
            y[r] += bias[r]


@njit(parallel=True, cache=True)
def gemv_add(w, bits, vnni, s, off, bias, x, blk, qmax, xq, sx, xs, y, h):
    """h (1, O) += W x + bias, x (1, K): the o and down projections (one layer: never interleaved) with
    the residual add in each item (y (>= O,): scratch)."""
    G, nch, _ = w.shape
    O = h.shape[1]
    nb = s.shape[1]
    quantize_rows(x, blk, qmax, xq, sx, xs, vnni, bits)
    wf, sf, of = w.reshape(-1), s.reshape(-1), off.reshape(-1)
    for g in prange(G):
        n = min(LANES, O - g * LANES)
        _tile1(vnni, bits, wf, g * nch * LANES, nch, blk, sf, g * nb * LANES, of, xq, sx, xs, y, g * LANES, n)
        for r in range(g * LANES, g * LANES + n):
            h[0, r] += y[r] + bias[r]


@njit(parallel=True, cache=True)
def gemv_glu_norm(w, bits, vnni, s, off, bias, h, gamma, beta, has_beta, eps, rms, x, blk, qmax, xq, sx, xs, y, act, out):
    """x = norm(h) (the feed-forward norm), then `gemv_glu`: out (I,) = act(gate x + b) * (up x + b)."""
    _norm_row(h[0], gamma, beta, has_beta, eps, rms, x[0])
    G, nch, _ = w.shape
    Gh = G // 2
    I = out.size
    nb = s.shape[1]
    quantize_rows(x, blk, qmax, xq, sx, xs, vnni, bits)
    wf, sf, of = w.reshape(-1), s.reshape(-1), off.reshape(-1)
    for g in prange(Gh):
        for half in range(2):
            q = g + half * Gh           # the output group; its words at 2g + half (interleaved)
            wq = 2 * g + half
            _tile1(vnni, bits, wf, wq * nch * LANES, nch, blk, sf, wq * nb * LANES, of, xq, sx, xs, y, q * LANES, LANES)
        for r in range(g * LANES, g * LANES + LANES):
            a = y[r] + bias[r]
            u = y[r + I] + bias[r + I]
            if act == 0:
                a = a / (np.float32(1) + np.exp(-a))
            else:
                a = np.float32(0.5) * a * (np.float32(1) + np.tanh(np.float32(0.7978845608028654)
                                                                   * (a + np.float32(0.044715) * a * a * a)))
            out[r] = a * u


@njit(parallel=True, cache=True)
def gemm(w, bits, vnni, s, off, bias, x, blk, qmax, xq, sx, xs, y, inter):
    """y (T, O) = x (T, K) W^T + bias: work items of TOKEN_BLOCK tokens x 16 rows, in tiles of TOKENS
    tokens; the items of one token block side by side, so that its int16 inputs (TOKEN_BLOCK x K) stay
    in cache while every group of rows passes (a group's weights are a few KB). Before: one item per
    group over all T tokens, which read the whole T x K input once per group (for the down projection
    of a 512-token prompt, 5 MB per group of 16 rows) and gave 56-72 items to share among the threads.
    The inputs are quantized in parallel over the tokens."""
    G, nch, _ = w.shape
    T, O = y.shape
    K = x.shape[1]
    nb = s.shape[1]
    for t in prange(T):
        quantize_row(x, t, blk, qmax, xq, sx, xs, vnni, bits)
    wf, sf, of = w.reshape(-1), s.reshape(-1), off.reshape(-1)
    xqf, sxf, xsf, yf = xq.reshape(-1), sx.reshape(-1), xs.reshape(-1), y.reshape(-1)
    ntb = (T + TOKEN_BLOCK - 1) // TOKEN_BLOCK
    for it in prange(G * ntb):
        tb = it // G
        g = it - tb * G
        wg = _wgroup(g, G, inter)
        n = min(LANES, O - g * LANES)
        ta = tb * TOKEN_BLOCK
        tz = min(T, ta + TOKEN_BLOCK)
        for t0 in range(ta, tz, TOKENS):
            mt = min(TOKENS, tz - t0)
            _tilem(vnni, bits, wf, wg * nch * LANES, nch, blk, sf, wg * nb * LANES, of, xqf, t0 * K, K, sxf, t0 * nb, nb,
                   xsf, yf, t0 * O + g * LANES, O, mt, n)
        for t in range(ta, tz):
            for r in range(g * LANES, g * LANES + n):
                yf[t * O + r] += bias[r]


ARENA_ALIGN = 4096      # each array of the arena starts on a page


class Arena:
    """One buffer for every packed layer's words, scales and offsets, handed out in the order the layers
    are made (Model: per layer q/k/v, o, gate/up, down, then the head: the order a decode step reads
    them). Why: decode streams every weight once per token; ~100 separate arrays of 0.5-5.5 MB (numpy
    advises huge pages only from 4 MB) ran at 10-14 GB/s per CPU second at one thread, the 86 MB head at
    26 GB/s (0.5B 4-bit, AMD EPYC VM). One buffer in reading order is one stream on huge pages: decode
    48.4 -> 60.2 tokens per CPU second there, bit-identical (decode notes). `nbytes` is reserved, not
    touched: pages never handed out cost no memory. `take` returns None once the buffer is full (the
    caller allocates on its own)."""

    def __init__(self, nbytes: int):
        self.buf = np.empty(int(nbytes) + ARENA_ALIGN, np.uint8)
        self.at = (-self.buf.ctypes.data) % ARENA_ALIGN

    def take(self, shape, dtype, zero: bool = False):
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        if self.at + n > self.buf.size:
            return None
        a = self.buf[self.at:self.at + n].view(dtype).reshape(shape)
        self.at += -(-n // ARENA_ALIGN) * ARENA_ALIGN
        if zero:
            a[...] = 0
        return a

    @staticmethod
    def bound(ops: list) -> int:
        """Bytes that packing the linear layers `ops` (graph.LinearOp) may take, at most: each one's codes
        (wlen), scales and offsets (at most twice the file's alen: a symmetric block stores a scale only),
        rows padded to 16, page alignment."""
        n = 0
        for op in ops:
            wlen, alen = op.external[1], op.external[2]
            n += wlen + 2 * alen + 48 * op.ic + 3 * ARENA_ALIGN
        return n


class PackedLinear:
    """4- or 8-bit layers reading one input (q/k/v, gate/up: the same bits, block and input size),
    repacked into one matrix: one call and one quantization of the input for all of them. Each layer's
    rows start on a group of 16 (the rows between are zero). `of` returns None when the layers do not
    suit (a block must hold whole words, K a whole number of blocks)."""

    packed = True

    def __init__(self, ws: list, threads: int, arena: Arena | None = None):
        from .qkernels import _pick
        self.threads = threads
        w0 = ws[0]
        self.ic, self.bits, self.blk = w0.ic, w0.bits, w0.block
        kc, nb = KC[w0.bits], w0.ic // w0.block
        groups = [-(-w.oc // LANES) for w in ws]
        G = sum(groups)
        self.O = G * LANES
        take = arena.take if arena is not None else (lambda shape, dtype, zero=False: None)
        self.w = take((G, w0.ic // kc, LANES), np.uint32)
        self.s = take((G, nb, LANES), np.float32, True)
        self.off = take((G, nb, LANES), np.float32, True)
        if self.w is None or self.s is None or self.off is None:
            self.w = np.empty((G, w0.ic // kc, LANES), np.uint32)
            self.s = np.zeros((G, nb, LANES), np.float32)
            self.off = np.zeros((G, nb, LANES), np.float32)
        self.bias = np.zeros(self.O, np.float32)
        self.slices = []
        pack = _pick(pack_u4 if w0.bits == 4 else pack_u8, 1 << 30, threads)
        # gate and up of equal whole groups: decode's GEMV with the activation fused (gemv_glu), and their
        # groups interleaved in memory (gate 0, up 0, gate 1, ...: `inter`, _wgroup), so that the fused GEMV,
        # which takes a gate group and the matching up group, reads one stream (two streams: 18.2 GB/s per
        # CPU second against 27.2 for the same bytes read in order, 0.5B gate/up, AMD EPYC VM). Outputs keep
        # the layers' order (gate rows, then up rows).
        self.glu = len(ws) == 2 and ws[0].oc == ws[1].oc and ws[0].oc % LANES == 0
        self.inter = self.glu
        g0 = 0
        for i, (w, g) in enumerate(zip(ws, groups)):
            at = slice(i, None, 2) if self.inter else slice(g0, g0 + g)
            if self.inter:
                tmp = np.empty((g,) + self.w.shape[1:], np.uint32)
                pack(w.codes, w.oc, w.ic, NIBBLES, tmp)
                self.w[at] = tmp
                del tmp
            else:
                pack(w.codes, w.oc, w.ic, NIBBLES, self.w[at])
            self.s[at] = pack_blocks(w.scale, g)
            self.off[at] = pack_blocks(w.offset, g)
            if w.bias is not None:
                self.bias[g0 * LANES:g0 * LANES + w.oc] = w.bias
            self.slices.append((g0 * LANES, g0 * LANES + w.oc))
            g0 += g
        top = 15 if w0.bits == 4 else 255
        # the VNNI tiles where the host has them and a block holds an even count of words (two a step)
        self.vnni = bool(VNNI and not NO_VNNI and (self.blk // kc) % 2 == 0)
        self.qmax = int(min(VNNI_QMAX if self.vnni else 32767, (2**31 - 1) // (self.blk * top)))
        self.xq1 = np.empty((1, w0.ic), np.int16)
        self.sx1, self.xs1 = np.empty((1, nb), np.float32), np.empty((1, nb), np.float32)
        self.gemv = _pick(gemv, self.w.size * 4, threads)
        # decode's fused calls (gemv_norm / gemv_add / gemv_glu_norm) write into y1, reused every token
        self.y1 = np.empty(self.O, np.float32)
        self.views1 = [self.y1[a:b] for a, b in self.slices]
        self.gemv_norm = _pick(gemv_norm, self.w.size * 4, threads)
        self.gemv_add = _pick(gemv_add, self.w.size * 4, threads)
        self.gemm = _pick(gemm, 1 << 30, threads)
        self.gemm_serial = _pick(gemm, 1 << 30, 1)
        if self.glu:
            self.gemv_glu = _pick(gemv_glu, self.w.size * 4, threads)
            self.gemv_glu_norm = _pick(gemv_glu_norm, self.w.size * 4, threads)
        self.nbytes = self.w.nbytes + self.s.nbytes + self.off.nbytes + self.bias.nbytes

    @staticmethod
    def of(ws: list, threads: int, arena: Arena | None = None):
        from .qkernels import HAS_I16
        w0 = ws[0]
        if not HAS_I16 or w0.bits not in (4, 8) or w0.block % KC[w0.bits] or w0.ic % w0.block:
            return None
        if any((w.bits, w.block, w.ic) != (w0.bits, w0.block, w0.ic) for w in ws):
            return None
        return PackedLinear(ws, threads, arena)

    def apply_glu(self, x: np.ndarray, act: int, out: np.ndarray) -> np.ndarray:
        """One token through gate and up with the activation fused (gemv_glu): out (1, oc)."""
        self.gemv_glu(self.w, self.bits, self.vnni, self.s, self.off, self.bias, x, self.blk, self.qmax, self.xq1, self.sx1,
                      self.xs1, self.y1, act, out[0])
        return out

    def apply_norm(self, h: np.ndarray, norm: tuple, x: np.ndarray) -> list:
        """One token: x = norm(h) (norm: Workspace.norm_args), then each layer's output, views (oc,) of
        y1 (overwritten by the next call)."""
        self.gemv_norm(self.w, self.bits, self.vnni, self.s, self.off, self.bias, h, norm[0], norm[1], norm[2], norm[3], norm[4], x,
                       self.blk, self.qmax, self.xq1, self.sx1, self.xs1, self.y1, self.inter)
        return self.views1

    def apply_add(self, x: np.ndarray, h: np.ndarray) -> None:
        """One token: h (1, oc) += x W^T + bias (one layer)."""
        self.gemv_add(self.w, self.bits, self.vnni, self.s, self.off, self.bias, x, self.blk, self.qmax, self.xq1, self.sx1,
                      self.xs1, self.y1, h)

    def apply_glu_norm(self, h: np.ndarray, norm: tuple, x: np.ndarray, act: int, out: np.ndarray) -> np.ndarray:
        """One token: x = norm(h), then `apply_glu`: out (1, oc)."""
        self.gemv_glu_norm(self.w, self.bits, self.vnni, self.s, self.off, self.bias, h, norm[0], norm[1], norm[2], norm[3], norm[4],
                           x, self.blk, self.qmax, self.xq1, self.sx1, self.xs1, self.y1, act, out[0])
        return out

    def apply(self, x: np.ndarray, copy: bool = True) -> list:
        """x (T, K) -> each layer's (T, oc) output (views when T = 1, or copy=False)."""
        T = x.shape[0]
        y = np.empty((T, self.O), np.float32)
        if T == 1:
            self.gemv(self.w, self.bits, self.vnni, self.s, self.off, self.bias, x, self.blk, self.qmax, self.xq1, self.sx1,
                      self.xs1, y[0], self.inter)
            return [y[:, a:b] for a, b in self.slices]
        nb = self.s.shape[1]
        xq = np.empty((T, self.ic), np.int16)
        sx, xs = np.empty((T, nb), np.float32), np.empty((T, nb), np.float32)
        if T * self.w.size < GEMM_PARALLEL_MIN:     # a few tokens of a small layer: a region costs more than it saves
            self.gemm_serial(self.w, self.bits, self.vnni, self.s, self.off, self.bias, x, self.blk, self.qmax, xq, sx, xs,
                             y, self.inter)
        elif self.threads > 1:      # items handed out a few at a time: a thread slowed by another job takes fewer
            import numba
            with numba.parallel_chunksize(GEMM_CHUNK):
                self.gemm(self.w, self.bits, self.vnni, self.s, self.off, self.bias, x, self.blk, self.qmax, xq, sx, xs, y,
                          self.inter)
        else:
            self.gemm(self.w, self.bits, self.vnni, self.s, self.off, self.bias, x, self.blk, self.qmax, xq, sx, xs, y,
                      self.inter)
        if not copy:
            return [y[:, a:b] for a, b in self.slices]
        return [np.ascontiguousarray(y[:, a:b]) for a, b in self.slices]
