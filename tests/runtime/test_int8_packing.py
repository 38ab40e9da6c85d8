"""The 1x1 int8 layers' packing passes against quantize_packed (MNN's cast, mnn_cast, byte for byte):
quantize_packed_grid on inputs already on the layer's grid (rint in place of the clamps and the half-away
rounding), quantize_packed_scaled on x * s (a squeeze-excite's product quantized in the pass)."""
from __future__ import annotations

import numpy as np
import pytest

from mnntool.runtime.kernels import sized
from mnntool.runtime.kernels.compile.jit import njit
from mnntool.runtime.kernels.micro import int8_conv
from mnntool.runtime.kernels.micro.epilogue import grid_of, to_grid_z

f = np.float32


def _blocks(C, P, off):
    return np.full((-(-P // 16), -(-C // 4), 16), 0xDEADBEEF, np.uint32), off


@pytest.mark.parametrize("grid", [(0.0371, 0, -127, 127), (0.013, 3, -131, 124), (0.2, -20, -108, 147),
                                  (1e-3, 0, -127, 127), (7.5, 0, -128, 127)])
@pytest.mark.parametrize("C,P", [(96, 3136), (30, 49), (3, 17), (8, 16)])
@pytest.mark.parametrize("threads", [1, 2])
def test_packed_grid_matches_mnn_cast(grid, C, P, threads):
    """Every step of the grid (and values past its ends, clamped onto it first as the producer does), +-0."""
    s, z, lo, hi = grid
    g = grid_of(s, lo, hi)
    r = np.random.default_rng(C * P + threads)
    x = (r.standard_normal((C, P)) * s * 60).astype(f)
    steps = np.arange(lo, hi + 1, dtype=np.float64) * s
    x.reshape(-1)[:steps.size] = steps[:x.size]
    x[-1, :4] = [0.0, -0.0, 1e30, -1e30][:min(4, P)]
    on = np.empty_like(x)
    to_grid_z(x, g, f(z), on)
    want, off = _blocks(C, P, 128 + z)
    got = want.copy()
    sized(int8_conv.quantize_packed, 1, threads)(on, g[0], f(z), f(lo + z), f(hi + z), off, want)
    sized(int8_conv.quantize_packed_grid, on.size, threads)(on, g[0], off, got)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("C,P", [(96, 3136), (30, 49), (5, 17)])
@pytest.mark.parametrize("threads", [1, 2])
def test_packed_scaled_is_the_packing_of_the_product(C, P, threads):
    r = np.random.default_rng(C + P + threads)
    x = (r.standard_normal((C, P)) * 3).astype(f)
    sc = (r.random(C) * 2).astype(f)
    sc[0] = f(0)
    g, z = grid_of(0.05, -125, 124), 3
    want, off = _blocks(C, P, 128 + z)
    got = want.copy()
    sized(int8_conv.quantize_packed, 1, threads)((x * sc[:, None]).astype(f), g[0], f(z), f(-125 + z), f(124 + z),
                                                 off, want)
    sized(int8_conv.quantize_packed_scaled, x.size, threads)(x, sc, g[0], f(z), f(-125 + z), f(124 + z), off, got)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("C,P", [(96, 3136), (30, 49), (5, 17)])
@pytest.mark.parametrize("post", ["relu", "relu6", "none"])
@pytest.mark.parametrize("threads", [1, 2])
def test_packed_affine_is_the_packing_of_the_scale(C, P, post, threads):
    """quantize_packed_affine == ops.scale.scale_rows (its fastmath multiply-add) then quantize_packed."""
    from mnntool.runtime.kernels.micro.epilogue import POST_CLIP, POST_NONE
    from mnntool.runtime.kernels.ops.scale import scale_rows
    r = np.random.default_rng(C + P + threads + len(post))
    x = (r.standard_normal((C, P)) * 3).astype(f)
    sc, sb = r.standard_normal(C).astype(f), r.standard_normal(C).astype(f)
    kind, alpha, beta = {"relu": (POST_CLIP, 0.0, np.inf), "relu6": (POST_CLIP, 0.0, 6.0),
                         "none": (POST_NONE, 0.0, 0.0)}[post]
    big = f(np.finfo(f).max)
    lo, hi = (f(alpha), f(min(beta, big))) if kind == POST_CLIP else (-big, big)
    y = np.empty_like(x)
    scale_rows(x, sc, sb, kind, f(alpha), f(beta), y)
    g, z = grid_of(0.05, -125, 124), 3
    want, off = _blocks(C, P, 128 + z)
    got = want.copy()
    sized(int8_conv.quantize_packed, 1, threads)(y, g[0], f(z), f(-125 + z), f(124 + z), off, want)
    bounds = int8_conv.affine_cast_bounds(lo, hi, g[0], f(z), f(-125 + z), f(124 + z))
    sized(int8_conv.quantize_packed_affine, x.size, threads)(x, sc, sb, g[0], f(z), *bounds, off, got)
    np.testing.assert_array_equal(got, want)
    vals = np.empty_like(x)
    _affine_rows(x, sc, sb, lo, hi, vals)       # the floats themselves (an FMA or not shows here, not in bytes)
    np.testing.assert_array_equal(vals.view(np.uint32), y.view(np.uint32))


@njit(cache=True)
def _affine_rows(x, sc, sb, lo, hi, out):
    for c in range(x.shape[0]):
        for i in range(x.shape[1]):
            out[c, i] = int8_conv._affine(x[c, i], sc[c], sb[c], lo, hi)
