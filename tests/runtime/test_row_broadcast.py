"""BinaryOp with the second operand broadcast along the last axis ((..., n) op (..., 1): ops/elementwise
.by_row_value), against onnxruntime: add, sub, mul exact; div within 1 ulp-scale (1e-6 relative); a zero
divisor gives inf / nan as NumPy's and onnxruntime's division does."""
import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("shape", [(1, 8, 196, 16), (2, 5, 3), (4, 40000)])
def test_last_axis_broadcast_matches_onnxruntime(tmp_path, op, shape):
    import onnx
    from onnx import TensorProto as TP, helper as h

    from mnntool.api import convert, load_session
    # a Relu on the result: the op is an inner node (and MNN's converter may fuse the ReLU into it)
    g = h.make_graph([h.make_node(op, ["x", "s"], ["z"]), h.make_node("Relu", ["z"], ["y"])], "rows",
                     [h.make_tensor_value_info("x", TP.FLOAT, list(shape)),
                      h.make_tensor_value_info("s", TP.FLOAT, list(shape[:-1]) + [1])],
                     [h.make_tensor_value_info("y", TP.FLOAT, None)])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    onnx.save(m, tmp_path / "m.onnx")
    convert(tmp_path / "m.onnx", tmp_path / "m.mnn")
    rng = np.random.default_rng(len(shape))
    x = rng.standard_normal(shape).astype(np.float32)
    s = rng.standard_normal(shape[:-1] + (1,)).astype(np.float32)
    if op == "Div":
        s.reshape(-1)[:2] = 0.0       # x / 0: inf or nan (0 / 0 never here: x is not 0)
    feeds = {"x": x, "s": s}
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    sess = load_session(tmp_path / "m.mnn", threads=1)
    with np.errstate(all="ignore"):
        got = sess.run(feeds)["y"]
    fin = np.isfinite(ref)
    np.testing.assert_allclose(got[fin], ref[fin], rtol=1e-6, atol=0)
    assert np.array_equal(np.isposinf(got), np.isposinf(ref)) and np.array_equal(np.isnan(got), np.isnan(ref))
    assert any(s.op == "BinaryOp" and "_last_axis_broadcast" in getattr(s.kernel.fn, "__qualname__", "")
               for s in sess.plan.steps)
