"""remove_noops drops x * 1, x + 0 (either operand order) and x - 0 by constants that leave x's shape,
and keeps a product by ones that broadcasts x to a larger shape, and 0 - x. Meaning kept: against
onnxruntime, cosine >= 0.9999 and max error <= 1e-3 of the output's scale, in mnntool's runtime and in MNN."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from mnntool import api  # noqa: E402
from mnntool.format import reader  # noqa: E402
from mnntool.runtime.session import Session  # noqa: E402
from tests.conftest import assert_close, mnn_run, ort_run  # noqa: E402


def _model(path):
    rng = np.random.default_rng(0)
    c = lambda name, v: numpy_helper.from_array(np.asarray(v, np.float32), name)  # noqa: E731
    inits = [c("w", rng.standard_normal((6, 3, 3, 3)) * 0.3), c("one", [1.0]), c("zeros", np.zeros((6, 1, 1))),
             c("ones_big", np.ones((1, 6, 8, 10))), c("zero", [0.0])]
    nodes = [helper.make_node("Conv", ["x", "w"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["a", "one"], ["b"]),          # dropped
             helper.make_node("Add", ["zeros", "b"], ["c"]),        # dropped (constant first)
             helper.make_node("Sub", ["c", "zero"], ["d"]),         # dropped
             helper.make_node("Sub", ["zero", "d"], ["e"]),         # kept: 0 - x
             helper.make_node("ReduceMean", ["e"], ["m"], axes=[2, 3], keepdims=1),
             helper.make_node("Mul", ["m", "ones_big"], ["f"]),     # kept: broadcasts m to (1, 6, 8, 10)
             helper.make_node("Add", ["f", "e"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 10])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 8, 10])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))


def test_identities_dropped_the_rest_kept(tmp_path):
    src, dst = tmp_path / "m.onnx", tmp_path / "m.mnn"
    _model(src)
    api.convert(src, dst)
    g = reader.load(dst)
    ops = [(n.op, n.param.get("opType")) for n in g.nodes if n.op == "BinaryOp"]
    assert sorted(ops) == [("BinaryOp", "ADD"), ("BinaryOp", "MUL"), ("BinaryOp", "SUB")], ops
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 10)).astype(np.float32)
    ref = ort_run(src, {"x": x})["y"]
    assert_close(ref, Session(g).run({"x": x})["y"])
    pytest.importorskip("MNN")
    assert_close(ref, mnn_run(dst, ["x"], ["y"], {"x": x})["y"])
