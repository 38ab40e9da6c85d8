"""The float-to-int8 cast with a zero point, as MNN 3.6's x86 cast computes it (_AVX_MNNFloat2Int8: a
multiply by 1/s, an add of the zero point, each rounded to float32, a clamp, then half away from zero),
against a float32 emulation in numpy; and the difference from rounding first, which this replaced."""
import numpy as np

from mnntool.runtime.kernels.micro.epilogue import grid_of, to_grid, to_grid_z

f32 = np.float32


def _mnn(x, s, z, lo, hi):
    t = (x * (f32(1) / f32(s))).astype(f32)
    t = np.clip((t + f32(z)).astype(f32), f32(lo + z), f32(hi + z))
    q = np.trunc((t + np.where(t < 0, f32(-0.5), f32(0.5))).astype(f32))
    return ((q - f32(z)) * f32(s)).astype(f32)


def test_cast_with_a_zero_point_matches_mnn_and_differs_from_rounding_first():
    s = f32(0.25)
    rng = np.random.default_rng(0)
    ties = (np.arange(0, 250) + 0.5).astype(f32) * s            # exact halves on a one-sided grid
    near = (rng.random(50_000) * 60).astype(f32)               # small values, where t + z rounds
    x = np.concatenate([ties, near, -ties[:20], [f32(1e9), f32(-1e9)]]).astype(f32)[None]
    for z, (lo, hi) in ((-127, (0, 254)), (-98, (-29, 225)), (0, (-127, 127))):
        grid = grid_of(s, lo, hi)
        out = np.empty_like(x)
        to_grid_z(x, grid, f32(z), out)
        np.testing.assert_array_equal(out, _mnn(x, s, z, lo, hi))
        first = np.empty_like(x)
        to_grid(x, grid, first)
        if z:       # a tie below the zero point goes down in MNN's cast, up when rounding first
            assert (out != first).sum() >= 50
        else:
            np.testing.assert_array_equal(out, first)
