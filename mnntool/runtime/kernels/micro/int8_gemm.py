"""u8 x s8 -> s32 products for int8 convolutions, rescaled to the output's int8 grid in the same pass.

Numba/LLVM does not turn byte dot products into VPDPBUSD (it widens to 32-bit lanes, a quarter of the
rate), so on CPUs with AVX-512 VNNI the micro-kernel is LLVM IR: a tile of 32 pixels x 8 output
channels in 16 zmm accumulators, one VPDPBUSD per (16 pixels, channel, 4 k); its epilogue rescales the
accumulator in MNN's own float order (`epilogue`), so each byte is MNN's, applies the activation and
rounds to the output grid, and stores float rows of the NCHW output (masked at the row end and past
the last channel), or a table op's values (a SiLU's) at the output bytes (`lut_bytes`). Several
times OpenBLAS's sgemm rate here.
Without VNNI, int8 layers run on the float kernels on the int8 grid (`conv._grid_input`).

Layouts: activations packed as [P/16][K/4][16 pixels][4 bytes] uint8 (`pixel_blocks`), weights as
[OC/8][K/4][8][4] int8 (`Int8Weights`); K is a multiple of 4.
"""
from __future__ import annotations

import numpy as np
from ..compile.jit import njit, prange, types, intrinsic

from .epilogue import act_bounds
from .llvm_ir import data_of, declare, first_lanes, host_has, k_loop, lane_bits, splat as splat_

PIX, OCB = 32, 8          # tile: pixels x output channels
EP_ROWS = 32            # the epilogue rows padded to a multiple of this (int8_lanes_oc's tile: 32 channels)


HAS_VNNI = host_has("avx512vnni")
HAS_VBMI = host_has("avx512vbmi")       # the byte permutes of a table op's lookup (lut_bytes)
TABLE_SIZE = 256        # the table argument's length in floats: a table op's codes (byte_table)
NO_TABLE = np.zeros(TABLE_SIZE, np.float32)     # the table argument of an epilogue without one (never read)


def pixel_blocks(pixels: int) -> int:
    """Number of 16-pixel blocks the packed activations hold: whole tiles, so a tile never reads past."""
    return -(-pixels // PIX) * (PIX // 16)


def byte_table(codes) -> np.ndarray:
    """At most 256 int8 codes as the epilogue reads them (`lut_bytes`): their bytes in a float32 array
    of 256 (the kernels' argument type; 1 KB, the codes in its first 256 bytes, zeros past them)."""
    codes = np.asarray(codes, np.int8).reshape(-1)
    if codes.size > TABLE_SIZE:
        raise ValueError(f"a table of {codes.size} values (at most {TABLE_SIZE})")
    out = np.zeros(TABLE_SIZE, np.float32)
    out.view(np.int8)[:codes.size] = codes
    return out


def lut_bytes(builder, tp, idx, z, s):
    """(float(tab[i]) - z) * s for four <16 x i32> index vectors `idx` (0..255) into the 256 int8 codes
    at tp (byte_table), as four <16 x float>: the indices packed to 64 bytes, two byte permutes over
    128-byte halves of the table (vpermi2b, AVX-512 VBMI) and a select on bit 7, then widened: 0.11 ns
    an output on Zen 4. A float table (eight two-register permutes per 16 lanes) or a gather (~24
    cycles per 16 lanes there; LLVM's generic masked gather, scalarized on AMD targets, more) cost
    about what a lookup pass of its own costs (0.8 ns an output)."""
    from llvmlite import ir
    i8, i32, f32 = ir.IntType(8), ir.IntType(32), ir.FloatType()
    b16, b64 = ir.VectorType(i8, 16), ir.VectorType(i8, 64)
    perm = declare(builder, "llvm.x86.avx512.vpermi2var.qi.512", b64, b64, b64, b64)
    sel = lambda n: ir.Constant(ir.VectorType(i32, n), list(range(n)))  # noqa: E731
    small = [builder.trunc(v, b16) for v in idx]
    packed = builder.shuffle_vector(builder.shuffle_vector(small[0], small[1], sel(32)),
                                    builder.shuffle_vector(small[2], small[3], sel(32)), sel(64))
    base = builder.bitcast(tp, i8.as_pointer())
    at = lambda k: builder.gep(base, [ir.Constant(ir.IntType(64), 64 * k)])  # noqa: E731
    part = lambda k: builder.load(builder.bitcast(at(k), b64.as_pointer()), align=4)  # noqa: E731
    lo = builder.call(perm, [part(0), packed, part(1)])
    hi = builder.call(perm, [part(2), packed, part(3)])
    codes = builder.select(builder.icmp_signed("<", packed, ir.Constant(b64, [0] * 64)), hi, lo)
    f16 = ir.VectorType(f32, 16)
    out = []
    for k in range(4):
        c = builder.shuffle_vector(codes, ir.Constant(b64, ir.Undefined),
                                   ir.Constant(ir.VectorType(i32, 16), list(range(16 * k, 16 * k + 16))))
        out.append(builder.fmul(builder.fsub(builder.sitofp(c, f16), z), s))
    return out


@intrinsic
def lut_chunk(typingctx, x, xo, n, tab, z, s):
    """x[xo + i] = (tab[int(x[xo + i])] - z) * s for i < min(n, 64), in place: x holds indices 0..255
    as floats (`lut_bytes`). For loops in Numba (the int8 depthwise convolution's epilogue)."""
    from llvmlite import ir
    sig = types.void(x, types.intp, types.intp, tab, z, s)

    def codegen(context, builder, sig, args):
        xa, xo_, n_, ta, za, sa = args
        i32, i64, f32 = ir.IntType(32), ir.IntType(64), ir.FloatType()
        f16, v16, m16 = ir.VectorType(f32, 16), ir.VectorType(i32, 16), ir.VectorType(ir.IntType(1), 16)
        xp = data_of(context, builder, sig.args[0], xa, xo_)
        tp = data_of(context, builder, sig.args[3], ta)
        mload = declare(builder, "llvm.masked.load.v16f32.p0", f16, f16.as_pointer(), i32, m16, f16)
        mstore = declare(builder, "llvm.masked.store.v16f32.p0", ir.VoidType(), f16, f16.as_pointer(), i32, m16)
        zero = ir.Constant(f16, [0.0] * 16)
        ptrs = [builder.bitcast(builder.gep(xp, [ir.Constant(i64, 16 * k)]), f16.as_pointer()) for k in range(4)]
        masks = [first_lanes(builder, builder.sub(n_, ir.Constant(i64, 16 * k))) for k in range(4)]
        idx = [builder.fptosi(builder.call(mload, [p, ir.Constant(i32, 4), m, zero]), v16) for p, m in zip(ptrs, masks)]
        vals = lut_bytes(builder, tp, idx, splat_(builder, za, f16), splat_(builder, sa, f16))
        for v, p, m in zip(vals, ptrs, masks):
            builder.call(mstore, [v, p, ir.Constant(i32, 4), m])
        return context.get_dummy_value()
    return sig, codegen


class EpilogueIR:
    """What the int8 tiles' epilogues share (_store_ir, int8_lanes_oc._tile_oc): epf's values as
    <16 x float> splats, the rescale of an accumulator vector in MNN's float32 order, the output value
    (on the grid or left float) and a table op's index, and the branch on whether a table is there."""

    def __init__(self, builder, epfa):
        from llvmlite import ir
        f32 = ir.FloatType()
        f16 = ir.VectorType(f32, 16)
        self.builder, self.f16, self.v16 = builder, f16, ir.VectorType(ir.IntType(32), 16)
        at = lambda k: splat_(builder, builder.extract_value(epfa, k), f16)  # noqa: E731
        self.lo, self.hi, self.ratio, self.s_out, self.q_lo, self.q_hi, self.z_out = (at(k) for k in range(7))
        self.z_t, self.s_t = at(8), at(9)
        self.on_grid = builder.fcmp_ordered("!=", builder.extract_value(epfa, 3), ir.Constant(f32, 0))
        self.table = builder.fcmp_ordered("!=", builder.extract_value(epfa, 7), ir.Constant(f32, 0))
        self.trunc = declare(builder, "llvm.trunc.v16f32", f16, f16)
        self.copysign = declare(builder, "llvm.copysign.v16f32", f16, f16, f16)
        self.half = ir.Constant(f16, [0.5] * 16)

    def clamp(self, v, low, high):     # compare and select, as MNN's vminps/vmaxps on finite values
        b = self.builder
        v = b.select(b.fcmp_ordered("<", v, low), low, v)
        return b.select(b.fcmp_ordered(">", v, high), high, v)

    def rescaled(self, acc, sc, bi):
        """(value, byte) of an accumulator vector, each step rounded to float32 (no FMA), MNN's order:
        D * alpha * (s_in/s_out) + bias, clamped to the activation, rounded half away, clamped to the byte."""
        b = self.builder
        val = b.fmul(b.fmul(b.sitofp(acc, self.f16), sc), self.ratio)
        val = self.clamp(b.fadd(val, bi), self.lo, self.hi)
        q = self.clamp(b.call(self.trunc, [b.fadd(val, b.call(self.copysign, [self.half, val]))]), self.q_lo, self.q_hi)
        return val, q

    def value(self, val, q):
        """The output: (q - z) * s on the grid, else the float value."""
        b = self.builder
        return b.select(self.on_grid, b.fmul(b.fsub(q, self.z_out), self.s_out), val)

    def index(self, q):
        """The byte's index into a table op's codes (lut_bytes)."""
        return self.builder.fptosi(self.builder.fsub(q, self.q_lo), self.v16)

    def branches(self, store):
        """store(looked_up) under the table flag; never a table without VBMI (no byte permutes to select:
        Cascade Lake has VNNI, not VBMI)."""
        if not HAS_VBMI:
            store(False)
            return
        with self.builder.if_else(self.table) as (then, otherwise):
            with then:
                store(True)
            with otherwise:
                store(False)


def _store_ir(context, builder, new, op, os_, blocks, rows_, ep_ty, epa, epfa, tp, bits=None):
    """The tile's epilogue: the 16 accumulators (channel o, block v at new[2 * o + v]) rescaled in MNN's
    order and stored to op[o * os_ + at_v], lanes < n_v of block v (`blocks` = [(at_v, n_v)]) and
    channels < rows_, as floats on the output grid, or a table op's values (epf[7] != 0). `bits`: per
    block the i64 mask of the lanes that are output pixels, packed to the low lanes first (a register
    VCOMPRESS; its memory form is microcoded on Zen 4), n_v then their count (gemm_planes)."""
    from llvmlite import ir
    i1, i32, i64, f32 = ir.IntType(1), ir.IntType(32), ir.IntType(64), ir.FloatType()
    v16, f16 = ir.VectorType(i32, 16), ir.VectorType(f32, 16)
    const = lambda v: ir.Constant(i64, v)   # noqa: E731
    fn = lambda name, ret, *t: declare(builder, name, ret, *t)  # noqa: E731
    mstore = fn("llvm.masked.store.v16f32.p0", ir.VoidType(), f16, f16.as_pointer(), i32, ir.VectorType(i1, 16))
    splat = lambda value, vt: splat_(builder, value, vt)  # noqa: E731
    ept = [builder.extract_value(epa, k) for k in range(2)]
    rows = [data_of(context, builder, ep_ty.types[k], ept[k]) for k in range(2)]
    ep = EpilogueIR(builder, epfa)
    none = ir.Constant(ir.VectorType(i1, 16), [0] * 16)
    compress = fn("llvm.x86.avx512.mask.compress.v16i32", v16, v16, v16, ir.VectorType(i1, 16))

    def store(looked_up):
        done = []
        for o in range(OCB):
            for v, (at_v, n_v) in enumerate(blocks):
                mask = first_lanes(builder, n_v)
                sc = builder.load(builder.gep(rows[0], [const(o)]))
                bi = builder.load(builder.gep(rows[1], [const(o)]))
                acc = new[2 * o + v]
                if bits is not None:
                    acc = builder.call(compress, [acc, ir.Constant(v16, [0] * 16), lane_bits(builder, bits[v])])
                val, q = ep.rescaled(acc, splat(sc, f16), splat(bi, f16))
                live = builder.select(builder.icmp_signed("<", const(o), rows_), mask, none)
                at = builder.add(builder.mul(const(o), os_), at_v)
                dst = builder.bitcast(builder.gep(op, [at]), f16.as_pointer())
                if looked_up:       # the table op's value at the byte, four vectors at a time
                    done.append((ep.index(q), dst, live))
                    continue
                builder.call(mstore, [ep.value(val, q), dst, ir.Constant(i32, 4), live])
        for k in range(0, len(done), 4):
            group = done[k:k + 4]
            for val, (_, dst, live) in zip(lut_bytes(builder, tp, [g[0] for g in group], ep.z_t, ep.s_t), group):
                builder.call(mstore, [val, dst, ir.Constant(i32, 4), live])

    def stores():
        ep.branches(store)
    if bits is None:
        stores()
        return
    # blocks all of whose lanes are output pixels (most of them) store without the compress
    full = builder.icmp_signed("==", builder.and_(bits[0], bits[1]), const(0xFFFF))
    packed = bits
    with builder.if_else(full) as (then, otherwise):
        with then:
            bits = None
            stores()
        with otherwise:
            bits = packed
            stores()


def _products_ir(builder, nk, wp, x_at):
    """The K loop: 16 accumulators (channel o, block v at [2 * o + v]) of VPDPBUSD over the 8 channels'
    weight words at wp and the two blocks' 16 pixel words at x_at(kk, v) (an i32 pointer)."""
    from llvmlite import ir
    i32, i64 = ir.IntType(32), ir.IntType(64)
    v16 = ir.VectorType(i32, 16)
    dpbusd = declare(builder, "llvm.x86.avx512.vpdpbusd.512", v16, v16, v16, v16)

    def step(kk, accs):
        xv = [builder.load(builder.bitcast(x_at(kk, v), v16.as_pointer()), align=1) for v in range(2)]
        wrow = builder.bitcast(builder.gep(wp, [builder.mul(kk, ir.Constant(i64, 4 * OCB))]), i32.as_pointer())
        new = []
        for o in range(OCB):
            wb = splat_(builder, builder.load(builder.gep(wrow, [ir.Constant(i64, o)]), align=1), v16)
            for v in range(2):
                new.append(builder.call(dpbusd, [accs[2 * o + v], xv[v], wb]))
        return new
    return k_loop(builder, nk, [ir.Constant(v16, [0] * 16)] * (2 * OCB), step)


@intrinsic
def _tile(typingctx, x, xoff, w, woff, k4, out, ooff, ostride, left, rows, ep, epf, tab):
    """out[o, p] for 32 pixels x 8 channels; ep = (scale, bias) rows at the tile's channel, epf = the
    `Epilogue` floats; `left` = valid pixels from the tile start, `rows` = valid channels (out has no
    rows past them); `tab` the codes of a table op reading the output grid (epf[7] != 0: out = (tab[q -
    q_lo] - epf[8]) * epf[9], `lut_bytes`; `byte_table`), else unread."""
    from llvmlite import ir
    sig = types.void(x, types.intp, w, types.intp, types.intp, out, types.intp, types.intp, types.intp, types.intp,
                     ep, epf, tab)

    def codegen(context, builder, sig, args):
        xa, xo, wa, wo, nk, oa, oo, os_, left_, rows_, epa, epfa, taba = args
        i64 = ir.IntType(64)
        a = sig.args
        xp = data_of(context, builder, a[0], xa, xo)
        wp = data_of(context, builder, a[2], wa, wo)
        op = data_of(context, builder, a[5], oa, oo)
        const = lambda v: ir.Constant(i64, v)   # noqa: E731
        # the two 16-pixel blocks: block v starts at v * k4 * 64 bytes, then 64 bytes a k step
        new = _products_ir(builder, nk, wp, lambda kk, v: builder.gep(
            xp, [builder.add(builder.mul(const(v), builder.mul(nk, const(64))), builder.mul(kk, const(64)))]))
        blocks = [(const(16 * v), builder.sub(left_, const(16 * v))) for v in range(2)]
        tp = data_of(context, builder, a[12], taba)
        _store_ir(context, builder, new, op, os_, blocks, rows_, a[10], epa, epfa, tp)
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def _tile_planes(typingctx, g, g0, g1, offs, w, woff, k4, out, o0, o1, ostride, n0, n1, b0, b1, rows, ep, epf,
                 tab):
    """_tile reading its pixels from the quantized grid in planes of words (int8_conv.quantize_planes)
    instead of im2col's blocks: for a stride-1 window, 16 consecutive virtual pixels (output rows at the
    grid's row pitch, the pitch's last columns not output pixels) are 16 consecutive words of the grid for
    every (tap, word) k, at g[g_v + offs[k]] for block v. Its output pixels (lanes in the mask b_v, n_v of
    them) packed and stored from out[o * ostride + o_v]. No im2col pass: 0.2 ms of a 0.8 ms 3x3 layer at
    56x56x64."""
    sig = types.void(g, types.intp, types.intp, offs, w, types.intp, types.intp, out, types.intp, types.intp,
                     types.intp, types.intp, types.intp, types.intp, types.intp, types.intp, ep, epf, tab)

    def codegen(context, builder, sig, args):
        ga, g0_, g1_, fa, wa, wo, nk, oa, o0_, o1_, os_, n0_, n1_, b0_, b1_, rows_, epa, epfa, taba = args
        a = sig.args
        gp = data_of(context, builder, a[0], ga)
        fp = data_of(context, builder, a[3], fa)
        wp = data_of(context, builder, a[4], wa, wo)
        op = data_of(context, builder, a[7], oa)
        starts = [g0_, g1_]

        def x_at(kk, v):
            return builder.gep(gp, [builder.add(starts[v], builder.load(builder.gep(fp, [kk])))])
        new = _products_ir(builder, nk, wp, x_at)
        _store_ir(context, builder, new, op, os_, [(o0_, n0_), (o1_, n1_)], rows_, a[16], epa, epfa,
                  data_of(context, builder, a[18], taba), bits=[b0_, b1_])
        return context.get_dummy_value()
    return sig, codegen


def plane_blocks(oh: int, ow: int, pitch: int) -> np.ndarray:
    """(blocks, 4) int64 for gemm_planes: per 16 virtual pixels v = y * pitch + x (the output rows at the
    grid's pitch; x >= ow is no output pixel), the first v, the output index of its first output pixel,
    the mask of its lanes that are output pixels and their count. The output pixels of a block are
    consecutive in the output (a row's end, then the next row's start)."""
    virtual = (oh - 1) * pitch + ow
    n = -(-virtual // 16)
    v = np.arange(n * 16, dtype=np.int64).reshape(n, 16)
    live = (v < virtual) & (v % pitch < ow)
    out = np.zeros((n, 4), np.int64)
    out[:, 0] = v[:, 0]
    first = np.argmax(live, axis=1)
    vf = v[np.arange(n), first]
    out[:, 1] = np.where(live.any(axis=1), (vf // pitch) * ow + vf % pitch, 0)
    out[:, 2] = (live.astype(np.int64) << np.arange(16, dtype=np.int64)).sum(axis=1)
    out[:, 3] = live.sum(axis=1)
    return out


@njit(parallel=True, cache=True)
def gemm_planes(g, offs, wp, k4, oc, ep, epf, out, tab, blk):
    """out (OC, oh * ow) from the grid g (flat words, int8_conv.quantize_planes) of a stride-1 window: the
    virtual pixels in blocks of 16 (`plane_blocks`), two blocks a tile (_tile_planes); offs[k] the word
    offset of k. Rows at the grid's pitch (W + the wider side padding) fill the 16-lane blocks better
    than 16-pixel segments of each output row: 56-pixel rows 56/57 of the lanes (was 56/64), 28: 28/29,
    14: 14/15, 7: 49 of 64 (as im2col's)."""
    P = out.shape[1]
    nb = blk.shape[0]
    npt, nob = (nb + 1) // 2, (oc + OCB - 1) // OCB
    of = out.reshape(-1)
    scale, bias = ep
    for t in prange(nob * npt):
        ob, pt = t // npt, t % npt
        o0 = ob * OCB
        s0 = 2 * pt
        s1 = min(s0 + 1, nb - 1)
        n1 = blk[s1, 3] if s0 + 1 < nb else 0
        _tile_planes(g, blk[s0, 0], blk[s1, 0], offs, wp, ob * k4 * 4 * OCB, k4, of,
                     o0 * P + blk[s0, 1], o0 * P + blk[s1, 1], P, blk[s0, 3], n1, blk[s0, 2], blk[s1, 2],
                     oc - o0, (scale[o0:], bias[o0:]), epf, tab)


@njit(parallel=True, cache=True)
def gemm_vnni(x, wp, k4, oc, ep, epf, out, tab):
    """out (OC, P) float from packed activations and weights; ep = (scale, bias) rows; tab: see _tile."""
    P = out.shape[1]
    npb, nob = (P + PIX - 1) // PIX, (oc + OCB - 1) // OCB
    of = out.reshape(-1)
    scale, bias = ep
    for t in prange(nob * npb):
        ob, pb = t // npb, t % npb
        o0 = ob * OCB
        _tile(x, pb * 2 * k4 * 64, wp, ob * k4 * 4 * OCB, k4, of, o0 * P + pb * PIX, P, P - pb * PIX, oc - o0,
              (scale[o0:], bias[o0:]), epf, tab)


def epilogue(alpha, bias, weight_sums, s_in: float, zero_in: int, out_grid, act: int, table=None):
    """The tile's (scale, bias) rows and epilogue floats for the rescale MNN 3.6's x86 int8 GEMM does
    (its AVX2 kernel, read from the binary and checked on the values it was handed; the pip wheel has
    no AVX-512 int8 code): from the accumulator D over the stored bytes u = q + 128,
    v = fl(fl(fl(float(D) * alpha) * (s_in / s_out)) + b'), b' = fl(fl((b - sum(w) * alpha * 128' * s_in)
    / s_out) + z_out) with 128' = 128 + zero_in, all float32 left to right; clamped to the activation,
    rounded half away from zero (fl(v +- 0.5) truncated), clamped to the byte range; a float output takes
    s_out = 1 and z_out = 0 and stops before the rounding. `out_grid` = (s_out, lo, hi, z_out) in steps
    of the scale from real 0 (conv.Int8Grids), or None for a float output; act 0, 1 (ReLU) or 2 (ReLU6).

    epf = (lo, hi, s_in/s_out, s_out (0 = float output), q_lo, q_hi, z_out, then 1, z_t, s_t where a
    table op's codes on its grid (zero point z_t, scale s_t) replace the output's (`table` = (z_t, s_t),
    on an output grid only), else 0, 0, 0), in output steps."""
    f32 = np.float32
    a = np.asarray(alpha, f32)
    s_in = f32(s_in)
    s_out, z_out = (f32(1), 0) if out_grid is None else (f32(out_grid[0]), int(out_grid[3]))
    # MNN's order (CPUConvolution::updateInputOutputScale): its weight kernel sum is float(sum w) * alpha,
    # then times (z_in + 128), then times s_in. Another order lands on other rounding ties (an output byte
    # of PP-OCRv4's detector stem rounded 12.5 -> 13 where MNN gives 12)
    off = (np.asarray(weight_sums, np.int64).astype(f32) * a) * f32(128 + zero_in) * s_in
    b = ((np.asarray(bias, f32) - off) / s_out).astype(f32)
    if out_grid is not None:
        b = (b + f32(z_out)).astype(f32)
    z = f32(z_out)
    lo, hi = act_bounds(act, s_out, z)
    if out_grid is None:
        epf = (lo, hi, s_in, f32(0), f32(-np.inf), f32(np.inf), f32(0), f32(0), f32(0), f32(0))
    else:
        t = (f32(0), f32(0), f32(0)) if table is None else (f32(1), f32(table[0]), f32(table[1]))
        epf = (lo, hi, f32(s_in / s_out), s_out, f32(out_grid[1] + z_out), f32(out_grid[2] + z_out), z, *t)
    return (a, b), epf


class Int8Weights:
    """An (OC, K) int8 weight packed for the tile, with its epilogue rows padded to whole tiles."""

    def __init__(self, wq: np.ndarray, scale, bias, work: int, threads: int):
        """`work`: element operations per call, to run serially when small (see kernels.sized)."""
        oc, k = wq.shape
        self.oc, self.k4 = oc, -(-k // 4)
        rows = -(-oc // OCB) * OCB
        full = np.zeros((rows, self.k4 * 4), np.int8)
        full[:oc, :k] = wq
        self.data = np.ascontiguousarray(full.reshape(rows // OCB, OCB, self.k4, 4).transpose(0, 2, 1, 3)).reshape(-1)
        # epilogue rows padded to whole tiles of either kernel (int8_lanes_oc reads vectors of 16, 32 a tile)
        extra = -(-oc // EP_ROWS) * EP_ROWS - oc
        pad = lambda a, dt: np.concatenate([np.asarray(a, dt), np.zeros(extra, dt)])  # noqa: E731
        self.ep = (pad(scale, np.float32), pad(bias, np.float32))
        from .. import sized
        self.gemm = sized(gemm_vnni, work, threads)
        self.grid_gemm = sized(gemm_planes, work, threads)

    def matmul(self, x: np.ndarray, epf: tuple, out: np.ndarray, tab: np.ndarray = NO_TABLE) -> None:
        """out (OC, P) float32; tab: a table op's values by output byte from the lowest (epf[7] set)."""
        self.gemm(x, self.data, self.k4, self.oc, self.ep, epf, out, tab)

    def matmul_grid(self, g: np.ndarray, offs: np.ndarray, epf: tuple, out: np.ndarray, blk: np.ndarray,
                    tab: np.ndarray = NO_TABLE) -> None:
        """out (OC, P) float32 of a stride-1 window straight from the quantized grid (gemm_planes)."""
        self.grid_gemm(g, offs, self.data, self.k4, self.oc, self.ep, epf, out, tab, blk)
