"""Nearest Resize on its Numba kernel (ops/resize._nearest: a gather per source row, repeated rows copied)
against onnxruntime: integer and uneven scales, up and down, the nearest modes MNN's Interp carries."""
import numpy as np
import pytest

from mnntool.runtime.session import Session


@pytest.mark.parametrize("mode,nearest", [("asymmetric", "floor"), ("half_pixel", "round_prefer_floor"),
                                          ("align_corners", "round_prefer_floor")])
@pytest.mark.parametrize("shape,sizes", [((1, 3, 7, 7), (14, 14)), ((2, 5, 7, 9), (20, 13)), ((1, 2, 30, 40), (15, 10)),
                                         ((1, 4, 1, 6), (3, 12))])
@pytest.mark.parametrize("threads", [1, 2])
def test_nearest_resize_matches_onnxruntime(tmp_path, mode, nearest, shape, sizes, threads):
    """Values are copies, so the tolerance is zero."""
    import onnx
    from onnx import TensorProto as TP, helper as h
    from mnntool import api
    from tests.conftest import save_onnx
    ort = pytest.importorskip("onnxruntime")
    out = list(shape[:2]) + list(sizes)
    g = h.make_graph([h.make_node("Resize", ["x", "", "", "s"], ["y"], mode="nearest", nearest_mode=nearest,
                                  coordinate_transformation_mode=mode)], "r",
                     [h.make_tensor_value_info("x", TP.FLOAT, list(shape))],
                     [h.make_tensor_value_info("y", TP.FLOAT, out)],
                     [onnx.numpy_helper.from_array(np.array(out, np.int64), "s")])
    save_onnx(g, tmp_path / "r.onnx", opset=13)
    api.convert(tmp_path / "r.onnx", tmp_path / "r.mnn")
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    got = Session(api.load_graph(tmp_path / "r.mnn"), threads).run({"x": x})["y"]
    ref = ort.InferenceSession(str(tmp_path / "r.onnx")).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, ref)
