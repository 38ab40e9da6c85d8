"""int8_conv's 1x1 packing kernels (one walk, `_packed_walk`, four value forms) against a NumPy model of
the blocks: word k of block (pb, kb) holds the bytes of channels 4kb..4kb+3 at pixel 16pb+k, each MNN's
int8 cast of the value + 128 (fl(fl(v / s) + z), clamped, rounded half away from zero, in float32), the
byte `off` (real 0) past the last channel or pixel. Shapes cover both walk orders (block by block on small
maps, row runs from PACK_RUN whole blocks and PACK_RUNS_MIN floats), channel and pixel tails, 1 and 2
threads. The kernels are compared with each other in test_int8_packing.py; this is their common reference."""
from __future__ import annotations

import numpy as np
import pytest

from mnntool.runtime.kernels import sized
from mnntool.runtime.kernels.micro import int8_conv
from mnntool.runtime.kernels.micro.epilogue import grid_of

f = np.float32
# (C, P): small maps (block order), large ones (row runs; 4099 and 33 leave pixel and channel tails)
SHAPES = [(30, 49), (5, 17), (8, 16), (1024, 196), (96, 3136), (130, 2053), (33, 8200)]


def _uses_runs(C, P):
    return P // 16 >= int8_conv.PACK_RUN and C * P >= int8_conv.PACK_RUNS_MIN


def test_shapes_cover_both_orders():
    kinds = {_uses_runs(C, P) for C, P in SHAPES}
    assert kinds == {True, False}
    assert any(_uses_runs(C, P) and (C % 4 or P % 16) for C, P in SHAPES)


def _reference(vals, inv, z, q_lo, q_hi, off):
    """The blocks of MNN's cast of vals (C, P) float32, in NumPy."""
    C, P = vals.shape
    t = np.clip((vals * inv).astype(f) + f(z), f(q_lo), f(q_hi)).astype(f)
    q = np.trunc(t + np.where(t >= 0, f(0.5), f(-0.5)).astype(f)).astype(np.int32) + 128
    nb, k4 = -(-P // 16), -(-C // 4)
    b = np.full((k4 * 4, nb * 16), off, np.uint32)
    b[:C, :P] = q.astype(np.uint32)
    b = b.reshape(k4, 4, nb, 16)
    words = b[:, 0] | b[:, 1] << 8 | b[:, 2] << 16 | b[:, 3] << 24          # (k4, nb, 16)
    return np.ascontiguousarray(words.transpose(1, 0, 2))


def _empty(C, P):
    return np.full((-(-P // 16), -(-C // 4), 16), 0xDEADBEEF, np.uint32)


def _input(C, P, seed):
    r = np.random.default_rng(seed)
    x = (r.standard_normal((C, P)) * 3).astype(f)
    x.reshape(-1)[:6] = [0.0, -0.0, 1e30, -1e30, 0.025, -0.025][:x.size]     # clamps, +-0, ties at s = 0.05
    return x


GRID, Z = (0.05, -125, 124), 3


@pytest.mark.parametrize("C,P", SHAPES)
@pytest.mark.parametrize("threads", [1, 2])
def test_plain_and_scaled_match_numpy(C, P, threads):
    x = _input(C, P, C * P + threads)
    inv = grid_of(*GRID)[0]
    args = (inv, f(Z), f(GRID[1] + Z), f(GRID[2] + Z), 128 + Z)
    got = _empty(C, P)
    sized(int8_conv.quantize_packed, x.size, threads)(x, *args, got)
    np.testing.assert_array_equal(got, _reference(x, *args))
    sc = (np.random.default_rng(C).random(C) * 2).astype(f)
    got = _empty(C, P)
    sized(int8_conv.quantize_packed_scaled, x.size, threads)(x, sc, *args, got)
    np.testing.assert_array_equal(got, _reference((x * sc[:, None]).astype(f), *args))


BIG = f(np.finfo(f).max)
# activation bounds: ReLU6, ReLU, none, past the byte range above (every byte the top) and below
ACT = [(f(0), f(6)), (f(0), BIG), (-BIG, BIG), (f(10), BIG), (-BIG, f(-10))]


@pytest.mark.parametrize("C,P", SHAPES)
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("act", range(len(ACT)))
def test_affine_matches_numpy(C, P, threads, act):
    """The activation's clamp merged into the cast's (affine_cast_bounds) gives the bytes of the two clamps."""
    x = _input(C, P, C + P + threads)
    r = np.random.default_rng(P)
    sc, sb = r.standard_normal(C).astype(f), r.standard_normal(C).astype(f)
    lo, hi = ACT[act]
    inv = grid_of(*GRID)[0]
    args = (inv, f(Z), f(GRID[1] + Z), f(GRID[2] + Z), 128 + Z)
    got = _empty(C, P)
    bounds = int8_conv.affine_cast_bounds(lo, hi, *args[:4])
    sized(int8_conv.quantize_packed_affine, x.size, threads)(x, sc, sb, *args[:2], *bounds, args[4], got)
    # the multiply-add rounded once, as the kernel's llvm.fma (float64 holds the exact product and sum
    # of float32 values closely enough that one rounding to float32 gives the fma's result here)
    vals = np.clip((x.astype(np.float64) * sc[:, None] + sb[:, None]).astype(f), lo, hi).astype(f)
    np.testing.assert_array_equal(got, _reference(vals, *args))


@pytest.mark.parametrize("C,P", SHAPES)
@pytest.mark.parametrize("threads", [1, 2])
def test_grid_matches_numpy(C, P, threads):
    """Inputs on the grid (fl(k s) for integer k in its bounds): the rint form gives the cast's bytes."""
    s, lo, hi = GRID
    k = np.random.default_rng(C * 7 + P).integers(lo, hi + 1, (C, P))
    x = (k.astype(f) * f(s)).astype(f)
    inv = grid_of(*GRID)[0]
    got = _empty(C, P)
    sized(int8_conv.quantize_packed_grid, x.size, threads)(x, inv, 128 + Z, got)
    np.testing.assert_array_equal(got, _reference(x, inv, f(Z), f(lo + Z), f(hi + Z), 128 + Z))


@pytest.mark.parametrize("C,H,W,stride", [(128, 56, 56, 1), (130, 14, 14, 1), (8, 7, 9, 1), (64, 28, 28, 2),
                                          (3, 33, 31, 2), (33, 16, 20, 2)])
@pytest.mark.parametrize("threads", [1, 2])
def test_planes_grid_matches_planes(C, H, W, stride, threads):
    """quantize_planes_grid (a 3x3 layer's on-grid input: rint) writes quantize_planes' bytes (MNN's cast;
    tested against int64 convolutions in test_int8_grid.py): every step of the grid, +-0, both strides."""
    s, lo, hi = GRID
    r = np.random.default_rng(C * H + W + stride + threads)
    k = r.integers(lo, hi + 1, (C, H, W)).astype(np.float64)
    k.reshape(-1)[:hi - lo + 1] = np.arange(lo, hi + 1)[:k.size]
    x = (k * s).astype(f)
    x.reshape(-1)[-2:] = [0.0, -0.0]
    inv = grid_of(*GRID)[0]
    pitch = int8_conv.plane_pitch(W, 1, 1, stride)
    shape = (stride * stride * -(-C // 4), -(-(H + 2) // stride), pitch + 4)
    want, got = np.full(shape, 7, np.uint32), np.full(shape, 7, np.uint32)
    geo = (1, 1, stride, stride)
    sized(int8_conv.quantize_planes, 1, threads)(x, inv, f(Z), f(lo + Z), f(hi + Z), 128 + Z, *geo, want)
    sized(int8_conv.quantize_planes_grid, x.size, threads)(x, inv, 128 + Z, *geo, got)
    np.testing.assert_array_equal(got, want)
