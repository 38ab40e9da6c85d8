"""A residual Add and the LayerNorm reading its sum are planned as one AddLayerNorm step with both
outputs (runtime.fusion.fuse_add_layer_norm); the file keeps the two ops. Reference: onnxruntime on the
ONNX file, max abs error 1e-5."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h

from mnntool import api
from mnntool.runtime.session import Session

ort = pytest.importorskip("onnxruntime")


def _model(path, shape, sum_out: bool, axis: int = -1):
    d = shape[axis]
    nodes = [h.make_node("Add", ["x", "y"], ["s"]),
             h.make_node("LayerNormalization", ["s", "g", "b"], ["n"], axis=axis, epsilon=1e-5),
             h.make_node("Add", ["n", "s"], ["z"])]     # the sum read again: the residual stream
    rng = np.random.default_rng(1)
    pshape = [d] if axis == -1 else list(shape[axis:])
    inits = [onnx.numpy_helper.from_array(rng.standard_normal(pshape).astype(np.float32), n) for n in "gb"]
    outs = [h.make_tensor_value_info("z", TP.FLOAT, None)] + ([h.make_tensor_value_info("s", TP.FLOAT, None)]
                                                              if sum_out else [])
    g = h.make_graph(nodes, "aln", [h.make_tensor_value_info(n, TP.FLOAT, list(shape)) for n in "xy"], outs, inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))


@pytest.mark.parametrize("shape,sum_out", [((1, 16, 64), False), ((2, 9, 48), True), ((37, 200), False)])
def test_add_and_layer_norm_are_one_step(tmp_path, shape, sum_out):
    _model(tmp_path / "a.onnx", shape, sum_out)
    api.convert(tmp_path / "a.onnx", tmp_path / "a.mnn")
    g = api.load_graph(tmp_path / "a.mnn")
    rng = np.random.default_rng(0)
    feeds = {n: (rng.standard_normal(shape) * 3 + 1).astype(np.float32) for n in "xy"}
    sess = ort.InferenceSession(str(tmp_path / "a.onnx"))
    ref = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    s = Session(g)
    got = s.run(feeds)
    ops = [st.op for st in s.plan.steps]
    assert ops.count("AddLayerNorm") == 1 and "LayerNorm" not in ops, ops
    for name, value in ref.items():
        np.testing.assert_allclose(got[name], value, atol=1e-5)
    np.testing.assert_allclose(Session(g).run(feeds, keep_all=True)["z"], ref["z"], atol=1e-5)


def test_a_norm_over_two_axes_stays(tmp_path):
    _model(tmp_path / "a.onnx", (2, 4, 8), False, axis=-2)
    api.convert(tmp_path / "a.onnx", tmp_path / "a.mnn")
    feeds = {n: np.random.default_rng(2).standard_normal((2, 4, 8)).astype(np.float32) for n in "xy"}
    s = Session(api.load_graph(tmp_path / "a.mnn"))
    got = s.run(feeds)["z"]
    assert "AddLayerNorm" not in [st.op for st in s.plan.steps]
    np.testing.assert_allclose(got, ort.InferenceSession(str(tmp_path / "a.onnx")).run(None, feeds)[0], atol=1e-5)
