"""The epilogue every float kernel shares: the fused activation (none, ReLU, ReLU6) and rounding to
an int8 grid, so a float kernel can stand in for an int8 one with the same result."""
from __future__ import annotations

import numpy as np
from ..compile.jit import njit, prange

RELU, RELU6 = 1, 2

# Activations the planner fuses into a float convolution (runtime/fusion.fuse_activations), applied after
# the bias and the ReLU bounds: in registers by the kernels with an LLVM-IR epilogue (activation_ir), by
# activation_ir.post_flat after the others. A Post is (kind, alpha, beta).
POST_NONE, POST_SILU, POST_SIGMOID, POST_HARDSWISH, POST_GELU_TANH, POST_GELU, POST_TANH, POST_LEAKY, \
    POST_HARDSIGMOID, POST_CLIP = range(10)
POST_KINDS = range(1, 10)
NO_POST = (POST_NONE, 0.0, 0.0)
POST = "fusedActivation"      # the param of a planner-made convolution node that carries its Post


def activation(c: dict) -> int:
    return RELU6 if c.get("relu6") else RELU if c.get("relu") else 0


def act_bounds(act: int, s_out, z) -> tuple:
    """An int8 layer's activation as bounds in output steps with zero point z (ReLU: z, real 0; ReLU6:
    up to 6 / s_out + z), float32, where MNN's epilogues clamp before rounding."""
    f32 = np.float32
    z = f32(z)
    return (z if act else f32(-np.inf)), (f32(6) / f32(s_out) + z if act == RELU6 else f32(np.inf))


def apply_act(y: np.ndarray, act: int) -> None:
    if act == RELU:
        np.maximum(y, 0, out=y)
    elif act == RELU6:
        np.clip(y, 0, 6, out=y)


@njit(cache=True, fastmath=True, inline="always")
def clamp_act(v, act):
    if act == 1:
        return max(v, 0.0)
    if act == 2:
        return min(max(v, 0.0), 6.0)
    return v


@njit(cache=True, fastmath=True, inline="always")
def mnn_round(t):
    """Rounding as MNN's int8 casts and epilogues do it: half away from zero (add +-0.5 in float32,
    truncate). Grid values re-gridded by a pooling or a nearest upsampling land on exact halves often
    (the calibrated scale is a multiple of half the input's), where rint's half-to-even differs."""
    return np.trunc(t + (np.float32(0.5) if t >= 0 else np.float32(-0.5)))


@njit(cache=True, fastmath=True, inline="always")
def on_grid(v, grid):
    """v rounded to an int8 grid given as (1/scale, scale, min, max)."""
    return min(max(mnn_round(v * grid[0]), grid[2]), grid[3]) * grid[1]


@njit(cache=True, fastmath=True, inline="always")
def finish(v, act, grid):
    """The activation, then (when grid[1] > 0) rounding to the int8 grid."""
    v = clamp_act(v, act)
    if grid[1] > 0:
        v = on_grid(v, grid)
    return v


NO_GRID = (np.float32(1), np.float32(0), np.float32(0), np.float32(0))


@njit(parallel=True, cache=True, fastmath=True)
def to_grid(x, grid, out):
    """out = clip(round(x / s), min, max) * s over rows (out may be x); grid = (1/s, s, min, max)."""
    for r in prange(x.shape[0]):
        src, dst = x[r], out[r]
        for i in range(src.shape[0]):
            dst[i] = on_grid(src[i], grid)


# no contraction: MNN's cast is a multiply, then an add of the zero point, each rounded (vmulps, vaddps)
EXACT = {"nnan", "ninf", "nsz"}


@njit(cache=True, fastmath=EXACT, inline="always")
def mnn_cast(v, inv, z, q_lo, q_hi):
    """The int8 value MNN's float-to-int8 cast gives v: fl(fl(v * inv) + z) clamped to [q_lo, q_hi], then
    rounded half away from zero (read from _AVX_MNNFloat2Int8). With a zero point this is not round(v *
    inv) + z: the sum rounds in float32, and a tie below 0 goes down."""
    return mnn_round(min(max(v * inv + z, q_lo), q_hi))


@njit(parallel=True, cache=True, fastmath=EXACT)
def to_grid_z(x, grid, z, out):
    """to_grid for a grid with zero point z: out = (cast - z) * s, the value MNN's int8 bytes stand for."""
    q_lo, q_hi = grid[2] + z, grid[3] + z
    for r in prange(x.shape[0]):
        src, dst = x[r], out[r]
        for i in range(src.shape[0]):
            dst[i] = (mnn_cast(src[i], grid[0], z, q_lo, q_hi) - z) * grid[1]


def grid_of(scale, lo, hi) -> tuple:
    """The (1/scale, scale, min, max) tuple the Numba kernels take for an int8 grid (min and max in
    steps of the scale); 1/scale a float32 division, as MNN computes its cast's scale."""
    s = np.float32(scale)
    return np.float32(1) / s, s, np.float32(lo), np.float32(hi)
