"""A table op (SiLU, sigmoid, hard-swish, GELU: kernels.ops.mnn_math.ON_GRID) fused into the int8
convolution whose output it reads (plan stage fuse_int8_tables): the convolution's output bytes index
the op's values in its epilogue, so the map is neither written on its grid nor read back by a lookup
pass of its own (EfficientNet-B0: 5.1 ms of 12.8 a run in those passes, one Zen 4 core, where the
float file applies SiLU in its convolutions' epilogues). The values are the ones the op's own kernel
looks up (mnn_math.on_grid), rounded to the grid the file stores the op's output on, so the outputs are
the same bit for bit."""
from __future__ import annotations

import numpy as np

from ..micro.epilogue import to_grid_z

TABLE = "int8_table"    # node param: the ON_GRID key of the table op fused into an int8 convolution

f32 = np.float32


def values_of(node, grid, out) -> np.ndarray | None:
    """The fused op's values at each step of the convolution's output grid (epilogue.grid_of form), from
    the lowest step; rounded to `out`'s grid (the op's output Val) where it has one. None when no op
    is fused."""
    key = node.param.get(TABLE)
    if key is None:
        return None
    from .mnn_math import ON_GRID, table
    values = np.ascontiguousarray(table(ON_GRID[key], grid), f32)
    if out.grid is not None:
        rows = values.reshape(1, -1)
        to_grid_z(rows, out.grid, f32(out.zero), rows)
    return values


def codes_of(values, out) -> tuple | None:
    """(int8 codes, zero point, scale) with (code - zero) * scale == values in float32 for each value,
    when the op's output is stored on a grid (out: its Val) and the host has the byte permutes the
    epilogues look codes up with (int8_gemm.lut_bytes); else None (the lookup runs as a pass of its
    own, `looked_up`)."""
    from ..micro.int8_gemm import HAS_VBMI
    if out.grid is None or not HAS_VBMI or values.size > 256:
        return None
    s, z = f32(out.grid[1]), f32(out.zero)
    codes = np.rint(values.astype(np.float64) / float(s) + float(z))
    if codes.min() < -128 or codes.max() > 127:
        return None
    if not np.array_equal(((codes.astype(f32) - z) * s).astype(f32), values):
        return None
    return codes.astype(np.int8), z, s


def looked_up(fn, values, grid, shape, threads: int):
    """fn (a convolution writing its output on `grid`) then the lookup, for the kernels with no table
    in their epilogue (no VNNI, grouped convolutions): the same values as the two ops unfused."""
    from .. import sized
    from .mnn_math import lookup
    y = np.empty(shape, f32)
    run = sized(lookup, y.size * 2, threads)
    inv, lo = f32(grid[0]), np.int32(grid[2])

    def both(inputs, outputs):
        fn(inputs, [y])
        run(y.reshape(-1), inv, lo, values, outputs[0].reshape(-1))
    return both
