"""The inner product of the engine's GEMV: a few weight rows (GROUP) at once, read as `llm.mnn.weight` stores them.

    out[oo + r] = sum over blocks b of s[so + r*ss + b] * (stored values of row r in block b . x_b)

for rows r < n (n <= GROUP). The stored values are converted in registers, 16 lanes at a time:
    u4   two per byte, high nibble first (the file's order): x must come permuted per 32 values, odd
         positions first then even ones (`permute32`), so that the low nibbles of 16 bytes meet 16
         contiguous x and the high nibbles the next 16;
    u8   one per byte, unsigned (stored = q + 128);
    f16  IEEE half (16-bit weights), one block spanning the row, s = 1.
The block offsets (zero - 2^(bits-1) * scale, times the block's sum of x) and the bias are the caller's:
they are a short product over blocks. One zmm accumulator per row and block.
"""
from __future__ import annotations

from ...runtime.kernels.micro.float_gemv import row_sums16
from ...runtime.kernels.compile.jit import intrinsic, types
from ...runtime.kernels.micro.llvm_ir import data_of, first_lanes, k_loop, splat, vector_ops

GROUP = 4       # rows per call: 4 streams read faster from memory than 16 here (5.7 against 3.8 GB/s
#                 cold at one thread, AMD EPYC; the same warm), and keep 4 FMA chains in flight


KINDS = {"u4": (32, 16), "u8": (16, 16), "f16": (16, 32)}     # values and bytes per 16-lane step


def _codegen(kind: str, R: int = GROUP):
    per_step, bytes_step = KINDS[kind]

    def qdot(typingctx, q, qo, qs, x, k, blk, s, so, ss, out, oo, n):
        """Rows r < n (n <= R); q: uint8 bytes; qo: byte offset of row 0; qs: bytes per row; k values per row, blk per block."""
        from llvmlite import ir
        sig = types.void(q, types.intp, types.intp, x, types.intp, types.intp, s, types.intp, types.intp, out,
                         types.intp, types.intp)

        def codegen(context, builder, sig, args):
            qa, qo_, qs_, xa, k_, blk_, sa, so_, ss_, oa, oo_, n_ = args
            i8, i16t, i32, i64, f32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64), ir.FloatType()
            f16v, b16, w16 = ir.VectorType(f32, 16), ir.VectorType(i8, 16), ir.VectorType(i32, 16)
            h16 = ir.VectorType(ir.HalfType(), 16)
            s16 = ir.VectorType(i16t, 16)
            fma, _, mstore = vector_ops(builder)
            const = lambda v: ir.Constant(i64, v)   # noqa: E731
            qp = data_of(context, builder, sig.args[0], qa, qo_)
            xp = data_of(context, builder, sig.args[3], xa)
            sp = data_of(context, builder, sig.args[6], sa, so_)
            op = data_of(context, builder, sig.args[9], oa, oo_)
            zero = ir.Constant(f16v, [0.0] * 16)
            live = [builder.icmp_signed("<", const(r), n_) for r in range(R)]
            # rows past n read row 0 again (in bounds) and are never stored
            rows = [builder.gep(qp, [builder.select(live[r], builder.mul(const(r), qs_), const(0))]) for r in range(R)]
            srow = [builder.gep(sp, [builder.select(live[r], builder.mul(const(r), ss_), const(0))]) for r in range(R)]
            steps = builder.sdiv(blk_, const(per_step))
            bytes_per_block = builder.mul(steps, const(bytes_step))
            fvec = lambda p, at: builder.bitcast(builder.gep(p, [at]), f16v.as_pointer())  # noqa: E731

            def block(b, tots):
                qbase = builder.mul(b, bytes_per_block)
                xbase = builder.mul(b, blk_)

                def step(kk, accs):
                    qat = builder.add(qbase, builder.mul(kk, const(bytes_step)))
                    xat = builder.add(xbase, builder.mul(kk, const(per_step)))
                    x0 = builder.load(fvec(xp, xat), align=4)
                    x1 = builder.load(fvec(xp, builder.add(xat, const(16))), align=4) if kind == "u4" else None
                    new = []
                    for r in range(R):
                        ptr = builder.gep(rows[r], [qat])
                        if kind == "f16":
                            raw = builder.load(builder.bitcast(ptr, s16.as_pointer()), align=1)
                            w = builder.fpext(builder.bitcast(raw, h16), f16v)
                            new.append(builder.call(fma, [w, x0, accs[r]]))
                            continue
                        raw = builder.load(builder.bitcast(ptr, b16.as_pointer()), align=1)
                        wide = builder.zext(raw, w16)
                        if kind == "u4":
                            lo = builder.uitofp(builder.and_(wide, ir.Constant(w16, [15] * 16)), f16v)
                            hi = builder.uitofp(builder.lshr(wide, ir.Constant(w16, [4] * 16)), f16v)
                            acc = builder.call(fma, [lo, x0, accs[r]])
                            new.append(builder.call(fma, [hi, x1, acc]))
                        else:
                            new.append(builder.call(fma, [builder.uitofp(wide, f16v), x0, accs[r]]))
                    return new
                accs = k_loop(builder, steps, [zero] * R, step)
                out = []
                for r in range(R):
                    sv = splat(builder, builder.load(builder.gep(srow[r], [b])), f16v)
                    out.append(builder.call(fma, [accs[r], sv, tots[r]]))
                return out
            tots = k_loop(builder, builder.sdiv(k_, blk_), [zero] * R, block)
            builder.call(mstore, [row_sums16(builder, tots), builder.bitcast(op, f16v.as_pointer()), ir.Constant(i32, 4),
                                  first_lanes(builder, n_)])
            return context.get_dummy_value()
        return sig, codegen
    qdot.__name__ = qdot.__qualname__ = f"qdot{R}_{kind}"
    return qdot


qdot_u4 = intrinsic(_codegen("u4"))
qdot_u8 = intrinsic(_codegen("u8"))
qdot_f16 = intrinsic(_codegen("f16"))
