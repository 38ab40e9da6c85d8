"""A depthwise convolution between token/plane transposes run on the tokens (plan/fuse_token_depthwise.py ->
kernels/ops/token_depthwise.py), against onnxruntime on the same ONNX model: abs and relative error 1e-5
(values ~1; the taps add in another order). PVT-v2's 3 x 3 (its "DWConv"), 5 x 5 strided, dilated, a
fused ReLU, channels not a multiple of 16, two images, a GELU (tanh form) / sigmoid / HardSwish after the
transpose back (in the step), at 1 and 2 threads; left to the ops (still equal) where a transpose has another
reader."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from mnntool import api
from mnntool.runtime.session import Session

ort = pytest.importorskip("onnxruntime")
TOL = dict(rtol=1e-5, atol=1e-5)


def _model(path, b, hw, c, k=3, stride=1, dilation=1, relu=False, extra=False, act=None):
    """x (b, H*W, c) -> Transpose -> Reshape (b, c, H, W) -> depthwise Conv [-> Relu] -> Reshape -> Transpose."""
    rng = np.random.default_rng(0)
    hh, ww = hw
    pad = dilation * (k // 2)
    span = dilation * (k - 1) + 1
    oh, ow = (hh + 2 * pad - span) // stride + 1, (ww + 2 * pad - span) // stride + 1
    inits = [nh.from_array((rng.standard_normal((c, 1, k, k)) * 0.3).astype(np.float32), "w"),
             nh.from_array(rng.standard_normal(c).astype(np.float32), "bias"),
             nh.from_array(np.array([b, c, hh, ww], np.int64), "s4"),
             nh.from_array(np.array([b, c, oh * ow], np.int64), "s3")]
    mk = h.make_node
    nodes = [mk("Transpose", ["x"], ["t"], perm=[0, 2, 1]), mk("Reshape", ["t", "s4"], ["p"]),
             mk("Conv", ["p", "w", "bias"], ["c0"], pads=[pad] * 4, group=c, strides=[stride] * 2,
                dilations=[dilation] * 2)]
    if relu:
        nodes.append(mk("Relu", ["c0"], ["c"]))
    nodes += [mk("Reshape", ["c" if relu else "c0", "s3"], ["f"]),
              mk("Transpose", ["f"], ["ft" if act else "y"], perm=[0, 2, 1])]
    if act:         # an activation after the transpose back (PVT's GELU): in the step's epilogue
        nodes.append(mk(act, ["ft"], ["y"], **({"approximate": "tanh"} if act == "Gelu" else {})))
    outputs = [h.make_tensor_value_info("y", TP.FLOAT, None)]
    if extra:       # the first transpose read again: not fused
        nodes.append(mk("Neg", ["t"], ["y2"]))
        outputs.append(h.make_tensor_value_info("y2", TP.FLOAT, None))
    x = h.make_tensor_value_info("x", TP.FLOAT, [b, hh * ww, c])
    m = h.make_model(h.make_graph(nodes, "g", [x], outputs, inits),
                     opset_imports=[h.make_opsetid("", 20 if act == "Gelu" else 17)])
    m.ir_version = 8
    onnx.save(m, str(path))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", [dict(b=1, hw=(12, 10), c=32),                      # PVT-v2's
                                  dict(b=2, hw=(9, 11), c=40, k=5, stride=2),
                                  dict(b=1, hw=(7, 9), c=70, dilation=2, relu=True),
                                  dict(b=1, hw=(1, 5), c=16), dict(b=1, hw=(4, 3), c=7),
                                  dict(b=1, hw=(6, 6), c=8, extra=True),
                                  dict(b=1, hw=(8, 8), c=48, act="Gelu"), dict(b=1, hw=(5, 6), c=20, act="Sigmoid"),
                                  dict(b=1, hw=(5, 6), c=24, act="HardSwish", relu=True)])
def test_token_depthwise_matches_onnxruntime(tmp_path, case, threads):
    _model(tmp_path / "m.onnx", **case)
    api.convert(tmp_path / "m.onnx", tmp_path / "m.mnn")
    b, (hh, ww), c = case["b"], case["hw"], case["c"]
    x = np.random.default_rng(1).standard_normal((b, hh * ww, c)).astype(np.float32)
    s = Session(api.load_graph(tmp_path / "m.mnn"), threads=threads)
    got = s.run({"x": x})
    ops = [st.op for st in s.plan.steps]
    assert ("TokenDepthwise" in ops) == (not case.get("extra"))
    assert ("Permute" in ops) == bool(case.get("extra"))
    assert len(ops) == (1 if not case.get("extra") else len(ops))      # the activation taken in too
    want = ort.InferenceSession(str(tmp_path / "m.onnx")).run(None, {"x": x})
    np.testing.assert_allclose(got["y"], want[0], **TOL)
