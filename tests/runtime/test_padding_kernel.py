"""The Padding kernel (ops/tensor.pad_planes: constant pads of the last two axes) and the cases left to the
op's definition (other axes, reflect, negative pads), converted from ONNX Pad and run against onnxruntime:
exact (a copy)."""
import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")


def _pad_model(shape, pads, mode="constant", value=None):
    from onnx import TensorProto, helper, numpy_helper
    inits = [numpy_helper.from_array(np.array(pads, np.int64), "pads")]
    names = ["x", "pads"]
    if value is not None:
        inits.append(numpy_helper.from_array(np.array(value, np.float32), "value"))
        names.append("value")
    # a Relu after it: the pad is an inner node, as in the models (a stem pad before a pool)
    nodes = [helper.make_node("Pad", names, ["p"], mode=mode), helper.make_node("Relu", ["p"], ["y"])]
    g = helper.make_graph(nodes, "pad", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("shape, pads, mode, value", [
    ((1, 16, 12, 12), [0, 0, 0, 0, 0, 0, 1, 1], "constant", None),          # HGNetV2's stem: bottom/right by 1
    ((1, 8, 9, 7), [0, 0, 1, 2, 0, 0, 3, 0], "constant", 0.5),
    ((2, 3, 5, 6), [0, 0, 2, 2, 0, 0, 2, 2], "constant", -1.0),
    ((4, 10, 11), [0, 0, 1, 0, 0, 1], "constant", None),                    # 3-D: the last two axes
    ((1, 4, 6, 6), [0, 1, 0, 0, 0, 0, 0, 0], "constant", 2.0),              # channels: the definition
    ((1, 4, 6, 6), [0, 0, 1, 1, 0, 0, 1, 1], "reflect", None),              # reflect: the definition
    ((1, 4, 6, 6), [0, 0, -1, 1, 0, 0, 2, -2], "constant", None),           # a crop: the definition
])
def test_padding_matches_onnxruntime(tmp_path, shape, pads, mode, value):
    import onnx

    from mnntool.api import convert, load_session
    m = _pad_model(shape, pads, mode, value)
    onnx.save(m, tmp_path / "m.onnx")
    convert(tmp_path / "m.onnx", tmp_path / "m.mnn")
    sess = load_session(tmp_path / "m.mnn", threads=1)
    x = np.random.default_rng(len(shape) + sum(pads)).standard_normal(shape).astype(np.float32)
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    for _ in range(2):      # the second run into the same (now dirty) buffers
        got = sess.run({"x": x})["y"]
        np.testing.assert_array_equal(got, ref)
    pad_steps = [s for s in sess.plan.steps if s.op == "Padding"]
    n = len(shape)      # ONNX pads: every axis's begin, then every axis's end
    fast = min(pads) >= 0 and mode == "constant" and not any(pads[:n - 2] + pads[n:2 * n - 2])
    # the kernel writes into the planned buffer; the definition returns a new array
    assert not pad_steps or pad_steps[0].kernel.writes_out == fast
