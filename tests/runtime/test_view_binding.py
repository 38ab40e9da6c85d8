"""Reshapes and splits whose inputs sit in the same buffers every run are bound once at prepare (no step
at run time); a reshape that would copy (of a strided split piece) still runs each time. Reference:
onnxruntime on the same model, on two different inputs in a row (a bound view must see the second
run's values); exact equality for the data movement, rtol 1e-5 for the 1x1 convolution feeding it."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h

from mnntool import api
from tests.conftest import save_onnx
from mnntool.runtime.session import Session

ort = pytest.importorskip("onnxruntime")


def _model(path):
    rng = np.random.RandomState(0)
    inits = [onnx.numpy_helper.from_array(rng.randn(8, 4, 1, 1).astype(np.float32), "w"),
             onnx.numpy_helper.from_array(np.array([1, 8, 36], np.int64), "s1"),
             onnx.numpy_helper.from_array(np.array([3, 5], np.int64), "sp1"),
             onnx.numpy_helper.from_array(np.array([12, 24], np.int64), "sp2"),
             onnx.numpy_helper.from_array(np.array([1, 96], np.int64), "s2")]
    nodes = [h.make_node("Conv", ["x", "w"], ["c"]),
             h.make_node("Reshape", ["c", "s1"], ["r"]),
             h.make_node("Split", ["r", "sp1"], ["a", "b"], axis=1),       # contiguous pieces: views
             h.make_node("Relu", ["b"], ["rb"]),
             h.make_node("Split", ["r", "sp2"], ["p1", "p2"], axis=2),     # strided pieces
             h.make_node("Reshape", ["p1", "s2"], ["q"]),                  # a reshape that copies
             h.make_node("Neg", ["p2"], ["np2"])]
    outs = [h.make_tensor_value_info(n, TP.FLOAT, None) for n in ("a", "rb", "q", "np2")]
    g = h.make_graph(nodes, "views", [h.make_tensor_value_info("x", TP.FLOAT, [1, 4, 6, 6])], outs, inits)
    save_onnx(g, path)


def test_bound_views_follow_each_run(tmp_path):
    _model(tmp_path / "m.onnx")
    api.convert(tmp_path / "m.onnx", tmp_path / "m.mnn")
    sess = ort.InferenceSession(str(tmp_path / "m.onnx"))
    s = Session(api.load_graph(tmp_path / "m.mnn"), threads=1)
    for seed in (1, 2):
        x = np.random.RandomState(seed).randn(1, 4, 6, 6).astype(np.float32)
        ref = dict(zip(("a", "rb", "q", "np2"), sess.run(None, {"x": x})))
        out = s.run({"x": x})
        for k, v in ref.items():
            np.testing.assert_allclose(out[k], v, rtol=1e-5, atol=1e-6, err_msg=k)
    assert len(s.plan.ran) < len(s.plan.steps), "the reshape and the contiguous split are bound at prepare"
    assert any(st.op == "Reshape" for st in s.plan.ran), "the copying reshape still runs"


@pytest.mark.parametrize("axis,index", [(0, 2), (0, -1), (1, 1), (2, 0)])
def test_gather_of_one_block_is_a_view(tmp_path, axis, index):
    """Gather of one constant index (a decoder's past_k[layer]) runs as a view where only 1s precede the
    axis (no copy), else as its definition; both against onnxruntime, exactly, on two inputs in a row."""
    shape = [3, 4, 5, 6] if axis == 0 else [1, 4, 5, 6] if axis == 1 else [2, 1, 5, 6]
    g = h.make_graph([h.make_node("Gather", ["x", "i"], ["y"], axis=axis), h.make_node("Neg", ["y"], ["z"])], "gather",
                     [h.make_tensor_value_info("x", TP.FLOAT, shape)], [h.make_tensor_value_info("z", TP.FLOAT, None)],
                     [onnx.numpy_helper.from_array(np.array(index, np.int64), "i")])
    save_onnx(g, tmp_path / "m.onnx")
    api.convert(tmp_path / "m.onnx", tmp_path / "m.mnn")
    s = Session(api.load_graph(tmp_path / "m.mnn"), threads=1)
    sess = ort.InferenceSession(str(tmp_path / "m.onnx"))
    for seed in (0, 1):
        x = np.random.RandomState(seed).randn(*shape).astype(np.float32)
        np.testing.assert_array_equal(s.run({"x": x})["z"], sess.run(None, {"x": x})[0])
    gather = next(st for st in s.plan.steps if st.op == "GatherV2")
    assert gather.kernel.view == (axis != 2)


@pytest.mark.parametrize("shape,axis,ids", [([50, 8], 0, [[3, -1, 49, 0]]), ([1, 7, 3], 1, [2, -7, 6]),
                                            ([20, 2, 3], 0, [[[5]], [[-20]]])])
def test_gather_of_run_time_rows(tmp_path, shape, axis, ids):
    """Run-time indices into rows (an embedding lookup: only 1s before the axis) run as one Numba pass
    (tensor.take_rows), negative indices from the end; exactly onnxruntime's values; an index out of
    range is a one-line error naming the op, as the definition's."""
    from mnntool.errors import MnnToolError
    g = h.make_graph([h.make_node("Gather", ["x", "i"], ["y"], axis=axis)], "gather",
                     [h.make_tensor_value_info("x", TP.FLOAT, shape),
                      h.make_tensor_value_info("i", TP.INT64, list(np.shape(ids)))],
                     [h.make_tensor_value_info("y", TP.FLOAT, None)])
    save_onnx(g, tmp_path / "m.onnx")
    api.convert(tmp_path / "m.onnx", tmp_path / "m.mnn")
    s = Session(api.load_graph(tmp_path / "m.mnn"), threads=1)
    x = np.random.RandomState(0).randn(*shape).astype(np.float32)
    i = np.array(ids, np.int64)
    ref = ort.InferenceSession(str(tmp_path / "m.onnx")).run(None, {"x": x, "i": i})[0]
    np.testing.assert_array_equal(s.run({"x": x, "i": i})["y"], ref)
    gather = next(st for st in s.plan.steps if st.op == "GatherV2")
    assert "_row_gather" in gather.kernel.fn.__qualname__
    with pytest.raises(MnnToolError, match="GatherV2 .*index out of range"):
        s.run({"x": x, "i": np.full_like(i, shape[axis])})
