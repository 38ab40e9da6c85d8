"""split_grouped_conv: a convolution of one input channel per group and m > 1 outputs each is written as
m depthwise convolutions and a channel interleave, and keeps its meaning in both runtimes (against
onnxruntime: cosine >= 0.9999, max error <= 1e-3 of the output's scale)."""
import numpy as np
import pytest

from mnntool.api import convert
from mnntool.loading import load_graph
from mnntool.runners import backend_runner
from tests.conftest import assert_close, ort_run, save_onnx

onnx = pytest.importorskip("onnx")


def _model(path, cin, m, k, hw, relu=False, open_hw=False):
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(cin * m + k)
    w = numpy_helper.from_array(rng.standard_normal((cin * m, 1, k, k)).astype(np.float32) * 0.3, "w")
    b = numpy_helper.from_array(rng.standard_normal(cin * m).astype(np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=cin, pads=[k // 2] * 4, strides=[1, 1])]
    nodes.append(helper.make_node("Relu", ["c"], ["y"]) if relu else helper.make_node("Identity", ["c"], ["y"]))
    dims = [1, cin, "H", "W"] if open_hw else [1, cin, hw, hw]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, b])
    save_onnx(graph, path)
    return rng.standard_normal((1, cin, hw, hw)).astype(np.float32)


@pytest.mark.parametrize("cin,m,k,relu", [(8, 2, 7, False), (12, 3, 3, True), (5, 2, 3, False)])
def test_split_keeps_the_meaning_in_both_runtimes(tmp_path, cin, m, k, relu):
    src, dst = tmp_path / "g.onnx", tmp_path / "g.mnn"
    x = _model(src, cin, m, k, 20, relu)
    convert(src, dst)
    ops = [n.op for n in load_graph(dst).nodes]
    assert ops.count("ConvolutionDepthwise") == m and "Convolution" not in ops, ops
    ref = ort_run(src, {"x": x})["y"]
    assert_close(ref, backend_runner(dst, "numba", 1).run({"x": x})["y"])
    pytest.importorskip("MNN")
    assert_close(ref, backend_runner(dst, "mnn", 1).run({"x": x})["y"])


def test_open_map_keeps_the_grouped_convolution(tmp_path):
    src, dst = tmp_path / "g.onnx", tmp_path / "g.mnn"
    x = _model(src, 8, 2, 3, 16, open_hw=True)
    convert(src, dst)
    assert "Convolution" in [n.op for n in load_graph(dst).nodes]
    ref = ort_run(src, {"x": x})["y"]
    r = backend_runner(dst, "numba", 1, {"x": x.shape})
    assert_close(ref, r.run({"x": x})["y"])


def test_off_at_level_zero(tmp_path):
    src, dst = tmp_path / "g.onnx", tmp_path / "g.mnn"
    _model(src, 8, 2, 3, 16)
    convert(src, dst, optimize=0)
    assert "ConvolutionDepthwise" not in [n.op for n in load_graph(dst).nodes]
