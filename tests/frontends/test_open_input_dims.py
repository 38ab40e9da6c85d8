"""Dims an ONNX exporter marks open (-1, '?', a symbol, 0 when --input-shape gives it) take the size
--input-shape gives (issue 49, item 3: the PP-OCR direction classifier declares [-1, 3, '?', '?']); two
'?' are two sizes, not one. Reference: onnxruntime."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h

from mnntool import api
from mnntool.errors import MnnToolError
from mnntool.runtime.session import Session
from tests.conftest import save_onnx

ort = pytest.importorskip("onnxruntime")


def _model(path, dims):
    """conv 3->8 (3x3, padded), ReLU, global average pool, a 8->2 MatMul: a classifier head over any H, W."""
    rng = np.random.RandomState(0)
    inits = [onnx.numpy_helper.from_array((rng.randn(8, 3, 3, 3) * 0.3).astype(np.float32), "w"),
             onnx.numpy_helper.from_array(rng.randn(8, 2).astype(np.float32), "fc"),
             onnx.numpy_helper.from_array(np.array([-1, 8], np.int64), "s")]
    nodes = [h.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["c"], ["r"]),
             h.make_node("GlobalAveragePool", ["r"], ["p"]), h.make_node("Reshape", ["p", "s"], ["f"]),
             h.make_node("MatMul", ["f", "fc"], ["y"])]
    x = h.make_tensor_value_info("x", TP.FLOAT, [1, 3, 4, 4])
    for d, v in zip(x.type.tensor_type.shape.dim, dims):
        if isinstance(v, int):
            d.dim_value = v
        else:
            d.dim_param = v
    g = h.make_graph(nodes, "cls", [x], [h.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    save_onnx(g, path)
    return path


def _ort(path, x):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@pytest.mark.parametrize("dims", [[-1, 3, "?", "?"], [0, 3, "?", "?"], ["batch", 3, "h", "w"], [-1, 3, -1, -1]])
def test_input_shape_fills_open_dims(tmp_path, dims):
    src = _model(tmp_path / "cls.onnx", dims)
    dst = tmp_path / "cls.mnn"
    api.convert(src, dst, input_shapes={"x": (1, 3, 48, 192)})
    g = api.load_graph(dst)
    assert tuple(g.tensors["x"].shape) == (1, 3, 48, 192)
    x = np.random.default_rng(1).standard_normal((1, 3, 48, 192)).astype(np.float32)
    got = Session(g).run({"x": x})["y"]
    ref = _model(tmp_path / "ref.onnx", [-1, 3, "h", "w"])     # onnxruntime reads a 0 as a fixed 0
    np.testing.assert_allclose(got, _ort(ref, x), rtol=1e-4, atol=1e-5)


def test_anonymous_dims_are_independent(tmp_path):
    """Without --input-shape, '?' and -1 stay open, each on its own: H != W runs."""
    src = _model(tmp_path / "cls.onnx", [-1, 3, "?", "?"])
    dst = tmp_path / "cls.mnn"
    api.convert(src, dst)
    s = Session(api.load_graph(dst))
    for hw in [(48, 192), (32, 100)]:
        x = np.random.default_rng(2).standard_normal((1, 3) + hw).astype(np.float32)
        np.testing.assert_allclose(s.run({"x": x})["y"], _ort(src, x), rtol=1e-4, atol=1e-5)


def test_fixed_dim_still_conflicts(tmp_path):
    src = _model(tmp_path / "cls.onnx", [-1, 3, "?", "?"])
    with pytest.raises(MnnToolError, match="conflicts"):
        api.convert(src, tmp_path / "cls.mnn", input_shapes={"x": (1, 4, 48, 192)})
