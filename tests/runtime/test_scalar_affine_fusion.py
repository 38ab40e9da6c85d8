"""plan/fuse_scalar_affine: a convolution's output times a scalar and/or plus one (HGNetV2's learnable affine
blocks after ReLU) folded into the convolution, against onnxruntime on the unfused ONNX graph: positive and
negative scales (the clip's bound on either side), with and without ReLU, dense and depthwise, either order.
Tolerance 2e-5 of the output's largest magnitude (the weights scaled before the sums)."""
import numpy as np
import pytest

from mnntool.runtime.session import Session


def _model(path, ops, group, relu):
    import onnx
    from onnx import TensorProto as TP, helper as h
    from tests.conftest import save_onnx
    rng = np.random.default_rng(len(ops) + group)
    c = 8
    w = (rng.standard_normal((c, c // group, 3, 3)) * 0.3).astype(np.float32)
    inits = [onnx.numpy_helper.from_array(w, "w"),
             onnx.numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "b")]
    nodes = [h.make_node("Conv", ["x", "w", "b"], ["t0"], pads=[1, 1, 1, 1], group=group)]
    t = "t0"
    if relu:
        nodes.append(h.make_node("Relu", [t], ["r"]))
        t = "r"
    for i, (op, v) in enumerate(ops):
        inits.append(onnx.numpy_helper.from_array(np.array([v], np.float32), f"c{i}"))
        ins = [f"c{i}", t] if i % 2 else [t, f"c{i}"]
        nodes.append(h.make_node(op, ins, [f"a{i}"]))
        t = f"a{i}"
    nodes.append(h.make_node("Identity", [t], ["y"]))
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, [1, c, 12, 12])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [1, c, 12, 12])], inits)
    save_onnx(g, path, opset=13)


@pytest.mark.parametrize("ops", [[("Mul", 1.7), ("Add", -0.4)], [("Mul", -0.6), ("Add", 0.3)], [("Add", 0.5)],
                                 [("Mul", 2.5)], [("Add", -0.2), ("Mul", -1.3)]])
@pytest.mark.parametrize("group, relu", [(1, True), (8, True), (1, False)])
def test_scalar_affine_folded_into_convolution(tmp_path, ops, group, relu):
    from mnntool import api
    ort = pytest.importorskip("onnxruntime")
    _model(tmp_path / "m.onnx", ops, group, relu)
    api.convert(tmp_path / "m.onnx", tmp_path / "m.mnn")
    x = np.random.default_rng(1).standard_normal((1, 8, 12, 12)).astype(np.float32)
    graph = api.load_graph(tmp_path / "m.mnn")
    left = any(n.op == "BinaryOp" for n in graph.nodes)     # the converter folds them itself without ReLU
    assert left or not relu
    s = Session(graph, 1)
    got = s.run({"x": x})["y"]
    assert not any(step.op == "BinaryOp" for step in s.plan.steps)
    ref = ort.InferenceSession(str(tmp_path / "m.onnx")).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, ref, rtol=0, atol=2e-5 * float(np.abs(ref).max()))
    off = Session(graph, 1, off=["fuse_scalar_affine"])
    np.testing.assert_allclose(off.run({"x": x})["y"], ref, rtol=0, atol=2e-5 * float(np.abs(ref).max()))
    assert len(off.plan.steps) > len(s.plan.steps) or not left      # the stage is what folded them
