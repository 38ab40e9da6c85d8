"""The exp and erf approximations the float kernels share: the Numba functions (inlined into the
elementwise, softmax and program loops) and the constants the LLVM-IR epilogues (activation_ir) emit.
Here, below the op kernels, so that the micro-kernels need not import an op module for them."""
from __future__ import annotations

import numpy as np
from ..compile.jit import njit

LOG2E, LN2_HI, LN2_LO = np.float32(1.4426950408889634), np.float32(0.693359375), np.float32(-2.12194440e-4)
EXP_FLOOR = np.float32(-87.0)   # exp below this is under 2^-125: kept normal, and nothing next to a row's max


@njit(cache=True, fastmath=True, inline="always")
def exp_split(t):
    """t = k ln2 + f with k = round(t / ln 2), |f| <= ln2 / 2: k as a float and f."""
    k = np.floor(t * LOG2E + np.float32(0.5))
    return k, t - k * LN2_HI - k * LN2_LO


@njit(cache=True, fastmath=True, inline="always")
def exp_poly(f):
    """e^f for |f| <= ln2 / 2: degree-6 Taylor, relative error 1.2e-7."""
    return np.float32(1) + f * (np.float32(1) + f * (np.float32(0.5) + f * (np.float32(1 / 6) + f * (
        np.float32(1 / 24) + f * (np.float32(1 / 120) + f * np.float32(1 / 720))))))


# erf as x P(x^2) / Q(x^2) on [-4, 4] (beyond, erf is +-1 in float32): Eigen's fast float erf. No exp,
# so LLVM vectorizes it, where math.erf is a scalar libm call: GELU on 128x1024, 1319 -> 56 us. Max abs error
# 4.2e-7 against math.erf (tests/runtime/test_small_ops.py).
P0, P1, P2, P3, P4, P5, P6 = (np.float32(c) for c in (
    -2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
    -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02))
Q0, Q1, Q2, Q3, Q4 = (np.float32(c) for c in (
    -1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
    -1.42647390514189e-02))


@njit(cache=True, fastmath=True, inline="always")
def erf32(x):
    x = min(max(x, np.float32(-4)), np.float32(4))
    x2 = x * x
    p = ((((((P0 * x2 + P1) * x2 + P2) * x2 + P3) * x2 + P4) * x2 + P5) * x2 + P6) * x
    q = (((Q0 * x2 + Q1) * x2 + Q2) * x2 + Q3) * x2 + Q4
    return p / q
