"""Max and average pooling on the row kernel (ops/pool.pool_rows), windows read in place when they all lie
inside the input (no padding, none past the end) and from a padded canvas otherwise, against onnxruntime.
Max pooling copies values (tolerance 0); averages 1e-6 absolute on values of order 1."""
import numpy as np
import pytest

from mnntool.runtime.session import Session


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("k, s, pads, ceil", [(2, 1, [0, 0, 0, 0], 0), (2, 2, [0, 0, 0, 0], 0),
                                              (3, 1, [0, 0, 0, 0], 0), (2, 2, [0, 0, 0, 0], 1),
                                              (2, 1, [0, 0, 1, 1], 0), (3, 2, [1, 1, 1, 1], 0)])
@pytest.mark.parametrize("threads", [1, 2])
def test_pooling_matches_onnxruntime(tmp_path, op, k, s, pads, ceil, threads):
    from onnx import TensorProto as TP, helper as h
    from mnntool import api
    from tests.conftest import save_onnx
    ort = pytest.importorskip("onnxruntime")
    shape = (1, 5, 13, 16)
    attrs = dict(kernel_shape=[k, k], strides=[s, s], pads=pads, ceil_mode=ceil)
    if op == "AveragePool":
        attrs["count_include_pad"] = 0
    g = h.make_graph([h.make_node(op, ["x"], ["y"], **attrs)], "p",
                     [h.make_tensor_value_info("x", TP.FLOAT, list(shape))], [h.make_tensor_value_info("y", TP.FLOAT, None)])
    save_onnx(g, tmp_path / "p.onnx", opset=13)
    api.convert(tmp_path / "p.onnx", tmp_path / "p.mnn")
    x = np.random.default_rng(k * 10 + s).standard_normal(shape).astype(np.float32)
    got = Session(api.load_graph(tmp_path / "p.mnn"), threads).run({"x": x})["y"]
    ref = ort.InferenceSession(str(tmp_path / "p.onnx")).run(None, {"x": x})[0]
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=0, atol=0 if op == "MaxPool" else 1e-6)


@pytest.mark.parametrize("shape, pads, ceil", [((1, 6, 14, 14), [0, 0, 0, 0], 1), ((2, 4, 15, 13), [1, 1, 1, 1], 1),
                                               ((1, 3, 5, 3), [1, 0, 0, 1], 0), ((1, 4, 9, 17), [0, 0, 0, 0], 0),
                                               ((1, 7, 14, 14), [1, 1, 1, 1], 0), ((1, 2, 2, 2), [1, 1, 1, 1], 1),
                                               ((1, 4, 28, 28), [0, 0, 0, 0], 1), ((1, 3, 27, 27), [0, 0, 0, 0], 1),
                                               ((2, 2, 31, 33), [1, 1, 1, 1], 0), ((1, 3, 20, 19), [0, 1, 1, 0], 1)])
def test_small_max_pool_3x3_s2_matches_onnxruntime(tmp_path, shape, pads, ceil):
    """3x3/2 max pooling to maps at most 16 wide (depthwise_pairs.max_pool3x3_s2_pairs: two output rows a
    vector to 8 wide, ese_vovnet's 768 x 14 x 14 ceil-mode pool; one row a vector to 16): padding and windows
    past the end read -inf, odd output heights, batches. Exact."""
    from onnx import TensorProto as TP, helper as h
    from mnntool import api
    from tests.conftest import save_onnx
    ort = pytest.importorskip("onnxruntime")
    g = h.make_graph([h.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=pads,
                                  ceil_mode=ceil)], "p",
                     [h.make_tensor_value_info("x", TP.FLOAT, list(shape))],
                     [h.make_tensor_value_info("y", TP.FLOAT, None)])
    save_onnx(g, tmp_path / "p.onnx", opset=13)
    api.convert(tmp_path / "p.onnx", tmp_path / "p.mnn")
    x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
    got = Session(api.load_graph(tmp_path / "p.mnn"), 1).run({"x": x})["y"]
    ref = ort.InferenceSession(str(tmp_path / "p.onnx")).run(None, {"x": x})[0]
    assert got.shape == ref.shape
    np.testing.assert_array_equal(got, ref)
