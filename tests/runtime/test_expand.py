"""BroadcastTo (ONNX Expand) into the planned buffer (kernels/ops/tensor.py broadcast_to), against
onnxruntime: exactly equal (a copy). MobileViTv2's context vector expanded over the patches, gcvit's
global query over the windows, a target smaller than the input on an axis (kept)."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from mnntool import api
from mnntool.runtime.session import Session

ort = pytest.importorskip("onnxruntime")


@pytest.mark.parametrize("shape,target,then", [((1, 8, 4, 1), (1, 8, 4, 49), "Mul"),
                                               ((1, 1, 7, 7, 16), (1, 4, 7, 7, 16), None),
                                               ((2, 3, 5), (1, 3, 1), None),
                                               ((1, 6, 1), (4, 6, 5), "Add")])
@pytest.mark.parametrize("threads", [1, 2])
def test_expand_matches_onnxruntime(tmp_path, shape, target, then, threads):
    full = tuple(np.broadcast_shapes(shape, target))
    nodes = [h.make_node("Expand", ["x", "t"], ["e" if then else "y"])]
    inputs = [h.make_tensor_value_info("x", TP.FLOAT, list(shape))]
    if then:
        nodes.append(h.make_node(then, ["e", "z"], ["y"]))
        inputs.append(h.make_tensor_value_info("z", TP.FLOAT, list(full)))
    m = h.make_model(h.make_graph(nodes, "g", inputs, [h.make_tensor_value_info("y", TP.FLOAT, None)],
                                  [nh.from_array(np.array(target, np.int64), "t")]),
                     opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "m.onnx"))
    api.convert(tmp_path / "m.onnx", tmp_path / "m.mnn")
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
    if then:
        feeds["z"] = rng.standard_normal(full).astype(np.float32)
    s = Session(api.load_graph(tmp_path / "m.mnn"), threads=threads)
    s.run(feeds)
    assert "BroadcastTo" in [st.op for st in s.plan.steps]
    want = ort.InferenceSession(str(tmp_path / "m.onnx")).run(None, feeds)[0]
    for _ in range(2):      # the planned buffer written again
        np.testing.assert_array_equal(s.run(feeds)["y"], want)
