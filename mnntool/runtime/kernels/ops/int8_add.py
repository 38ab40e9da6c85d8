"""A same-shape float Add (ResNet's residual sum) whose output the file stores on an int8 grid, rounded
in its own pass: the sum, the fused ReLU and the cast to the grid per element, where the plan ran the
add and then a rounding step over the sum (int8_store.rounding; ResNet-18 in int8: 0.35 ms of 12.9 a
run in those steps, one Zen 4 core). The same arithmetic as the two steps (elementwise.add_relu, then
epilogue.to_grid / to_grid_z), so the same values bit for bit."""
from __future__ import annotations

import numpy as np
from ..compile.jit import njit, prange

from .. import Kernel, sized
from ..micro.epilogue import EXACT, mnn_cast, on_grid


@njit(parallel=True, cache=True, fastmath=True)
def add_to_grid(a, b, relu, grid, out):
    """out = on_grid(relu(a + b)) over (rows, n) arrays (to_grid's rounding: a grid without zero point)."""
    for r in prange(a.shape[0]):
        x, y, dst = a[r], b[r], out[r]
        for i in range(dst.shape[0]):
            v = x[i] + y[i]
            if relu:
                v = v if v > 0 else np.float32(0)
            dst[i] = on_grid(v, grid)


@njit(parallel=True, cache=True, fastmath=EXACT)
def add_to_grid_z(a, b, relu, grid, z, out):
    """add_to_grid on a grid with zero point z (to_grid_z's rounding: MNN's cast, then back to real)."""
    q_lo, q_hi = grid[2] + z, grid[3] + z
    for r in prange(a.shape[0]):
        x, y, dst = a[r], b[r], out[r]
        for i in range(dst.shape[0]):
            v = x[i] + y[i]
            if relu:
                v = v if v > 0 else np.float32(0)
            dst[i] = (mnn_cast(v, grid[0], z, q_lo, q_hi) - z) * grid[1]


def rounded_add(rows: int, outs, relu: bool, threads: int) -> Kernel | None:
    """The kernel of a same-shape float32 Add of `rows` rows whose output (outs[0]) the file stores on
    an int8 grid, or None where it stores none (or a reader takes the sum unrounded: no grid told)."""
    grid = outs[0].grid
    if grid is None:
        return None
    z = np.float32(outs[0].zero)
    size = int(np.prod(outs[0].shape))
    fn = sized(add_to_grid_z if z else add_to_grid, size, threads)

    def run(i, o):
        a, b = (np.ascontiguousarray(v).reshape(rows, -1) for v in i)
        if z:
            fn(a, b, relu, grid, z, o[0].reshape(rows, -1))
        else:
            fn(a, b, relu, grid, o[0].reshape(rows, -1))
    return Kernel(run, True, grid)
