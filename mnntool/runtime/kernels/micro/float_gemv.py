"""Matrix-vector product for a batch-1 fully connected layer (a classifier's 1280x1000 weights).

Its weights (5 MB) come from memory on every run: the layers before evict them from cache. BLAS's
sgemv walks them as one or two streams and reached 15 GB/s from memory here (1280x1000: 0.33 ms);
this kernel reads 16 weight rows side by side (16 streams keep more cache-line loads in flight, so
the memory latency overlaps) with one zmm accumulator per row: 0.17 ms on the same cold weights, and
0.074 against 0.077 ms warm.
"""
from __future__ import annotations

from ..compile.jit import njit, prange, types, intrinsic

from .float_gemm import prefetch_lines
from .llvm_ir import data_of, first_lanes, host_has, k_loop, vector_ops

HAS_AVX512 = host_has("avx512f")
ROWS = 16
# Rows shorter than this many floats are streams too short for the hardware prefetchers: each block of
# rows prefetches the next (an SE block's 960x240 weights from L3, 1 thread: 79 -> 45 us, 672x168 57 ->
# 21). Longer rows they follow, and the prefetches cost (240x960: 31 -> 34 us, 1000x1280 warm 69 -> 85).
PREFETCH_BELOW_K = 512


def row_sums16(builder, accs):
    """R (a power of two <= 16) vectors of 16 partial sums, one per row -> one vector whose lane r < R is
    row r's sum.

    A transposing add tree: pair vectors (a, b) whose lanes hold groups of g partial sums per row; keep
    each group's first halves (a's groups, then b's) and add its second halves: g halves, the rows per
    vector double, and after four levels lane r holds row r's sum. With fewer than 16 rows the last vector
    is paired with itself once fewer than two are left (lanes past R then hold copies)."""
    from llvmlite import ir
    i32 = ir.IntType(32)
    g = 16
    while g > 1:
        if len(accs) == 1:
            accs = [accs[0], accs[0]]
        halves = [[grp * g + t + h for grp in range(16 // g) for t in range(g // 2)] for h in (0, g // 2)]
        picks = [ir.Constant(ir.VectorType(i32, 16), idx + [j + 16 for j in idx]) for idx in halves]
        accs = [builder.fadd(builder.shuffle_vector(a, b, picks[0]), builder.shuffle_vector(a, b, picks[1]))
                for a, b in zip(accs[0::2], accs[1::2])]
        g //= 2
    return accs[0]


@intrinsic
def dot16(typingctx, w, wo, ws, x, xo, k, out, oo, n):
    """out[oo + r] = sum_j w[wo + r*ws + j] * x[xo + j] over j < k, for rows r < n (n <= 16): 16 lanes of k
    per step for every row at once, a masked step for the last k % 16, then one vector of 16 sums by a
    transposing add tree, stored masked to the first n lanes."""
    from llvmlite import ir
    sig = types.void(w, types.intp, types.intp, x, types.intp, types.intp, out, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        wa, wo_, ws_, xa, xo_, k_, oa, oo_, n_ = args
        i32, i64, f32 = ir.IntType(32), ir.IntType(64), ir.FloatType()
        f16 = ir.VectorType(f32, 16)
        fma, mload, mstore = vector_ops(builder)
        const = lambda v: ir.Constant(i64, v)   # noqa: E731
        wp = data_of(context, builder, sig.args[0], wa, wo_)
        xp = data_of(context, builder, sig.args[3], xa, xo_)
        op = data_of(context, builder, sig.args[6], oa, oo_)
        zero = ir.Constant(f16, [0.0] * 16)
        # rows past n read row 0 again (in bounds) and are never stored
        row_at = [builder.gep(wp, [builder.select(builder.icmp_signed("<", const(r), n_), builder.mul(const(r), ws_),
                                                  const(0))]) for r in range(ROWS)]
        vec = lambda p, at: builder.bitcast(builder.gep(p, [at]), f16.as_pointer())  # noqa: E731
        full = builder.sdiv(k_, const(16))

        def step(kk, accs):
            at = builder.mul(kk, const(16))
            xv = builder.load(vec(xp, at), align=4)
            return [builder.call(fma, [builder.load(vec(row_at[r], at), align=4), xv, accs[r]]) for r in range(ROWS)]
        accs = k_loop(builder, full, [zero] * ROWS, step)
        tail = builder.mul(full, const(16))
        mask = first_lanes(builder, builder.sub(k_, tail))
        xv = builder.call(mload, [vec(xp, tail), ir.Constant(i32, 4), mask, zero])
        accs = [builder.call(fma, [builder.call(mload, [vec(row_at[r], tail), ir.Constant(i32, 4), mask, zero]), xv, a])
                for r, a in enumerate(accs)]
        builder.call(mstore, [row_sums16(builder, accs), builder.bitcast(op, f16.as_pointer()), ir.Constant(i32, 4),
                              first_lanes(builder, n_)])
        return context.get_dummy_value()
    return sig, codegen


@njit(parallel=True, cache=True)
def matvec(w, x, bias, lo, hi, ahead, y):
    """y = clip(w @ x + bias, lo, hi) for w (O, K) row-major and x (K,). With `ahead`, each block of 16
    rows first asks for the next one (into L2): see PREFETCH_BELOW_K."""
    O, K = w.shape
    wf = w.reshape(-1)
    for blk in prange((O + ROWS - 1) // ROWS):
        o = blk * ROWS
        n = min(ROWS, O - o)
        if ahead and o + ROWS < O:
            prefetch_lines(wf, (o + ROWS) * K, min(ROWS, O - o - ROWS) * K)
        dot16(wf, o * K, K, x, 0, K, y, o, n)
        for r in range(o, o + n):
            y[r] = min(max(y[r] + bias[r], lo), hi)


class MatVec:
    """y = clip(w @ x + bias, activation bounds) for a constant w (O, K): the weights contiguous, the
    serial or parallel kernel chosen at prepare."""

    def __init__(self, w, bias, act: int, threads: int):
        import numpy as np

        from .. import sized
        from .epilogue import NO_GRID
        from .float_gemm import epilogue
        self.w = np.ascontiguousarray(w, np.float32)
        self.bias = np.zeros(self.w.shape[0], np.float32) if bias is None else np.ascontiguousarray(bias, np.float32)
        self.lo, self.hi = epilogue(act, NO_GRID)[:2]
        self.fn = sized(matvec, self.w.size, threads)
        self.ahead = self.w.shape[1] < PREFETCH_BELOW_K

    def __call__(self, x, y) -> None:
        """x (K,), y (O,) C-contiguous."""
        self.fn(self.w, x, self.bias, self.lo, self.hi, self.ahead, y)
