"""The documented Python API (mnntool.convert/quantize/verify/load/bench/info), end to end against
onnxruntime, and its errors as MnnToolError."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, helper as h, numpy_helper as nh

import mnntool


@pytest.fixture
def model(tmp_path):
    rng = np.random.RandomState(0)
    w = nh.from_array(rng.randn(8, 3, 3, 3).astype(np.float32) * 0.3, "w")
    w2 = nh.from_array(rng.randn(4, 8, 1, 1).astype(np.float32) * 0.3, "w2")
    g = h.make_graph([h.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["c"], ["r"]),
                      h.make_node("Conv", ["r", "w2"], ["y"])], "g",
                     [h.make_tensor_value_info("x", TP.FLOAT, [1, 3, 16, 16])],
                     [h.make_tensor_value_info("y", TP.FLOAT, None)], initializer=[w, w2])
    path = tmp_path / "m.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), path)
    return path


def test_api_end_to_end(model, tmp_path):
    import mnntool.timing  # noqa: F401  -- the modules behind verify and bench do not shadow the functions
    import mnntool.verifier  # noqa: F401
    mnn = tmp_path / "m.mnn"
    r = mnntool.convert(model, mnn)
    assert r["size_bytes"] == mnn.stat().st_size
    assert mnntool.info(mnn)["inputs"][0]["shape"] == [1, 3, 16, 16]
    x = np.random.RandomState(1).randn(1, 3, 16, 16).astype(np.float32)
    ref = ort.InferenceSession(str(model)).run(None, {"x": x})[0]
    got = mnntool.load(mnn).run({"x": x})["y"]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    calib = [{"x": np.random.RandomState(k).randn(1, 3, 16, 16).astype(np.float32)} for k in range(6)]
    q = mnntool.quantize(mnn, tmp_path / "q.mnn", int8=True, calib=calib, samples=5)
    assert q["mode"] == "int8" and q["calibration_samples"] == 4 and q["outputs"][0]["cosine"] > 0.99
    v = mnntool.verify(model, tmp_path / "q.mnn", feeds=calib[:2], min_cosine=0.99)
    assert v["pass"] and v["samples"] == 2
    b = mnntool.bench(mnn, warmup=0, runs=2)
    assert b["runs"] == 2 and b["median_ms"] > 0
    with pytest.raises(mnntool.MnnToolError, match="no such file"):
        mnntool.convert(tmp_path / "none.onnx", tmp_path / "o.mnn")
