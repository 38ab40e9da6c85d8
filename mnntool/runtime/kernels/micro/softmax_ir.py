"""Row softmax as AVX-512 LLVM IR: a pass for the row's max, a pass writing e = exp(x - max) and
summing it, a pass scaling by 1 / sum, 16 floats a step with a masked tail.

The Numba loops of norm.softmax_rows took 1.4 ns an element on attention scores (its max and 2^k
passes do not vectorize well); attention's softmax over (16, 256, 256) scores was a third of
MobileViT's time. exp is activation_ir's (Cephes: relative error ~1e-7).
"""
from __future__ import annotations

from ..compile.jit import njit, prange, types, intrinsic

from .llvm_ir import data_of, declare, first_lanes, k_loop, splat, vector_ops


def emit_softmax(builder, srcs, dsts, n, scale, guard=None):
    """IR for dst = softmax(scale * src[:n]) on each pair of float pointers, the rows' passes
    interleaved (one row's passes are latency-bound chains: four rows in turn cost 2.2 of a tiny
    GPT-2 attention step's 4.2 us); a row of -inf gives NaN, as exp(x - max) / sum does; where the
    i1 `guard` is set, a NaN result is 0. The row sums as a tree (reduce.fadd with reassoc), not 16
    adds in turn."""
    from llvmlite import ir

    from .activation_ir import VectorMath
    f32, i32 = ir.FloatType(), ir.IntType(32)
    f16 = ir.VectorType(f32, 16)
    _, mload, mstore = vector_ops(builder)
    vm = VectorMath(builder)
    four = ir.Constant(i32, 4)
    vmax = declare(builder, "llvm.vector.reduce.fmax.v16f32", f32, f16)
    vadd = declare(builder, "llvm.vector.reduce.fadd.v16f32", f32, f32, f16)
    ninf = ir.Constant(f16, [float("-inf")] * 16)
    rows = range(len(srcs))

    def at(p, j):
        return builder.bitcast(builder.gep(p, [j]), f16.as_pointer())

    def loop(init, body):
        """for j in 0, 16, ... < n: accs = body(j, mask of the lanes before n, accs)."""
        return k_loop(builder, n, init, lambda j, accs: body(j, first_lanes(builder, builder.sub(n, j)), accs), step=16)

    maxes = loop([ninf] * len(srcs), lambda j, m, a: [vm.max(a[r], builder.call(mload, [at(srcs[r], j), four, m, ninf]))
                                                      for r in rows])
    row_max = [builder.call(vmax, [v]) for v in maxes]
    mx = [splat(builder, v, f16) for v in row_max]
    sc = splat(builder, scale, f16)

    def exps(j, m, a):
        out = []
        for r in rows:
            x = builder.call(mload, [at(srcs[r], j), four, m, ninf])
            e = builder.select(m, vm.exp_neg(builder.fmul(builder.fsub(x, mx[r]), sc)), vm.c(0.0))
            builder.call(mstore, [e, at(dsts[r], j), four, m])
            out.append(builder.fadd(a[r], e))
        return out
    sums = loop([vm.c(0.0)] * len(srcs), exps)
    inv = []
    for r in rows:
        total = builder.call(vadd, [ir.Constant(f32, 0.0), sums[r]], fastmath=("reassoc",))
        masked = builder.fcmp_ordered("==", row_max[r], ir.Constant(f32, float("-inf")))
        inv.append(splat(builder, builder.select(masked, ir.Constant(f32, float("nan")),
                                                 builder.fdiv(ir.Constant(f32, 1.0), total)), f16))
    on = None if guard is None else splat(builder, guard, ir.VectorType(ir.IntType(1), 16))

    def finish(j, m, a):
        for r in rows:
            v = builder.fmul(builder.call(mload, [at(dsts[r], j), four, m, vm.c(0.0)]), inv[r])
            if on is not None:
                v = builder.select(builder.and_(on, builder.fcmp_unordered("uno", v, v)), vm.c(0.0), v)
            builder.call(mstore, [v, at(dsts[r], j), four, m])
        return []
    loop([], finish)


@intrinsic
def _softmax_row(typingctx, x, xo, out, oo, n, scale):
    """out[oo:oo+n] = softmax(scale * x[xo:xo+n]) for scale > 0 (exp((x - max) * scale): 1 changes
    nothing); a row of -inf (fully masked) gives NaN, as exp(x - max) / sum does."""
    sig = types.void(x, types.intp, out, types.intp, types.intp, types.float32)

    def codegen(context, builder, sig, args):
        xa, xo_, oa, oo_, n_, scale_ = args
        emit_softmax(builder, [data_of(context, builder, sig.args[0], xa, xo_)],
                     [data_of(context, builder, sig.args[2], oa, oo_)], n_, scale_)
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def _softmax_row4(typingctx, x, xo, out, oo, n, scale):
    """_softmax_row on the four rows at xo, xo + n, ... (out likewise), their passes interleaved."""
    sig = types.void(x, types.intp, out, types.intp, types.intp, types.float32)

    def codegen(context, builder, sig, args):
        xa, xo_, oa, oo_, n_, scale_ = args
        at = [builder.mul(n_, n_.type(k)) for k in range(4)]
        emit_softmax(builder, [data_of(context, builder, sig.args[0], xa, builder.add(xo_, d)) for d in at],
                     [data_of(context, builder, sig.args[2], oa, builder.add(oo_, d)) for d in at], n_, scale_)
        return context.get_dummy_value()
    return sig, codegen


ROWS_TOGETHER = 4   # rows a call of _softmax_row4 takes; rows under SHORT_ROW floats go that way
SHORT_ROW = 256     # a row's passes are latency-bound chains below this: Swin's 49-wide window scores


@njit(parallel=True, cache=True)
def softmax_rows_ir(x, out, scale):
    """out[r] = softmax(scale * x[r]) over the rows of (R, N) C-contiguous arrays (scale > 0, float32).
    Short rows four at a time, their passes interleaved (one row's max, exp-sum and scale passes are
    dependent chains of a few vectors: Swin's (64 x 3 x 49, 49) scores took 1.36 ns an element)."""
    n = x.shape[1]
    xf, of = x.reshape(-1), out.reshape(-1)
    quads = x.shape[0] // ROWS_TOGETHER if n < SHORT_ROW else 0
    for q in prange(quads):
        r = q * ROWS_TOGETHER
        _softmax_row4(xf, r * n, of, r * n, n, scale)
    for r in prange(quads * ROWS_TOGETHER, x.shape[0]):
        _softmax_row(xf, r * n, of, r * n, n, scale)

