"""ONNX ScatterND with several coordinates per index is written on the data with those dims joined (MNN
3.6's ScatterNd writes wrong values for multi-coordinate indices: measured 4.36 max error on MNN's own
converter's file): constant and run-time indices, reductions none/add/mul, against onnxruntime exactly in
both runtimes (a scatter moves values; add and mul to 1e-6 of the scale)."""
import numpy as np
import pytest

from mnntool.api import convert
from mnntool.runners import backend_runner
from tests.conftest import ort_run, save_onnx

onnx = pytest.importorskip("onnx")


def _model(path, idx, reduction, runtime_idx):
    from onnx import TensorProto, helper, numpy_helper
    k = idx.shape[-1]
    data = (2, 5, 6, 4)
    upd = idx.shape[:-1] + data[k:]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(data)),
              helper.make_tensor_value_info("u", TensorProto.FLOAT, list(upd))]
    inits = []
    if runtime_idx:
        inputs.append(helper.make_tensor_value_info("i", TensorProto.INT64, list(idx.shape)))
    else:
        inits.append(numpy_helper.from_array(idx, "i"))
    attrs = {"reduction": reduction} if reduction != "none" else {}
    g = helper.make_graph([helper.make_node("ScatterND", ["x", "i", "u"], ["y"], **attrs)], "s", inputs,
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    save_onnx(g, path, opset=18)
    rng = np.random.default_rng(k)
    feeds = {"x": rng.standard_normal(data).astype(np.float32), "u": rng.standard_normal(upd).astype(np.float32)}
    if runtime_idx:
        feeds["i"] = idx
    return feeds


@pytest.mark.parametrize("idx", [np.array([[1, 2], [0, 4]], np.int64), np.array([[[1, 2, 3]], [[0, 4, 5]]], np.int64)],
                         ids=["k2", "k3"])
@pytest.mark.parametrize("reduction", ["none", "add", "mul"])
@pytest.mark.parametrize("runtime_idx", [False, True], ids=["const", "input"])
def test_multi_coordinate_scatter_in_both_runtimes(tmp_path, idx, reduction, runtime_idx):
    feeds = _model(tmp_path / "s.onnx", idx, reduction, runtime_idx)
    convert(tmp_path / "s.onnx", tmp_path / "s.mnn")
    ref = ort_run(tmp_path / "s.onnx", feeds)["y"]
    backends = ["numba"]
    try:
        import MNN  # noqa: F401
        backends.append("mnn")
    except ImportError:
        pass
    for b in backends:
        got = backend_runner(tmp_path / "s.mnn", b, 1).run(feeds)["y"]
        assert np.abs(got - ref).max() <= 1e-6 * max(1.0, float(np.abs(ref).max())), b
