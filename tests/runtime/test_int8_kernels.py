"""The integer int8 convolution (VNNI micro-kernel) against two references: numpy's int64 matrix product
for the tile and its epilogue, and, for whole convolutions, the real MNN runtime on the same int8 file
and mnntool's float kernels on the int8 grid.

Tolerances: the tile is bit-exact against its float32 formula (MNN's order, int8_gemm.epilogue); whole convolutions may
differ from the float-on-grid path by one grid step where a value sits on a rounding tie (at most 0.5%
of outputs), and agree with MNN to cosine >= 0.9999.
"""
import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP, helper as h, numpy_helper as nh

import mnntool
from mnntool import api
from mnntool.format import reader
from mnntool.quant import QuantConfig, quantize_file
from mnntool.runtime.kernels.micro import int8_gemm
from tests.conftest import mnn_run
from mnntool.compare import metrics

pytestmark = pytest.mark.skipif(not int8_gemm.HAS_VNNI, reason="the integer kernel needs AVX-512 VNNI")


@pytest.mark.parametrize("oc,k,pixels", [(64, 576, 3136), (10, 36, 17), (40, 8, 49), (8, 1200, 1)])
def test_tile_matches_integer_product(oc, k, pixels):
    r = np.random.default_rng(oc + k)
    w = r.integers(-127, 128, (oc, k)).astype(np.int8)
    x = r.integers(0, 256, (pixels, k)).astype(np.uint8)
    scale = (r.random(oc) * 1e-3).astype(np.float32)
    bias = (r.standard_normal(oc) * 20).astype(np.float32)
    blocks, k4 = int8_gemm.pixel_blocks(pixels), -(-k // 4)
    padded = np.zeros((blocks * 16, k4 * 4), np.uint8)
    padded[:pixels, :k] = x
    packed = np.ascontiguousarray(padded.reshape(blocks, 16, k4, 4).transpose(0, 2, 1, 3)).reshape(-1)
    f = np.float32
    ratio, s_out, z = f(0.7), f(0.05), -127          # ReLU (clamp at z), a one-sided 0.05 grid
    epf = (f(z), f(np.inf), ratio, s_out, f(-127), f(127), f(z), f(0), f(0), f(0))
    out = np.full((-(-oc // 8) * 8, pixels), np.nan, np.float32)
    int8_gemm.Int8Weights(w, scale, bias, oc * k * pixels, 2).matmul(packed, epf, out)
    acc = (x.astype(np.int64) @ w.astype(np.int64).T).T
    v = ((acc.astype(f) * scale[:, None]).astype(f) * ratio).astype(f)
    v = np.maximum((v + bias[:, None]).astype(f), f(z))
    q = np.clip(np.trunc((v + np.copysign(f(0.5), v)).astype(f)), -127, 127)
    np.testing.assert_array_equal(out[:oc], ((q - z) * s_out).astype(f))
    float_epf = (f(-np.inf), f(np.inf), ratio, f(0), f(-np.inf), f(np.inf), f(0), f(0), f(0), f(0))   # a float output
    int8_gemm.Int8Weights(w, scale, bias, oc * k * pixels, 2).matmul(packed, float_epf, out)
    np.testing.assert_array_equal(out[:oc], (((acc.astype(f) * scale[:, None]).astype(f) * ratio).astype(f)
                                             + bias[:, None]).astype(f))
    assert np.isnan(out[oc:]).all()       # nothing written past the OC output channels


GEOMETRIES = {   # cin, cout, kernel, stride, pad, dilation, (h, w), batch
    "stem7x7": (3, 16, 7, 2, 3, 1, (30, 30), 1),
    "pointwise_tail": (16, 24, 1, 1, 0, 1, (9, 11), 2),
    "oc_not_8": (8, 10, 3, 1, 1, 1, (7, 7), 1),
    "stride2": (12, 32, 3, 2, 1, 1, (13, 13), 1),
    "dilated_cin5": (5, 8, 3, 1, 2, 2, (10, 10), 1),
    "pointwise_stride2": (16, 16, 1, 2, 0, 1, (8, 8), 1),
}


@pytest.mark.parametrize("name,one_sided", [(k, False) for k in sorted(GEOMETRIES)]
                         + [("stride2", True), ("pointwise_tail", True)])
def test_integer_convolution(tmp_path, name, one_sided, monkeypatch):
    """one_sided: the input passes a ReLU first, so its grid has zero point -127 (the byte offset 1)."""
    cin, cout, k, s, p, d, hw, n = GEOMETRIES[name]
    r = np.random.default_rng(len(name))
    nodes = [h.make_node("Relu" if one_sided else "Identity", ["x"], ["x1"]),
             h.make_node("Conv", ["x1", "w", "b"], ["c0"], strides=[s, s], pads=[p] * 4, dilations=[d, d]),
             h.make_node("Relu", ["c0"], ["c"]),
             h.make_node("Conv", ["c", "w2"], ["c2"]),     # int8, so the first convolution's output is too
             h.make_node("Conv", ["c2", "w3"], ["y"])]
    inits = [nh.from_array(r.standard_normal((cout, cin, k, k)).astype(np.float32) / k, "w"),
             nh.from_array(r.standard_normal(cout).astype(np.float32), "b"),
             nh.from_array(r.standard_normal((4, cout, 1, 1)).astype(np.float32), "w2"),
             nh.from_array(r.standard_normal((4, 4, 1, 1)).astype(np.float32), "w3")]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, [n, cin, *hw])],
                     [h.make_empty_tensor_value_info("y")], initializer=inits)
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), tmp_path / "m.onnx")
    api.convert(tmp_path / "m.onnx", tmp_path / "m.mnn")
    calib = tmp_path / "calib"
    calib.mkdir()
    for i in range(3):
        np.save(calib / f"{i}.npy", r.standard_normal((n, cin, *hw)).astype(np.float32))
    quantize_file(tmp_path / "m.mnn", tmp_path / "q.mnn", QuantConfig(int8=True, calib=calib, method="minmax"))
    q = reader.load(tmp_path / "q.mnn")
    conv = next(node for node in q.nodes if "symmetricQuan" in node.param)
    assert conv.param["symmetricQuan"]["zeroPoint"] == (-127 if one_sided else 0)
    assert conv.param["symmetricQuan"]["outputZeroPoint"] == -127          # after a ReLU
    feeds = {"x": r.standard_normal((n, cin, *hw)).astype(np.float32)}
    mid = conv.outputs[0]
    ours = mnntool.load(tmp_path / "q.mnn").run(feeds, keep_all=True)[mid]
    monkeypatch.setattr(int8_gemm, "HAS_VNNI", False)          # the float kernels on the int8 grid
    on_grid = mnntool.load(tmp_path / "q.mnn").run(feeds, keep_all=True)[mid]
    step = float(conv.param["quanParameter"]["scaleOut"])
    diff = np.abs(ours - on_grid)
    assert diff.max() <= step * 1.001 and (diff > step / 2).mean() <= 0.005
    theirs = mnn_run(tmp_path / "q.mnn", q.inputs, [mid], feeds)[mid]
    assert metrics(theirs, ours)["cosine"] >= 0.9999
