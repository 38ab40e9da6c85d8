"""ReLU / ReLU6 on the compiled clip_rows kernel (ops/elementwise.py): inputs that are strided views (the
pieces of a split along the last axis), NaN kept, and an output that is not contiguous (the NumPy fallback);
and the hard-swish UnaryOp on its bound compiled loop. Against onnxruntime: exact for the clips, 1e-6 of
max |y| for hard-swish (float64 inside the loop)."""
import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")


def _model(tmp_path, last_concat: bool):
    from onnx import TensorProto as TP, helper as h, numpy_helper
    import onnx
    nodes = [h.make_node("Split", ["x", "sizes"], ["a", "b", "c"], axis=3),
             h.make_node("Relu", ["a"], ["ra"]),
             h.make_node("Clip", ["b", "lo", "hi"], ["rb"]),
             h.make_node("HardSwish", ["c"], ["hc"])]
    if last_concat:
        nodes.append(h.make_node("Concat", ["ra", "rb", "hc"], ["y"], axis=1))
    else:
        nodes += [h.make_node("Add", ["ra", "rb"], ["s"]), h.make_node("Add", ["s", "hc"], ["y"])]
    inits = [numpy_helper.from_array(np.array([16, 16, 16], np.int64), "sizes"),
             numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
             numpy_helper.from_array(np.array(6.0, np.float32), "hi")]
    g = h.make_graph(nodes, "clips", [h.make_tensor_value_info("x", TP.FLOAT, [2, 4, 9, 48])],
                     [h.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    onnx.save(m, tmp_path / "m.onnx")
    return m


@pytest.mark.parametrize("last_concat", [False, True])
def test_clips_on_strided_views_match_onnxruntime(tmp_path, last_concat):
    from mnntool.api import convert, load_session
    m = _model(tmp_path, last_concat)
    convert(tmp_path / "m.onnx", tmp_path / "m.mnn")
    sess = load_session(tmp_path / "m.mnn", threads=1)
    x = (np.random.default_rng(3).standard_normal((2, 4, 9, 48)) * 5).astype(np.float32)
    x[0, 1, 2, 3] = np.nan      # a NaN in the ReLU's piece and one in the ReLU6's
    x[0, 2, 5, 20] = np.nan
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    for _ in range(2):
        got = sess.run({"x": x})["y"]
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-6 * np.nanmax(np.abs(ref)), equal_nan=True)
    assert np.isnan(got).sum() == np.isnan(ref).sum() > 0


def test_clip_kernel_into_a_strided_output():
    """An output view that is not contiguous (a slice of a larger buffer) takes np.clip: same values."""
    from types import SimpleNamespace

    from mnntool.ir.ops import Val
    from mnntool.runtime.kernels.ops.elementwise import relu6
    node = SimpleNamespace(param={"minValue": 0.0, "maxValue": 6.0}, name="r6", op="ReLU6")
    k = relu6(node, [Val((2, 3, 8))], [Val((2, 3, 8))], SimpleNamespace(threads=1))
    x = (np.random.default_rng(0).standard_normal((2, 3, 8)) * 8).astype(np.float32)
    big = np.full((2, 5, 8), 7.0, np.float32)
    k.fn([x], [big[:, 1:4]])
    np.testing.assert_array_equal(big[:, 1:4], np.clip(x, 0, 6))
    assert (big[:, 0] == 7).all() and (big[:, 4] == 7).all()
    y = np.empty((2, 3, 8), np.float32)
    k.fn([x], [y])
    np.testing.assert_array_equal(y, np.clip(x, 0, 6))
