"""FusedAttention's small-head kernel keeps its binding (operand geometry, compiled entry) across runs where
a view step hands it a new array object over the same memory each run (PVT's keys and values: a Split of
a packed kv tensor sliced, Squeezed), and binds again where the memory differs; outputs equal onnxruntime's at
every run with new inputs (abs error 1e-5, values ~1)."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from mnntool import api
from mnntool.runtime.kernels.ops import attention
from mnntool.runtime.session import Session

ort = pytest.importorskip("onnxruntime")


def _pvt_attention(path, n=20, c=32, heads=2):
    """q from x, k and v from one packed linear layer: Reshape, Transpose, Slice, Squeeze (torch's unbind
    as the dynamo exporter writes it)."""
    rng = np.random.default_rng(0)
    d = c // heads
    w = lambda name, *s: nh.from_array((rng.standard_normal(s) * 0.3).astype(np.float32), name)  # noqa: E731
    ints = {"qs": [1, n, heads, d], "kvs": [1, n, 2, heads, d], "os": [1, n, c], "one": [1], "two": [2]}
    inits = [w("wq", c, c), w("wkv", c, 2 * c), nh.from_array(np.array(d ** -0.5, np.float32), "sc")] + \
        [nh.from_array(np.array(v, np.int64), k) for k, v in ints.items()]
    mk = h.make_node
    nodes = [mk("MatMul", ["x", "wq"], ["q0"]), mk("Reshape", ["q0", "qs"], ["q1"]),
             mk("Transpose", ["q1"], ["q"], perm=[0, 2, 1, 3]),
             mk("MatMul", ["x", "wkv"], ["kv0"]), mk("Reshape", ["kv0", "kvs"], ["kv1"]),
             mk("Transpose", ["kv1"], ["kv"], perm=[2, 0, 3, 1, 4]),
             mk("Slice", ["kv", "zero", "one", "zero"], ["k1"]), mk("Slice", ["kv", "one", "two", "zero"], ["v1"]),
             mk("Squeeze", ["k1", "zero"], ["k"]),
             mk("Squeeze", ["v1", "zero"], ["v"]), mk("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             mk("MatMul", ["q", "kt"], ["s0"]), mk("Mul", ["s0", "sc"], ["s"]), mk("Softmax", ["s"], ["p"], axis=-1),
             mk("MatMul", ["p", "v"], ["o0"]), mk("Transpose", ["o0"], ["o1"], perm=[0, 2, 1, 3]),
             mk("Reshape", ["o1", "os"], ["y"])]
    inits.append(nh.from_array(np.array([0], np.int64), "zero"))
    m = h.make_model(h.make_graph(nodes, "pvt_attention", [h.make_tensor_value_info("x", TP.FLOAT, [1, n, c])],
                                  [h.make_tensor_value_info("y", TP.FLOAT, None)], inits),
                     opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))


def test_binding_kept_over_views_of_the_same_memory(tmp_path, monkeypatch):
    _pvt_attention(tmp_path / "a.onnx")
    api.convert(tmp_path / "a.onnx", tmp_path / "a.mnn")
    binds = []
    bind = attention._Small._bind
    monkeypatch.setattr(attention._Small, "_bind", lambda self, *raw: binds.append(1) or bind(self, *raw))
    s = Session(api.load_graph(tmp_path / "a.mnn"), threads=1)
    ref = ort.InferenceSession(str(tmp_path / "a.onnx"))
    rng = np.random.default_rng(1)
    for _ in range(4):
        x = rng.standard_normal((1, 20, 32)).astype(np.float32)
        np.testing.assert_allclose(s.run({"x": x})["y"], ref.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)
    assert "FusedAttention" in [st.op for st in s.plan.steps]
    assert len(binds) == 1, f"bound {len(binds)} times over 4 runs"


def test_places_tell_memory_apart():
    a = np.zeros((4, 8), np.float32)
    same, other = a.reshape(4, 8), np.zeros((4, 8), np.float32)
    assert attention._places((a, None)) == attention._places((same, None))
    assert attention._places((a,)) != attention._places((other,))
    assert attention._places((a,)) != attention._places((a.T,))
    assert attention._places((a[1:],)) != attention._places((a[:3],))
