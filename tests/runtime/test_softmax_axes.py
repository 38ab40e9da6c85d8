"""Softmax over an axis other than the last (kernels/ops/norm.py softmax_columns: (outer, n, inner)
blocks walked flat in chunks), against onnxruntime: CoaT's factorized attention (softmax over the tokens
of 8-wide heads), a channel softmax of an image, inner widths that do and do not divide 16.
Tolerance: 1e-5 relative + 1e-7 absolute (float32 sums of up to a few thousand terms; exp to 1.2e-7)."""
import numpy as np
import pytest
from onnx import helper as h

from mnntool import api
from mnntool.runtime.kernels.ops.norm import column_tile, softmax_columns
from mnntool.runtime.session import Session
from tests.conftest import one_node_files, ort_run

pytest.importorskip("onnxruntime")


@pytest.mark.parametrize("shape,axis", [((1, 8, 784, 8), 2), ((1, 5, 9, 9), 1), ((2, 3, 50, 48), -2),
                                        ((1, 40, 3), 1), ((4, 7, 1, 6), 1), ((3, 100, 1), 1)])
@pytest.mark.parametrize("threads", [1, 2])
def test_softmax_on_an_inner_axis_matches_onnxruntime(tmp_path, shape, axis, threads):
    src, mnn = one_node_files(tmp_path, h.make_node("Softmax", ["x"], ["y"], axis=axis), shape)
    x = (np.random.default_rng(len(shape)).standard_normal(shape) * 6).astype(np.float32)
    x.reshape(-1)[:2] = [60.0, -120.0]
    s = Session(api.load_graph(mnn), threads=threads)
    want = ort_run(src, {"x": x})["y"]
    for _ in range(2):
        np.testing.assert_allclose(s.run({"x": x})["y"], want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("dims", [(2, 3136, 8), (3, 7, 5), (2, 33, 48), (1, 20, 17)])
def test_softmax_columns_against_float64_with_masked_columns(dims):
    """The kernel alone: a column all -inf gives NaN (as exp(x - max) / sum does), a half-masked column
    its softmax over the rest; float64 reference, 1e-5 relative."""
    x = (np.random.default_rng(dims[2]).standard_normal(dims) * 8).astype(np.float32)
    x[0, :, 0] = -np.inf
    x[-1, : dims[1] // 2, -1] = -np.inf
    out = np.empty_like(x)
    softmax_columns(x, out, column_tile(dims[2]))
    x64 = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        e = np.exp(x64 - x64.max(axis=1, keepdims=True))
        ref = e / e.sum(axis=1, keepdims=True)
    assert np.array_equal(np.isnan(out), np.isnan(ref))
    ok = ~np.isnan(ref)
    np.testing.assert_allclose(out[ok], ref[ok], rtol=1e-5, atol=1e-30)
