"""u8 x s8 -> s32 products for int8 convolutions, rescaled to the output's int8 grid in the same pass.

Numba/LLVM does not turn byte dot products into VPDPBUSD (it widens to 32-bit lanes, a quarter of the
rate), so on CPUs with AVX-512 VNNI the micro-kernel is LLVM IR: a tile of 32 pixels x 8 output
channels in 16 zmm accumulators, one VPDPBUSD per (16 pixels, channel, 4 k); its epilogue rescales the
accumulator in MNN's own float order (`epilogue`), so each byte is MNN's, applies the activation and
rounds to the output grid, and stores float rows of the NCHW output (masked at the row end and past
the last channel). Several times OpenBLAS's sgemm rate here.
Without VNNI, int8 layers run on the float kernels on the int8 grid (`conv._grid_input`).

Layouts: activations packed as [P/16][K/4][16 pixels][4 bytes] uint8 (`pixel_blocks`), weights as
[OC/8][K/4][8][4] int8 (`Int8Weights`); K is a multiple of 4.
"""
from __future__ import annotations

import numpy as np
from ..compile.jit import njit, prange, types, intrinsic

from .epilogue import act_bounds
from .llvm_ir import data_of, declare, first_lanes, host_has, k_loop, splat as splat_

PIX, OCB = 32, 8          # tile: pixels x output channels


HAS_VNNI = host_has("avx512vnni")


def pixel_blocks(pixels: int) -> int:
    """Number of 16-pixel blocks the packed activations hold: whole tiles, so a tile never reads past."""
    return -(-pixels // PIX) * (PIX // 16)


@intrinsic
def _tile(typingctx, x, xoff, w, woff, k4, out, ooff, ostride, left, rows, ep, epf):
    """out[o, p] for 32 pixels x 8 channels; ep = (scale, bias) rows at the tile's channel, epf = the
    `Epilogue` floats; `left` = valid pixels from the tile start, `rows` = valid channels (out has no
    rows past them)."""
    from llvmlite import ir
    sig = types.void(x, types.intp, w, types.intp, types.intp, out, types.intp, types.intp, types.intp, types.intp,
                     ep, epf)

    def codegen(context, builder, sig, args):
        xa, xo, wa, wo, nk, oa, oo, os_, left_, rows_, epa, epfa = args
        i1, i32, i64, f32 = ir.IntType(1), ir.IntType(32), ir.IntType(64), ir.FloatType()
        v16, f16 = ir.VectorType(i32, 16), ir.VectorType(f32, 16)
        a = sig.args
        xp = data_of(context, builder, a[0], xa, xo)
        wp = data_of(context, builder, a[2], wa, wo)
        op = data_of(context, builder, a[5], oa, oo)
        const = lambda v: ir.Constant(i64, v)   # noqa: E731
        fn = lambda name, ret, *t: declare(builder, name, ret, *t)  # noqa: E731
        dpbusd = fn("llvm.x86.avx512.vpdpbusd.512", v16, v16, v16, v16)
        mstore = fn("llvm.masked.store.v16f32.p0", ir.VoidType(), f16, f16.as_pointer(), i32, ir.VectorType(i1, 16))
        splat = lambda value, vt: splat_(builder, value, vt)  # noqa: E731

        def step(kk, accs):
            xv = []
            for v in range(2):      # the two 16-pixel blocks: block b starts at b * k4 * 64 bytes
                at = builder.add(builder.mul(const(v), builder.mul(nk, const(64))), builder.mul(kk, const(64)))
                xv.append(builder.load(builder.bitcast(builder.gep(xp, [at]), v16.as_pointer()), align=1))
            wrow = builder.bitcast(builder.gep(wp, [builder.mul(kk, const(4 * OCB))]), i32.as_pointer())
            new = []
            for o in range(OCB):
                wb = splat(builder.load(builder.gep(wrow, [const(o)]), align=1), v16)
                for v in range(2):
                    new.append(builder.call(dpbusd, [accs[2 * o + v], xv[v], wb]))
            return new
        new = k_loop(builder, nk, [ir.Constant(v16, [0] * 16)] * (2 * OCB), step)

        ept = [builder.extract_value(epa, k) for k in range(2)]
        rows = [data_of(context, builder, sig.args[10].types[k], ept[k]) for k in range(2)]
        lo, hi, ratio, s_out, q_lo, q_hi, z_out = (splat(builder.extract_value(epfa, k), f16) for k in range(7))
        on_grid = builder.fcmp_ordered("!=", builder.extract_value(epfa, 3), ir.Constant(f32, 0))
        trunc = fn("llvm.trunc.v16f32", f16, f16)
        copysign = fn("llvm.copysign.v16f32", f16, f16, f16)
        half = ir.Constant(f16, [0.5] * 16)

        def clamp(v, low, high):     # compare and select, as MNN's vminps/vmaxps on finite values
            v = builder.select(builder.fcmp_ordered("<", v, low), low, v)
            return builder.select(builder.fcmp_ordered(">", v, high), high, v)
        none = ir.Constant(ir.VectorType(i1, 16), [0] * 16)
        for v in range(2):
            mask = first_lanes(builder, builder.sub(left_, const(16 * v)))
            for o in range(OCB):
                sc = builder.load(builder.gep(rows[0], [const(o)]))
                bi = builder.load(builder.gep(rows[1], [const(o)]))
                # MNN's order, each step rounded to float32 (no FMA): D * alpha * (s_in/s_out) + bias
                val = builder.sitofp(new[2 * o + v], f16)
                val = builder.fmul(builder.fmul(val, splat(sc, f16)), ratio)
                val = clamp(builder.fadd(val, splat(bi, f16)), lo, hi)
                q = builder.call(trunc, [builder.fadd(val, builder.call(copysign, [half, val]))])
                q = builder.fmul(builder.fsub(clamp(q, q_lo, q_hi), z_out), s_out)
                val = builder.select(on_grid, q, val)
                at = builder.add(builder.mul(const(o), os_), const(16 * v))
                dst = builder.bitcast(builder.gep(op, [at]), f16.as_pointer())
                live = builder.icmp_signed("<", const(o), rows_)
                builder.call(mstore, [val, dst, ir.Constant(i32, 4), builder.select(live, mask, none)])
        return context.get_dummy_value()
    return sig, codegen


@njit(parallel=True, cache=True)
def gemm_vnni(x, wp, k4, oc, ep, epf, out):
    """out (OC, P) float from packed activations and weights; ep = (scale, bias) rows."""
    P = out.shape[1]
    npb, nob = (P + PIX - 1) // PIX, (oc + OCB - 1) // OCB
    of = out.reshape(-1)
    scale, bias = ep
    for t in prange(nob * npb):
        ob, pb = t // npb, t % npb
        o0 = ob * OCB
        _tile(x, pb * 2 * k4 * 64, wp, ob * k4 * 4 * OCB, k4, of, o0 * P + pb * PIX, P, P - pb * PIX, oc - o0,
              (scale[o0:], bias[o0:]), epf)


def epilogue(alpha, bias, weight_sums, s_in: float, zero_in: int, out_grid, act: int):
    """The tile's (scale, bias) rows and epilogue floats for the rescale MNN 3.6's x86 int8 GEMM does
    (its AVX2 kernel, read from the binary and checked on the values it was handed; the pip wheel has
    no AVX-512 int8 code): from the accumulator D over the stored bytes u = q + 128,
    v = fl(fl(fl(float(D) * alpha) * (s_in / s_out)) + b'), b' = fl(fl((b - sum(w) * alpha * 128' * s_in)
    / s_out) + z_out) with 128' = 128 + zero_in, all float32 left to right; clamped to the activation,
    rounded half away from zero (fl(v +- 0.5) truncated), clamped to the byte range; a float output takes
    s_out = 1 and z_out = 0 and stops before the rounding. `out_grid` = (s_out, lo, hi, z_out) in steps
    of the scale from real 0 (conv.Int8Grids), or None for a float output; act 0, 1 (ReLU) or 2 (ReLU6).

    epf = (lo, hi, s_in/s_out, s_out (0 = float output), q_lo, q_hi, z_out), in output steps."""
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
        epf = (lo, hi, s_in, f32(0), f32(-np.inf), f32(np.inf), f32(0))
    else:
        epf = (lo, hi, f32(s_in / s_out), s_out, f32(out_grid[1] + z_out), f32(out_grid[2] + z_out), z)
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
        pad = lambda a, dt: np.concatenate([np.asarray(a, dt), np.zeros(rows - oc, dt)])  # noqa: E731
        self.ep = (pad(scale, np.float32), pad(bias, np.float32))
        from .. import sized
        self.gemm = sized(gemm_vnni, work, threads)

    def matmul(self, x: np.ndarray, epf: tuple, out: np.ndarray) -> None:
        """out (OC, P) float32."""
        self.gemm(x, self.data, self.k4, self.oc, self.ep, epf, out)
