"""The ONNX graph is folded before conversion: shape arithmetic, an If on a known condition, ops defined
as functions; folding is bounded. Reference: onnxruntime on the same file."""
import numpy as np
import onnx
from onnx import TensorProto as TP, helper as h, numpy_helper as nh

from mnntool.api import convert
from mnntool.format import reader
from mnntool.frontends.onnx.fold import MAX_FOLD_ELEMENTS, fold
from mnntool.runtime.session import Session
from tests.conftest import assert_close, mnn_run, ort_run


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = h.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)])


def test_if_on_a_shape_condition_becomes_its_branch(tmp_path):
    then_g = h.make_graph([h.make_node("Relu", ["x"], ["t"])], "then", [], [h.make_tensor_value_info("t", TP.FLOAT, [2, 3])])
    else_g = h.make_graph([h.make_node("Neg", ["x"], ["e"])], "else", [], [h.make_tensor_value_info("e", TP.FLOAT, [2, 3])])
    nodes = [h.make_node("Shape", ["x"], ["s"]), h.make_node("ReduceProd", ["s"], ["n"], keepdims=0),
             h.make_node("Greater", ["n", "five"], ["c"]),
             h.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)]
    m = _model(nodes, [h.make_tensor_value_info("x", TP.FLOAT, [2, 3])], [h.make_tensor_value_info("y", TP.FLOAT, [2, 3])],
               [nh.from_array(np.array(5, np.int64), "five")])
    onnx.save(m, tmp_path / "if.onnx")
    convert(tmp_path / "if.onnx", tmp_path / "if.mnn")
    g = reader.load(tmp_path / "if.mnn")
    assert [n.op for n in g.nodes] == ["ReLU"]
    x = np.random.RandomState(0).randn(2, 3).astype(np.float32)
    ref = ort_run(tmp_path / "if.onnx", {"x": x})["y"]
    assert_close(ref, Session(g).run({"x": x})["y"])
    assert_close(ref, mnn_run(tmp_path / "if.mnn", ["x"], ["y"], {"x": x})["y"])


def test_folding_is_bounded():
    """A ConstantOfShape past the bound stays a run-time op instead of a 37 GB constant."""
    big = np.array([100000, 100000], np.int64)
    m = _model([h.make_node("ConstantOfShape", ["shape"], ["y"])], [], [h.make_tensor_value_info("y", TP.FLOAT, None)],
               [nh.from_array(big, "shape")])
    fold(m)
    assert [n.op_type for n in m.graph.node] == ["ConstantOfShape"]
    assert int(np.prod(big)) > MAX_FOLD_ELEMENTS


def test_shape_arithmetic_folds_to_constants():
    nodes = [h.make_node("Shape", ["x"], ["s"]), h.make_node("Gather", ["s", "one"], ["d"], axis=0),
             h.make_node("Unsqueeze", ["d", "zero"], ["du"]), h.make_node("Concat", ["m1", "du"], ["shape"], axis=0),
             h.make_node("Reshape", ["x", "shape"], ["y"])]
    m = _model(nodes, [h.make_tensor_value_info("x", TP.FLOAT, [2, 3, 4])], [h.make_tensor_value_info("y", TP.FLOAT, None)],
               [nh.from_array(np.array(1, np.int64), "one"), nh.from_array(np.array([0], np.int64), "zero"),
                nh.from_array(np.array([-1], np.int64), "m1")])
    fold(m)
    assert [n.op_type for n in m.graph.node] == ["Reshape"]
    shape = next(i for i in m.graph.initializer if i.name == "shape")
    assert nh.to_array(shape).tolist() == [-1, 3]


def test_scan_of_known_length_unrolls(tmp_path):
    """A running sum over a sequence read backwards (state + per-step output), as a Scan: unrolled at
    convert time, the same as onnxruntime in both runtimes; a body reading an outer tensor works."""
    body = h.make_graph([h.make_node("Add", ["s_in", "x_t"], ["s_sum"]), h.make_node("Mul", ["s_sum", "w"], ["s_out"]),
                         h.make_node("Identity", ["s_out"], ["y_t"])], "body",
                        [h.make_tensor_value_info("s_in", TP.FLOAT, [3]), h.make_tensor_value_info("x_t", TP.FLOAT, [3])],
                        [h.make_tensor_value_info("s_out", TP.FLOAT, [3]), h.make_tensor_value_info("y_t", TP.FLOAT, [3])])
    nodes = [h.make_node("Scan", ["s0", "x"], ["s_final", "ys"], body=body, num_scan_inputs=1,
                         scan_input_directions=[1])]
    m = _model(nodes, [h.make_tensor_value_info("s0", TP.FLOAT, [3]), h.make_tensor_value_info("x", TP.FLOAT, [5, 3])],
               [h.make_tensor_value_info("s_final", TP.FLOAT, [3]), h.make_tensor_value_info("ys", TP.FLOAT, [5, 3])],
               [nh.from_array(np.full(3, 0.5, np.float32), "w")])
    onnx.save(m, tmp_path / "scan.onnx")
    convert(tmp_path / "scan.onnx", tmp_path / "scan.mnn")
    g = reader.load(tmp_path / "scan.mnn")
    assert "Scan" not in [n.op for n in g.nodes]
    rng = np.random.RandomState(1)
    feeds = {"s0": rng.randn(3).astype(np.float32), "x": rng.randn(5, 3).astype(np.float32)}
    ref = ort_run(tmp_path / "scan.onnx", feeds)
    ours = Session(g).run(feeds)
    theirs = mnn_run(tmp_path / "scan.mnn", ["s0", "x"], ["s_final", "ys"], feeds)
    for k in ("s_final", "ys"):
        assert_close(ref[k], ours[k])
        assert_close(ref[k], theirs[k])
