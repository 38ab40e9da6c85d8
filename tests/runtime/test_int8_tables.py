"""A table op (SiLU, sigmoid) fused into the int8 convolution it reads (plan stage fuse_int8_tables,
kernels.ops.int8_tables): the VNNI tile's epilogue and the depthwise requantize look the op's int8
codes up with byte permutes (int8_gemm.lut_bytes). References: numpy's lookup of the same codes for
the kernels (bit-exact), the same session unfused (keep_all plans fuse nothing: bit-exact) and the
real MNN runtime on the same int8 file (cosine >= 0.9999, as tests/runtime/test_int8_kernels.py); its
first 3x3 convolution (30 pixels a row) runs from the grid (int8_gemm.gemm_planes)."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP, helper as h, numpy_helper as nh

from mnntool import api
from mnntool.loading import load_graph
from mnntool.compare import metrics
from mnntool.format import reader
from mnntool.quant import QuantConfig, quantize_file
from mnntool.runtime.kernels import sized
from mnntool.runtime.kernels.micro import int8_conv, int8_gemm
from mnntool.runtime.session import Session
from tests.conftest import mnn_run

pytestmark = pytest.mark.skipif(not (int8_gemm.HAS_VNNI and int8_gemm.HAS_VBMI),
                                reason="the table epilogue needs AVX-512 VNNI and VBMI")
f = np.float32


@pytest.mark.parametrize("oc,k,pixels", [(24, 64, 200), (10, 36, 17), (8, 8, 64)])
def test_tile_looks_up_the_codes(oc, k, pixels):
    r = np.random.default_rng(oc * k)
    w = r.integers(-127, 128, (oc, k)).astype(np.int8)
    x = r.integers(0, 256, (pixels, k)).astype(np.uint8)
    blocks, k4 = int8_gemm.pixel_blocks(pixels), -(-k // 4)
    padded = np.zeros((blocks * 16, k4 * 4), np.uint8)
    padded[:pixels, :k] = x
    packed = np.ascontiguousarray(padded.reshape(blocks, 16, k4, 4).transpose(0, 2, 1, 3)).reshape(-1)
    alpha = (r.random(oc) * 2e-3).astype(f)
    bias = (r.standard_normal(oc) * 3).astype(f)
    out_grid = (0.05, -128, 127, 0)
    weights = int8_gemm.Int8Weights(w, alpha, bias, 1, 1)
    rows, plain_epf = int8_gemm.epilogue(alpha, bias, w.astype(np.int64).sum(1), 0.1, 0, out_grid, 0)
    plain = np.full((-(-oc // 8) * 8, pixels), np.nan, f)
    int8_gemm.Int8Weights(w, *rows, 1, 1).matmul(packed, plain_epf, plain)
    codes = r.integers(-128, 128, 256).astype(np.int8)
    z_t, s_t = f(-3), f(0.125)
    _, epf = int8_gemm.epilogue(alpha, bias, w.astype(np.int64).sum(1), 0.1, 0, out_grid, 0, (z_t, s_t))
    out = np.full_like(plain, np.nan)
    weights = int8_gemm.Int8Weights(w, *rows, 1, 1)
    weights.matmul(packed, epf, out, int8_gemm.byte_table(codes))
    q = np.rint(plain[:oc] / f(0.05)).astype(np.int64) + 128        # byte - q_lo
    np.testing.assert_array_equal(out[:oc], ((codes[q].astype(f) - z_t) * s_t).astype(f))
    assert np.isnan(out[oc:]).all()


@pytest.mark.parametrize("p", [1, 63, 64, 200])
def test_depthwise_requantize_looks_up_the_codes(p):
    r = np.random.default_rng(p)
    c = 5
    v = (r.integers(-4000, 4000, (c, p)).astype(f) * f(0.05))
    scale, acc_bias = (r.random(c) * 0.02).astype(f), r.integers(-40, 40, c).astype(f)
    args = (v, f(20), acc_bias, scale, f(-3e38), f(3e38), f(-128), f(127))
    plain = np.empty((c, p), f)
    sized(int8_conv.requantize_rows, 1, 1)(*args, f(0), f(1), plain)      # the byte values, as floats
    codes = r.integers(-128, 128, 256).astype(np.int8)
    out = np.full((c, p), np.nan, f)
    lo, hi = int8_conv.merged_bounds(*args[4:8])
    sized(int8_conv.requantize_acc_table, 1, 1)(*args[:4], lo, hi, args[6], int8_gemm.byte_table(codes), f(7), f(0.5),
                                                 out)
    np.testing.assert_array_equal(out, ((codes[(plain + 128).astype(np.int64)].astype(f) - f(7)) * f(0.5)).astype(f))


def _silu(x, y, n):
    return [h.make_node("Sigmoid", [x], [f"{n}_s"]), h.make_node("Mul", [x, f"{n}_s"], [y])]


def test_fused_silu_matches_unfused_and_mnn(tmp_path):
    r = np.random.default_rng(0)
    nodes = [h.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1] * 4), *_silu("c0", "a0", "a"),
             h.make_node("Conv", ["a0", "w1", "b1"], ["c1"], pads=[1] * 4, group=16), *_silu("c1", "a1", "b"),
             h.make_node("Conv", ["a1", "w2"], ["c2"]), h.make_node("Sigmoid", ["c2"], ["g"]),
             h.make_node("Conv", ["g", "w3"], ["y"])]
    inits = [nh.from_array(r.standard_normal((16, 8, 3, 3)).astype(f) / 3, "w0"),
             nh.from_array(r.standard_normal(16).astype(f), "b0"),
             nh.from_array(r.standard_normal((16, 1, 3, 3)).astype(f) / 2, "w1"),
             nh.from_array(r.standard_normal(16).astype(f), "b1"),
             nh.from_array(r.standard_normal((12, 16, 1, 1)).astype(f) / 4, "w2"),
             nh.from_array(r.standard_normal((4, 12, 1, 1)).astype(f) / 3, "w3")]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, [1, 8, 16, 30])],
                     [h.make_empty_tensor_value_info("y")], initializer=inits)
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), tmp_path / "m.onnx")
    api.convert(tmp_path / "m.onnx", tmp_path / "m.mnn")
    calib = tmp_path / "calib"
    calib.mkdir()
    for i in range(3):
        np.save(calib / f"{i}.npy", r.standard_normal((1, 8, 16, 30)).astype(f))
    quantize_file(tmp_path / "m.mnn", tmp_path / "q.mnn", QuantConfig(int8=True, calib=calib, method="minmax"))
    feeds = {"x": r.standard_normal((1, 8, 16, 30)).astype(f)}
    session = Session(load_graph(tmp_path / "q.mnn"), 1)
    fused = session.run(feeds)
    ops = [st.op for st in session.plan.ran]
    assert ops.count("Convolution") + ops.count("ConvolutionDepthwise") == 4
    assert not {"FusedSiLU", "Sigmoid", "UnaryOp"} & set(ops), ops      # every table op in a convolution
    unfused = session.run(feeds, keep_all=True)       # keep_all plans fuse nothing
    y = next(iter(fused))
    np.testing.assert_array_equal(fused[y], unfused[y])
    q = reader.load(tmp_path / "q.mnn")
    theirs = mnn_run(tmp_path / "q.mnn", q.inputs, q.outputs, feeds)
    assert metrics(theirs[q.outputs[0]], fused[y])["cosine"] >= 0.9999
