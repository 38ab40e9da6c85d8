"""kernels.ops.mnn_math: MNN's float activations emulated bit for bit, checked against MNN's runtime on one
op models (every value must be the same float32), and the table kernel built from them."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

from mnntool import api  # noqa: E402
from mnntool.runtime.kernels.ops import mnn_math  # noqa: E402
from mnntool.runtime.kernels.micro.epilogue import grid_of  # noqa: E402
from tests.conftest import mnn_run  # noqa: E402

N = 1 << 16
OPS = {"Sigmoid": mnn_math.sigmoid, "HardSwish": mnn_math.hardswish, "Gelu": mnn_math.gelu_erf}


def _values(seed: int) -> np.ndarray:
    """Wide and narrow normals, and every value of an int8 grid (the table's inputs)."""
    rng = np.random.default_rng(seed)
    grid = np.arange(-128, 128, dtype=np.float32) * np.float32(0.0473)
    x = np.concatenate([rng.standard_normal(N - 2 * 256) * 6, rng.standard_normal(256) * 0.01, grid])
    return x.astype(np.float32).reshape(1, N)


@pytest.mark.parametrize("op", sorted(OPS))
def test_emulation_is_mnn_bit_for_bit(tmp_path, op):
    g = helper.make_graph([helper.make_node(op, ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, N])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, N])])
    helper_model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
    onnx.save(helper_model, tmp_path / "m.onnx")
    api.convert(tmp_path / "m.onnx", tmp_path / "m.mnn", exact_gelu=True)     # the erf form MNN computes with libm
    x = _values(len(op))
    theirs = mnn_run(tmp_path / "m.mnn", ["x"], ["y"], {"x": x})["y"].reshape(-1)
    mine = OPS[op](x.reshape(-1))
    assert mine.dtype == np.float32
    differ = np.nonzero(mine.view(np.int32) != theirs.view(np.int32))[0]
    assert differ.size == 0, (op, differ.size, x.reshape(-1)[differ[:4]], mine[differ[:4]], theirs[differ[:4]])


def test_fma32_rounds_once():
    """Against exact rational arithmetic, including sums that land on a float32 midpoint in float64."""
    rng = np.random.default_rng(1)
    a, b, c = (rng.standard_normal(3000).astype(np.float32) for _ in range(3))
    # a*b = 2^36 - 2^-10 and c = 2^60 + 2^37: the float64 sum rounds onto the float32 midpoint c + 2^36,
    # which ties-to-even would take up to c + 2^38; the exact sum is below it, so the answer is c
    a[:2] = np.float32(2 ** 18 * (1 + 2 ** -23))
    b[:2] = np.float32(2 ** 18 * (1 - 2 ** -23)) * np.float32([1, -1])
    c[:2] = np.float32(2 ** 60 * (1 + 2 ** -23)) * np.float32([1, -1])
    got = mnn_math.fma32(a, b, c)
    assert got[0] == c[0] and got[1] == c[1]
    assert np.float32(a[0].astype(np.float64) * b[0] + c[0]) != c[0]      # the naive way is wrong here
    for i in range(a.size):
        exact = Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i]))
        best = min((got[i], np.nextafter(got[i], np.float32(np.inf)), np.nextafter(got[i], np.float32(-np.inf))),
                   key=lambda v: abs(Fraction(float(v)) - exact))
        assert best == got[i], (i, a[i], b[i], c[i])


@pytest.mark.parametrize("zero_steps", [(-127, 127), (-1, 254)])
def test_table_gives_the_function_at_every_grid_value(zero_steps):
    lo, hi = zero_steps
    grid = grid_of(0.0213, lo, hi)
    k = np.random.default_rng(2).integers(lo, hi + 1, 10_000).astype(np.float32)
    x = (k * grid[1]).astype(np.float32)
    values = mnn_math.table(mnn_math.silu, grid)
    out = np.empty_like(x)
    mnn_math.lookup(x, grid[0], np.int32(lo), values, out)
    np.testing.assert_array_equal(out, mnn_math.silu(x))
