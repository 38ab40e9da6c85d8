"""Matrix-vector product on weight-only int8/int4 weights, read as they are stored: a decoder's
single-token step, where every weight comes from memory once per token and the float weights'
bytes are the time (dim-512 decoder: 10 ms per token at 1 thread, ~90 MB of fp32 weights).

Each block of B weights of a row has a scale s and an offset o (w = s*u + o, u the stored code), so
    y[r] = sum_b s[r,b] * (u[r,b] . x[b]) + sum_b o[r,b] * sum(x[b]) + bias[r]:
the first sum on codes converted in registers (16 rows side by side, as float_gemv.MatVec), the second a
small product over block sums. int4 codes are two per byte: byte j of each 32-code group holds codes
j (low nibble) and j+16 (high), so one 16-byte load feeds two 16-lane FMAs on contiguous x.
"""
from __future__ import annotations

import numpy as np
from ..compile.jit import njit, prange, types, intrinsic

from .float_gemv import ROWS, row_sums16
from .llvm_ir import data_of, first_lanes, k_loop, splat, vector_ops


def _codegen_qdot16(nibbles: bool):
    def qdot16(typingctx, q, qo, qs, x, k, blk, s, so, ss, out, oo, n):
        """out[oo + r] = sum over blocks b of s[so + r*ss + b] * (codes of row r in block b . x), rows
        r < n (n <= 16); k a multiple of blk, blk of 16 (int8) or 32 (int4) codes."""
        from llvmlite import ir
        sig = types.void(q, types.intp, types.intp, x, types.intp, types.intp, s, types.intp, types.intp, out,
                         types.intp, types.intp)

        def codegen(context, builder, sig, args):
            qa, qo_, qs_, xa, k_, blk_, sa, so_, ss_, oa, oo_, n_ = args
            i8, i32, i64, f32 = ir.IntType(8), ir.IntType(32), ir.IntType(64), ir.FloatType()
            f16, b16, i16 = ir.VectorType(f32, 16), ir.VectorType(i8, 16), ir.VectorType(i32, 16)
            fma, _, mstore = vector_ops(builder)
            const = lambda v: ir.Constant(i64, v)   # noqa: E731
            qp = data_of(context, builder, sig.args[0], qa, qo_)
            xp = data_of(context, builder, sig.args[3], xa)
            sp = data_of(context, builder, sig.args[6], sa, so_)
            op = data_of(context, builder, sig.args[9], oa, oo_)
            zero = ir.Constant(f16, [0.0] * 16)
            live = [builder.icmp_signed("<", const(r), n_) for r in range(ROWS)]
            # rows past n read row 0 again (in bounds) and are never stored
            rows = [builder.gep(qp, [builder.select(live[r], builder.mul(const(r), qs_), const(0))]) for r in range(ROWS)]
            srow = [builder.gep(sp, [builder.select(live[r], builder.mul(const(r), ss_), const(0))]) for r in range(ROWS)]
            per_byte = 2 if nibbles else 1
            bytes_per_block = builder.sdiv(blk_, const(per_byte))
            steps = builder.sdiv(bytes_per_block, const(16))
            fvec = lambda p, at: builder.bitcast(builder.gep(p, [at]), f16.as_pointer())  # noqa: E731

            def block(b, tots):
                qbase = builder.mul(b, bytes_per_block)
                xbase = builder.mul(b, blk_)

                def step(kk, accs):
                    qat = builder.add(qbase, builder.mul(kk, const(16)))
                    xat = builder.add(xbase, builder.mul(kk, const(16 * per_byte)))
                    x0 = builder.load(fvec(xp, xat), align=4)
                    x1 = builder.load(fvec(xp, builder.add(xat, const(16))), align=4) if nibbles else None
                    new = []
                    for r in range(ROWS):
                        raw = builder.load(builder.bitcast(builder.gep(rows[r], [qat]), b16.as_pointer()), align=1)
                        if nibbles:
                            wide = builder.zext(raw, i16)
                            lo = builder.uitofp(builder.and_(wide, ir.Constant(i16, [15] * 16)), f16)
                            hi = builder.uitofp(builder.lshr(wide, ir.Constant(i16, [4] * 16)), f16)
                            acc = builder.call(fma, [lo, x0, accs[r]])
                            new.append(builder.call(fma, [hi, x1, acc]))
                        else:
                            new.append(builder.call(fma, [builder.sitofp(builder.sext(raw, i16), f16), x0, accs[r]]))
                    return new
                accs = k_loop(builder, steps, [zero] * ROWS, step)
                out = []
                for r in range(ROWS):
                    sv = splat(builder, builder.load(builder.gep(srow[r], [b])), f16)
                    out.append(builder.call(fma, [accs[r], sv, tots[r]]))
                return out
            tots = k_loop(builder, builder.sdiv(k_, blk_), [zero] * ROWS, block)
            builder.call(mstore, [row_sums16(builder, tots), builder.bitcast(op, f16.as_pointer()), ir.Constant(i32, 4),
                                  first_lanes(builder, n_)])
            return context.get_dummy_value()
        return sig, codegen
    return qdot16


qdot16_i8 = intrinsic(_codegen_qdot16(False))
qdot16_u4 = intrinsic(_codegen_qdot16(True))


@njit(cache=True, fastmath=True)
def _block_sums(x, blk, xs):
    for b in range(xs.size):
        t = np.float32(0)
        for j in range(b * blk, (b + 1) * blk):
            t += x[j]
        xs[b] = t


@njit(parallel=True, cache=True)
def qmatvec(codes, nibbles, s, off, bias, x, xs, blk, lo, hi, y):
    """y = clip(sum_b s*(codes . x_b) + off . xs + bias, lo, hi): codes int8 (O, K), or with `nibbles`
    uint8 (O, K/2) two to a byte."""
    O, rb = codes.shape
    K = rb * 2 if nibbles else rb
    nb = s.shape[1]
    _block_sums(x, blk, xs)
    cf, sf = codes.reshape(-1), s.reshape(-1)
    for g in prange((O + ROWS - 1) // ROWS):
        o = g * ROWS
        n = min(ROWS, O - o)
        if nibbles:
            qdot16_u4(cf, o * rb, rb, x, K, blk, sf, o * nb, nb, y, o, n)
        else:
            qdot16_i8(cf, o * rb, rb, x, K, blk, sf, o * nb, nb, y, o, n)
        for r in range(o, o + n):
            t = y[r] + bias[r]
            for b in range(nb):
                t += off[r, b] * xs[b]
            y[r] = min(max(t, lo), hi)


def codes_of(qp: dict, rows: int):
    """(codes (rows, K) as stored, scale (rows, nb), offset (rows, nb), bits) of a weight-only IDSTQuan
    table, w = scale*code + offset per block (MNN's loader's meaning, format.idst.dequantize); None for
    fp16 or tables this kernel does not read."""
    from ....format.idst import unpack
    if int(qp.get("type", 1)) != 1 or not len(qp.get("alpha", ())):
        return None
    q, bits = unpack(np.asarray(qp["buffer"]).astype(np.int8))
    alpha = np.asarray(qp["alpha"], np.float64)
    asymmetric = int(qp.get("readType", 0) or 0) != 0
    groups = alpha.size // 2 if asymmetric else alpha.size
    if bits not in (4, 8) or groups == 0 or q.size % groups or groups % rows:
        return None
    nb = groups // rows
    if asymmetric:
        qmin = int(qp.get("aMin", 0) or 0) or -128
        lo, scale = alpha[0::2], alpha[1::2]
        offset = lo - qmin * scale
    else:
        scale, offset = alpha, np.zeros_like(alpha)
    return (q.reshape(rows, -1).astype(np.int8), scale.reshape(rows, nb).astype(np.float32),
            offset.reshape(rows, nb).astype(np.float32), bits)


def pack_nibbles(u: np.ndarray) -> np.ndarray:
    """Codes 0..15 (O, K), K a multiple of 32 -> (O, K/2) bytes: byte j of each group of 32 holds code j
    in its low nibble and code j+16 in its high one."""
    o, k = u.shape
    g = u.reshape(o, k // 32, 2, 16).astype(np.uint8)
    return (g[:, :, 0, :] | (g[:, :, 1, :] << 4)).reshape(o, k // 2)


class QMatVec:
    """y = clip(w @ x + bias) for a weight-only quantized w kept as codes (see the module's doc); None
    from `of` when the layout does not suit (blocks not a multiple of 16/32 codes)."""

    def __init__(self, codes, scale, offset, bits, bias, act: int, threads: int):
        from .. import sized
        from .float_gemm import epilogue
        from .epilogue import NO_GRID
        rows, k = codes.shape
        self.blk = k // scale.shape[1]
        if bits == 4:        # stored signed (-8..7); as codes 0..15 the offset takes the shift
            offset = offset - 8 * scale
            self.codes = pack_nibbles(codes.astype(np.int16) + 8)
        else:
            self.codes = np.ascontiguousarray(codes, np.int8)
        self.nibbles, self.fn = bits == 4, sized(qmatvec, self.codes.size, threads)
        self.scale, self.offset = np.ascontiguousarray(scale), np.ascontiguousarray(offset, np.float32)
        self.bias = np.zeros(rows, np.float32) if bias is None else np.ascontiguousarray(bias, np.float32)
        self.lo, self.hi = epilogue(act, NO_GRID)[:2]
        self.xs = np.empty(scale.shape[1], np.float32)

    @staticmethod
    def of(qp: dict, rows: int, bias, act: int, threads: int):
        got = codes_of(qp, rows)
        if got is None:
            return None
        codes, scale, offset, bits = got
        blk = codes.shape[1] // scale.shape[1]
        if blk % (32 if bits == 4 else 16):
            return None
        return QMatVec(codes, scale, offset, bits, bias, act, threads)

    def __call__(self, x, y) -> None:
        """x (K,), y (O,) float32 C-contiguous."""
        self.fn(self.codes, self.nibbles, self.scale, self.offset, self.bias, x, self.xs, self.blk, self.lo, self.hi, y)
