"""Row softmax as AVX-512 LLVM IR: a pass for the row's max, a pass writing e = exp(x - max) and
summing it, a pass scaling by 1 / sum, 16 floats a step with a masked tail.

The Numba loops of norm.softmax_rows took 1.4 ns an element on attention scores (its max and 2^k
passes do not vectorize well); attention's softmax over (16, 256, 256) scores was a third of
MobileViT's time. exp is actir's (Cephes: relative error ~1e-7).
"""
from __future__ import annotations

from numba import njit, prange, types
from numba.extending import intrinsic

from .llvmir import data_of, declare, first_lanes, k_loop, vector_ops


@intrinsic
def _softmax_row(typingctx, x, xo, out, oo, n, scale):
    """out[oo:oo+n] = softmax(scale * x[xo:xo+n]) for scale > 0 (exp((x - max) * scale): 1 changes
    nothing); a row of -inf (fully masked) gives NaN, as exp(x - max) / sum does."""
    from llvmlite import ir
    sig = types.void(x, types.intp, out, types.intp, types.intp, types.float32)

    def codegen(context, builder, sig, args):
        from .actir import VectorMath
        xa, xo_, oa, oo_, n_, scale_ = args
        i32, f32 = ir.IntType(32), ir.FloatType()
        f16 = ir.VectorType(f32, 16)
        xp = data_of(context, builder, sig.args[0], xa, xo_)
        op = data_of(context, builder, sig.args[2], oa, oo_)
        _, mload, mstore = vector_ops(builder)
        vm = VectorMath(builder)
        four = ir.Constant(i32, 4)
        vmax = declare(builder, "llvm.vector.reduce.fmax.v16f32", f32, f16)
        vadd = declare(builder, "llvm.vector.reduce.fadd.v16f32", f32, f32, f16)
        ninf = ir.Constant(f16, [float("-inf")] * 16)

        def loop(init, body):
            """for j in 0, 16, ... < n: accs = body(j, mask of the lanes before n, accs)."""
            return k_loop(builder, n_, init, lambda j, accs: body(j, first_lanes(builder, builder.sub(n_, j)), accs),
                          step=16)

        def at(p, j):
            return builder.bitcast(builder.gep(p, [j]), f16.as_pointer())

        (mv,) = loop([ninf], lambda j, m, a: [vm.max(a[0], builder.call(mload, [at(xp, j), four, m, ninf]))])
        row_max = builder.call(vmax, [mv])
        mx = builder.insert_element(ir.Constant(f16, ir.Undefined), row_max, ir.Constant(i32, 0))
        mx = builder.shuffle_vector(mx, mx, ir.Constant(ir.VectorType(i32, 16), [0] * 16))

        sc = builder.insert_element(ir.Constant(f16, ir.Undefined), scale_, ir.Constant(i32, 0))
        sc = builder.shuffle_vector(sc, sc, ir.Constant(ir.VectorType(i32, 16), [0] * 16))

        def exps(j, m, a):
            e = vm.exp_neg(builder.fmul(builder.fsub(builder.call(mload, [at(xp, j), four, m, ninf]), mx), sc))
            e = builder.select(m, e, vm.c(0.0))
            builder.call(mstore, [e, at(op, j), four, m])
            return [builder.fadd(a[0], e)]
        (sv,) = loop([vm.c(0.0)], exps)
        total = builder.call(vadd, [ir.Constant(f32, 0.0), sv], fastmath=("reassoc",))     # a tree, not 16 adds in turn
        masked = builder.fcmp_ordered("==", row_max, ir.Constant(f32, float("-inf")))
        inv = builder.select(masked, ir.Constant(f32, float("nan")), builder.fdiv(ir.Constant(f32, 1.0), total))
        iv = builder.insert_element(ir.Constant(f16, ir.Undefined), inv, ir.Constant(i32, 0))
        iv = builder.shuffle_vector(iv, iv, ir.Constant(ir.VectorType(i32, 16), [0] * 16))

        def scale(j, m, a):
            v = builder.call(mload, [at(op, j), four, m, vm.c(0.0)])
            builder.call(mstore, [builder.fmul(v, iv), at(op, j), four, m])
            return []
        loop([], scale)
        return context.get_dummy_value()
    return sig, codegen


@njit(parallel=True, cache=True)
def softmax_rows_ir(x, out, scale):
    """out[r] = softmax(scale * x[r]) over the rows of (R, N) C-contiguous arrays (scale > 0, float32)."""
    n = x.shape[1]
    xf, of = x.reshape(-1), out.reshape(-1)
    for r in prange(x.shape[0]):
        _softmax_row(xf, r * n, of, r * n, n, scale)

