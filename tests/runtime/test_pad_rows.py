"""Padding kernel (ops/tensor.pad_planes) on rows only (CoaT's class-token pad before its convolutional
position encoding: one row of zeros on top of each head's tokens x dims plane, walked as one fill and one
copy a plane) and with columns (flat indices), against onnxruntime: exact (a copy)."""
import numpy as np
import onnx
import pytest

from mnntool.api import convert, load_session
from tests.runtime.test_padding_kernel import _pad_model

ort = pytest.importorskip("onnxruntime")


@pytest.mark.parametrize("shape, pads, value", [
    ((1, 8, 50, 8), [0, 0, 1, 0, 0, 0, 0, 0], None),            # rows on top only
    ((2, 3, 7, 5), [0, 0, 2, 0, 0, 0, 3, 0], -1.5),             # rows on top and bottom
    ((1, 4, 9, 6), [0, 0, 0, 2, 0, 0, 0, 1], 0.25),             # columns only
    ((1, 2, 5, 5), [0, 0, 1, 1, 0, 0, 2, 3], None),             # both
])
@pytest.mark.parametrize("threads", [1, 2])
def test_row_and_column_pads_match_onnxruntime(tmp_path, shape, pads, value, threads):
    m = _pad_model(shape, pads, "constant", value)
    onnx.save(m, tmp_path / "m.onnx")
    convert(tmp_path / "m.onnx", tmp_path / "m.mnn")
    sess = load_session(tmp_path / "m.mnn", threads=threads)
    x = np.random.default_rng(sum(pads)).standard_normal(shape).astype(np.float32)
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    for _ in range(2):      # the second run into the same (now dirty) buffers
        np.testing.assert_array_equal(sess.run({"x": x})["y"], ref)
    assert [s.kernel.writes_out for s in sess.plan.steps if s.op == "Padding"] == [True]


def test_pad_planes_alone_matches_numpy_pad():
    from mnntool.runtime.kernels.ops.tensor import pad_planes
    x = np.random.default_rng(0).standard_normal((3, 40, 8)).astype(np.float32)
    for t, b, l, r in [(1, 0, 0, 0), (0, 2, 0, 0), (2, 1, 3, 0), (0, 0, 1, 1)]:
        out = np.full((3, 40 + t + b, 8 + l + r), np.nan, np.float32)
        pad_planes(x.reshape(-1), 8, 40, 8, t, l, np.float32(0.5), out)
        np.testing.assert_array_equal(out, np.pad(x, ((0, 0), (t, b), (l, r)), constant_values=0.5))


@pytest.mark.parametrize("threads", [1, 3])
def test_pads_of_a_strided_view_read_it_in_place(threads):
    """EfficientViT pads its attention's v, a view of rows 16 floats long 48 apart, by a column of ones: the
    planes' rows read through parallel_rows.row_span (no copy first), the rows-only walk kept for contiguous
    input; pad_planes (planes in parallel) and pad_rows (rows in parallel, few planes) against np.pad, exact."""
    import numba

    from mnntool.runtime.kernels.micro.parallel_rows import pad_rows, row_span
    from mnntool.runtime.kernels.ops.tensor import pad_planes
    qkv = np.random.default_rng(1).standard_normal((3, 20, 48)).astype(np.float32)
    v = qkv[..., 32:]
    flat, step = row_span(v, 60, 16)
    before = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        for t, b, l, r in [(0, 0, 0, 1), (1, 2, 0, 0), (2, 1, 3, 2)]:
            want = np.pad(v, ((0, 0), (t, b), (l, r)), constant_values=1.0)
            for call in (lambda o: pad_planes(flat, step, 20, 16, t, l, np.float32(1), o),
                         lambda o: pad_planes.serial()(flat, step, 20, 16, t, l, np.float32(1), o),
                         lambda o: pad_rows(flat, step, 20, 16, t, l, np.float32(1), o, 4)):
                out = np.full(want.shape, np.nan, np.float32)
                call(out)
                np.testing.assert_array_equal(out, want)
    finally:
        numba.set_num_threads(before)
