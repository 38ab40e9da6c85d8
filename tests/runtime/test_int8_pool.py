"""The 2x2 stride-2 int8 average pooling (ops.int8_pool.int8_average_2x2) against the general kernel
(ops.pool.int8_average: MNN's int8 average, tested against MNN in tests/quant/test_int8_local_pool.py):
equal bit for bit (tolerance: none), over exact halves of the grid (MNN's half-away rounding), values
past the grid's bounds, zero points, odd input sizes (the last row and column unread), batches; and the
Pooling kernel picks it only for windows it covers."""
import numpy as np
import pytest

from mnntool.runtime.kernels.ops import int8_pool, pool

GRID = (np.float32(1 / 0.05), np.float32(0.05), np.float32(-127), np.float32(127))


def _input(shape, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    flat = x.reshape(-1)
    k = rng.integers(-130, 131, flat.size // 3)
    flat[: k.size] = ((k + 0.5) * 0.05).astype(np.float32)      # halves of a step, and past the bounds
    flat[k.size: 2 * k.size] = (k * 0.05).astype(np.float32)     # on the grid
    flat[0], flat[1] = 0.0, -0.0
    rng.shuffle(flat)
    return x


@pytest.mark.parametrize("shape", [(1, 16, 56, 56), (2, 5, 15, 9), (1, 3, 2, 2), (1, 8, 7, 33)])
@pytest.mark.parametrize("zero", [0, -3, 20])
def test_2x2_matches_general_kernel(shape, zero):
    x = _input(shape, sum(shape) + zero)
    grid = (GRID[0], GRID[1], np.float32(-128 - zero), np.float32(127 - zero))
    out_shape = shape[:2] + (shape[2] // 2, shape[3] // 2)
    want = np.full(out_shape, np.nan, np.float32)
    got = np.full(out_shape, np.nan, np.float32)
    pool.int8_average(x, grid, zero + 128, 2, 2, 2, 2, 0, 0, want)
    int8_pool.int8_average_2x2(x, grid, zero + 128, got)
    assert not np.isnan(got).any()
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_covers_only_unclipped_2x2_stride_2():
    assert int8_pool.covers(2, 2, 2, 2, 0, 0, (1, 8, 56, 56), (1, 8, 28, 28))
    assert int8_pool.covers(2, 2, 2, 2, 0, 0, (1, 8, 7, 7), (1, 8, 3, 3))
    assert not int8_pool.covers(2, 2, 2, 2, 0, 0, (1, 8, 7, 7), (1, 8, 4, 4))     # ceil mode: a clipped window
    assert not int8_pool.covers(2, 2, 2, 2, 1, 0, (1, 8, 8, 8), (1, 8, 5, 4))
    assert not int8_pool.covers(3, 3, 2, 2, 0, 0, (1, 8, 9, 9), (1, 8, 4, 4))
    assert not int8_pool.covers(2, 2, 1, 1, 0, 0, (1, 8, 9, 9), (1, 8, 8, 8))


@pytest.mark.parametrize("shape", [(1, 16, 56, 56), (2, 5, 15, 9), (1, 3, 2, 2), (1, 8, 7, 33)])
@pytest.mark.parametrize("zero", [0, -3, 20])
@pytest.mark.parametrize("scale", [0.05, 0.0123, 3.7])
def test_2x2_on_grid_matches_general_kernel(shape, zero, scale):
    """int8_average_2x2_grid (input on the output's grid: rint of the float window sum, K >> 2) == MNN's
    integer average bit for bit: every step of the grid incl. both bounds, window sums at every residue
    mod 4 of both signs (the floor of a negative quarter), +-0."""
    inv, s = np.float32(1) / np.float32(scale), np.float32(scale)
    lo, hi = -128 - zero, 127 - zero
    grid = (inv, s, np.float32(lo), np.float32(hi))
    rng = np.random.default_rng(sum(shape) + zero)
    k = rng.integers(lo, hi + 1, shape)
    flat = k.reshape(-1)
    flat[: hi - lo + 1] = np.arange(lo, hi + 1)[: flat.size]
    x = (k.astype(np.float32) * s).astype(np.float32)
    x.reshape(-1)[:2] = [0.0, -0.0]
    out_shape = shape[:2] + (shape[2] // 2, shape[3] // 2)
    want = np.full(out_shape, np.nan, np.float32)
    got = np.full(out_shape, np.nan, np.float32)
    pool.int8_average(x, grid, zero + 128, 2, 2, 2, 2, 0, 0, want)
    int8_pool.int8_average_2x2_grid(x, grid, got)
    assert not np.isnan(got).any()
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
