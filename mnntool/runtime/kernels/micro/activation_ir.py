"""The activations a convolution's epilogue applies in registers, as LLVM IR on <16 x float>, and the
same functions as a Numba loop for the kernels without an IR epilogue (kinds in `epilogue.POST_KINDS`);
`Finish`, the whole IR epilogue (bounds, activation, int8 grid) the IR kernels end with.

exp is Cephes' expf (x = n ln2 + r, a degree-6 polynomial in r, times 2^n by vscalefps);
sigmoid is 1 / (1 + e) or e / (1 + e) with e = exp(-|x|), which never overflows, the division as a
reciprocal estimate and a Newton step; erf is the rational
approximation of `exp_erf.erf32` (Eigen's). Tanh and GELU's tanh form go through sigmoid:
tanh(u) = 2 sigmoid(2u) - 1 and 0.5 x (1 + tanh(u)) = x sigmoid(2u).
"""
from __future__ import annotations

import numpy as np
from ..compile.jit import njit, prange

from .llvm_ir import declare, splat
from .exp_erf import LN2_HI, LN2_LO, LOG2E, P0, P1, P2, P3, P4, P5, P6, Q0, Q1, Q2, Q3, Q4, erf32
from .epilogue import (POST_CLIP, POST_GELU, POST_GELU_TANH, POST_HARDSIGMOID, POST_HARDSWISH, POST_LEAKY, POST_SIGMOID,
                       POST_SILU, POST_TANH)

EXP_LO = -87.33         # exp below this is under float32's smallest normal: the polynomial's 2^n would not be
EXP_C = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)
GELU_TANH_2 = 1.5957691216057308    # 2 sqrt(2 / pi)
SIGMOID_CLAMP = 80.0    # exp(80) and 1 / (1 + exp(80)) are normal floats


class VectorMath:
    """IR builders for one function: constants and intrinsics made once."""

    def __init__(self, builder):
        from llvmlite import ir

        self.b = builder
        f32 = ir.FloatType()
        self.f16 = f16 = ir.VectorType(f32, 16)
        self.i16 = ir.VectorType(ir.IntType(32), 16)
        self.fma = declare(builder, "llvm.fma.v16f32", f16, f16, f16, f16)
        self.rint = declare(builder, "llvm.rint.v16f32", f16, f16)
        self.fabs = declare(builder, "llvm.fabs.v16f32", f16, f16)
        self.rcp14 = declare(builder, "llvm.x86.avx512.rcp14.ps.512", f16, f16, f16, ir.IntType(16))
        self.scalef = declare(builder, "llvm.x86.avx512.mask.scalef.ps.512", f16, f16, f16, f16, ir.IntType(16),
                              ir.IntType(32))

    def c(self, value):
        from llvmlite import ir
        return ir.Constant(self.f16, [float(np.float32(value))] * 16)

    def max(self, a, b):
        return self.b.select(self.b.fcmp_ordered(">", a, b), a, b)

    def min(self, a, b):
        return self.b.select(self.b.fcmp_ordered("<", a, b), a, b)

    def exp_neg(self, x):
        """exp(x) for x <= 0; 0 below EXP_LO (the polynomial there would give ~1e-38, whose products
        are denormals: a causal mask's rows of attention probabilities ran 5x slower)."""
        b = self.b
        # no clamp: below EXP_LO (-inf included, whose r is NaN) the select gives 0, and NaN stays NaN
        under = b.fcmp_ordered("<", x, self.c(EXP_LO))
        return b.select(under, self.c(0.0), self._exp(x))

    def _exp(self, x):
        """exp(x) = 2^n e^r, n = rint(x / ln 2), r = x - n ln 2 (in two parts), e^r by the polynomial;
        for x whose result is a normal float (the callers clamp or select)."""
        from llvmlite import ir
        b = self.b
        n = b.call(self.rint, [b.fmul(x, self.c(LOG2E))])
        r = b.call(self.fma, [n, self.c(-LN2_HI), x])
        r = b.call(self.fma, [n, self.c(-LN2_LO), r])
        p = self.c(EXP_C[0])
        for coef in EXP_C[1:]:
            p = b.call(self.fma, [p, r, self.c(coef)])
        p = b.fadd(b.call(self.fma, [p, b.fmul(r, r), r]), self.c(1.0))
        # p 2^n in one vscalefps, where the exponent bits took four instructions
        return b.call(self.scalef, [p, n, self.c(0.0), ir.Constant(ir.IntType(16), -1),
                                    ir.Constant(ir.IntType(32), 4)])       # all lanes, current rounding

    def recip(self, d):
        """1 / d as rcp14 and one Newton step (relative error ~1e-8, a few cycles where vdivps takes
        ~20: SiLU after a 16-channel 1x1 layer was bound by its divisions)."""
        from llvmlite import ir
        b = self.b
        r = b.call(self.rcp14, [d, self.c(0.0), ir.Constant(ir.IntType(16), -1)])
        return b.fmul(r, b.call(self.fma, [b.fneg(d), r, self.c(2.0)]))

    def sigmoid(self, x):
        """1 / (1 + exp(-x)) with x clamped to +-SIGMOID_CLAMP, where exp(-x) and its reciprocal stay
        normal floats (no select on the sign, no underflow test: 20 vector ops where the exp(-|x|)
        form took 27; SiLU after a 16-to-96-channel 1x1 layer on 112x112 cost more than the layer).
        Beyond the clamp the result is 1 or 1.8e-35 (the true value is smaller still)."""
        b = self.b
        lo, hi = self.c(-SIGMOID_CLAMP), self.c(SIGMOID_CLAMP)     # NaN passes both (ordered compares)
        xc = b.select(b.fcmp_ordered("<", x, lo), lo, x)
        xc = b.select(b.fcmp_ordered(">", xc, hi), hi, xc)
        e = self._exp(b.fneg(xc))
        return self.recip(b.fadd(self.c(1.0), e))

    def erf(self, x):
        b = self.b
        x = self.min(self.max(x, self.c(-4.0)), self.c(4.0))
        x2 = b.fmul(x, x)
        p = self.c(P0)
        for coef in (P1, P2, P3, P4, P5, P6):
            p = b.call(self.fma, [p, x2, self.c(coef)])
        q = self.c(Q0)
        for coef in (Q1, Q2, Q3, Q4):
            q = b.call(self.fma, [q, x2, self.c(coef)])
        return b.fmul(b.fmul(p, x), self.recip(q))

    def activate(self, kind: int, v, alpha, beta):
        """Activation `kind` (a POST_* constant) of v; alpha and beta are <16 x float> values."""
        b = self.b
        if kind == POST_SILU:
            return b.fmul(v, self.sigmoid(v))
        if kind == POST_SIGMOID:
            return self.sigmoid(v)
        if kind == POST_HARDSWISH:
            return b.fmul(b.fmul(v, self.min(self.max(b.fadd(v, self.c(3.0)), self.c(0.0)), self.c(6.0))),
                          self.c(1 / 6))
        if kind == POST_GELU_TANH:
            u = b.fmul(v, b.call(self.fma, [b.fmul(v, v), self.c(0.044715), self.c(1.0)]))
            return b.fmul(v, self.sigmoid(b.fmul(u, self.c(GELU_TANH_2))))
        if kind == POST_GELU:
            half = b.fmul(v, self.c(0.5))
            return b.call(self.fma, [half, self.erf(b.fmul(v, self.c(0.7071067811865476))), half])
        if kind == POST_TANH:
            return b.fsub(b.fmul(self.sigmoid(b.fadd(v, v)), self.c(2.0)), self.c(1.0))
        if kind == POST_LEAKY:
            return b.select(b.fcmp_ordered(">", v, self.c(0.0)), v, b.fmul(v, alpha))
        if kind == POST_HARDSIGMOID:
            return self.min(self.max(b.call(self.fma, [v, alpha, beta]), self.c(0.0)), self.c(1.0))
        if kind == POST_CLIP:
            return self.min(self.max(v, alpha), beta)
        return v

    def switch(self, kind_value, values, alpha, beta, kinds):
        """Every vector of `values` through the activation the run-time `kind_value` (i32) names, one
        branch for all of them."""
        from llvmlite import ir
        b = self.b
        start = b.block
        merge = b.append_basic_block("post_done")
        sw = b.switch(kind_value, merge)
        incoming = [(start, list(values))]
        for kind in kinds:
            block = b.append_basic_block(f"post_{kind}")
            sw.add_case(ir.Constant(kind_value.type, kind), block)
            b.position_at_end(block)
            done = [self.activate(kind, v, alpha, beta) for v in values]
            incoming.append((b.block, done))
            b.branch(merge)
        b.position_at_end(merge)
        out = []
        for k in range(len(values)):
            phi = b.phi(self.f16)
            for block, vs in incoming:
                phi.add_incoming(vs[k], block)
            out.append(phi)
        return out


class Finish:
    """The convolution epilogue on 16-float vectors: the activation bounds, the fused activation, then
    rounding to the int8 grid; epf = (act_lo, act_hi, 1/s, s, q_lo, q_hi[, post kind, alpha, beta]) as
    `float_gemm.epilogue` makes it (the int8 kernels give the first six). on_grid: an i1 IR value, or True
    to always round. Bounds as compare-and-select: maxnum's NaN rules cost two more instructions."""

    def __init__(self, builder, epf, on_grid):
        from llvmlite import ir
        f16 = ir.VectorType(ir.FloatType(), 16)
        self.builder, self.on_grid = builder, on_grid
        self.lo, self.hi, self.inv, self.step, self.q_lo, self.q_hi = (
            splat(builder, builder.extract_value(epf, k), f16) for k in range(6))
        self.math = VectorMath(builder)
        self.post = None
        if len(epf.type.elements) >= 9:
            self.post = builder.fptosi(builder.extract_value(epf, 6), ir.IntType(32))
            self.alpha, self.beta = (splat(builder, builder.extract_value(epf, k), f16) for k in (7, 8))
        self.trunc = declare(builder, "llvm.trunc.v16f32", f16, f16)
        self.copysign = declare(builder, "llvm.copysign.v16f32", f16, f16, f16)
        self.half = ir.Constant(f16, [0.5] * 16)

    def many(self, values):
        """Each vector finished, with one branch on the fused activation for all of them."""
        from .epilogue import POST_KINDS
        vs = [self.math.min(self.math.max(v, self.lo), self.hi) for v in values]
        if self.post is not None:
            vs = self.math.switch(self.post, vs, self.alpha, self.beta, POST_KINDS)
        return [self._grid(v) for v in vs]

    def __call__(self, v):
        return self.many([v])[0]

    def _grid(self, v):
        b = self.builder
        t = b.fmul(v, self.inv)      # rounded half away from zero, as MNN does (epilogue.mnn_round)
        g = b.call(self.trunc, [b.fadd(t, b.call(self.copysign, [self.half, t]))])
        g = b.fmul(self.math.min(self.math.max(g, self.q_lo), self.q_hi), self.step)
        return g if self.on_grid is True else b.select(self.on_grid, g, v)


@njit(cache=True, fastmath=True, inline="always")
def _sigmoid(v):
    e = np.exp(-abs(v))
    s = np.float32(1) / (np.float32(1) + e)
    return s if v >= 0 else e * s


POST_BLOCK = 4096


@njit(parallel=True, cache=True, fastmath=True)
def post_flat(x, kind, alpha, beta):
    """x (flat float32) through activation `kind` in place: the IR epilogue's functions for the
    kernels that finish in Numba or numpy."""
    for blk in prange((x.shape[0] + POST_BLOCK - 1) // POST_BLOCK):
        _post_block(x[blk * POST_BLOCK:(blk + 1) * POST_BLOCK], kind, alpha, beta)


@njit(cache=True, fastmath=True, inline="always")
def _post_block(x, kind, alpha, beta):
    """One loop per kind (the kind tested once, outside): each loop vectorizes, where one loop with the
    test inside did not (GELU on a ViT's 197x768 fc1 output: 0.36 ms in the loop, 0.07 ms out of it)."""
    one, half = np.float32(1), np.float32(0.5)
    n = x.shape[0]
    if kind == POST_SILU:
        for i in range(n):
            x[i] = x[i] * _sigmoid(x[i])
    elif kind == POST_SIGMOID:
        for i in range(n):
            x[i] = _sigmoid(x[i])
    elif kind == POST_HARDSWISH:
        for i in range(n):
            v = x[i]
            x[i] = v * min(max(v + np.float32(3), np.float32(0)), np.float32(6)) * np.float32(1 / 6)
    elif kind == POST_GELU_TANH:
        for i in range(n):
            v = x[i]
            x[i] = v * _sigmoid(np.float32(GELU_TANH_2) * v * (one + np.float32(0.044715) * v * v))
    elif kind == POST_GELU:
        for i in range(n):
            v = x[i]
            x[i] = half * v * (one + erf32(v * np.float32(0.7071067811865476)))
    elif kind == POST_TANH:
        for i in range(n):
            x[i] = np.float32(2) * _sigmoid(x[i] + x[i]) - one
    elif kind == POST_LEAKY:
        for i in range(n):
            v = x[i]
            x[i] = v if v > 0 else v * alpha
    elif kind == POST_HARDSIGMOID:
        for i in range(n):
            x[i] = min(max(x[i] * alpha + beta, np.float32(0)), one)
    elif kind == POST_CLIP:
        for i in range(n):
            x[i] = min(max(x[i], alpha), beta)
