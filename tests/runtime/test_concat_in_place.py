"""Concat without copies (runtime/concat_in_place.py): producers write into the Concat's output and the
Concat step is dropped, with the values onnxruntime computes (within 1e-5)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from mnntool import api
from mnntool.runtime.session import Session

ort = pytest.importorskip("onnxruntime")


def _dense_block(path, layers=4, growth=3, c0=4, extra_outputs=(), twice=False):
    """DenseNet's pattern: before each layer, Concat of every earlier feature map; optionally a
    feature map that is also a graph output, and a Concat reading one tensor twice."""
    rng = np.random.RandomState(0)
    nodes, inits = [h.make_node("Conv", ["x", "w0"], ["f0"], kernel_shape=[1, 1])], []
    inits.append(nh.from_array(rng.randn(c0, 3, 1, 1).astype(np.float32), "w0"))
    feats, c = ["f0"], c0
    for k in range(1, layers + 1):
        nodes.append(h.make_node("Concat", list(feats), [f"cat{k}"], axis=1))
        nodes.append(h.make_node("Relu", [f"cat{k}"], [f"r{k}"]))
        inits.append(nh.from_array(rng.randn(growth, c, 3, 3).astype(np.float32) * 0.3, f"w{k}"))
        nodes.append(h.make_node("Conv", [f"r{k}", f"w{k}"], [f"f{k}"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]))
        feats.append(f"f{k}")
        c += growth
    last = feats + ([feats[-1]] if twice else [])
    nodes.append(h.make_node("Concat", last, ["y"], axis=1))
    outs = [h.make_tensor_value_info(n, TP.FLOAT, None) for n in ["y", *extra_outputs]]
    g = h.make_graph(nodes, "dense", [h.make_tensor_value_info("x", TP.FLOAT, [1, 3, 9, 11])], outs, inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))


@pytest.mark.parametrize("case", ["block", "output inside", "input twice"])
def test_concats_written_in_place(tmp_path, case):
    kw = {"block": {}, "output inside": {"extra_outputs": ("f2", "cat3")}, "input twice": {"twice": True}}[case]
    _dense_block(tmp_path / "d.onnx", **kw)
    api.convert(tmp_path / "d.onnx", tmp_path / "d.mnn")
    g = api.load_graph(tmp_path / "d.mnn")
    x = np.random.RandomState(1).randn(1, 3, 9, 11).astype(np.float32)
    sess = ort.InferenceSession(str(tmp_path / "d.onnx"))
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {"x": x})))
    s = Session(g)
    for _ in range(2):      # the second run reads buffers the first left behind
        got = s.run({"x": x})
        for name, ref in want.items():
            np.testing.assert_allclose(got[name], ref, rtol=1e-5, atol=1e-5, err_msg=name)
    steps = [st for st in s.plan.steps if st.op == "Concat"]
    dropped = sum(st.elided for st in steps)
    if case == "input twice":
        assert dropped == len(steps) - 1 == 4, "the last Concat reads f4 twice: it copies, the others are in place"
    else:   # graph outputs inside a Concat are views of its bytes, copied out by run() like any output
        assert dropped == len(steps) == 5, "every Concat of the block is a part of the last"
    whole = Session(g).run({"x": x}, keep_all=True)
    np.testing.assert_allclose(whole["y"], want["y"], rtol=1e-5, atol=1e-5)
