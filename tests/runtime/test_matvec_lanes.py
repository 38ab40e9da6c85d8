"""The batch-1 fully connected kernel with 16 outputs in the lanes (micro/matvec_lanes.py, strategy matvec-lanes)
against torch's linear: input sizes off a multiple of its four chains (1, 3, 5, 6, 48, 1027), outputs off a
multiple of 16 (4, 17, 1000), the fused epilogue (ReLU6 bounds, sigmoid, SiLU, the int8 grid), one and two
workers, nothing written past the output; and converted ONNX models (a squeeze-excite block's FCs, a
classifier's Gemm) against onnxruntime.

Tolerances: 1e-5 of the output's largest magnitude (fp32 sums of up to 1027 products in another order than
torch's), the sigmoid's 1e-6 absolute on top; on the int8 grid one grid step."""
import numpy as np
import pytest

from mnntool.runtime.kernels.ops.conv_strategies import HAS_AVX512, Geometry, Layer, pick
from mnntool.runtime.kernels.ops.conv_strategies.matvec import LanesMatVec
from mnntool.runtime.kernels.micro.epilogue import NO_GRID, NO_POST, POST_SIGMOID, POST_SILU, RELU6, grid_of

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not HAS_AVX512, reason="an AVX-512 kernel")


def _run(cin, cout, act=0, post=NO_POST, grid=NO_GRID, threads=1):
    g = Geometry(1, cin, 1, 1, cout, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1)
    rng = np.random.default_rng(cin * 7 + cout)
    w = (rng.standard_normal((cout, cin)) / np.sqrt(cin)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    x = rng.standard_normal((1, cin, 1, 1)).astype(np.float32)
    kern = LanesMatVec().build(g, Layer(w, b, act, grid, threads, post))
    buf = np.full(cout + 40, 7.0, np.float32)
    y = buf[:cout].reshape(1, cout, 1, 1)
    kern.fn([x], [y])
    assert (buf[cout:] == 7.0).all()
    ref = torch.nn.functional.linear(torch.from_numpy(x.reshape(1, cin)), torch.from_numpy(w),
                                     torch.from_numpy(b)).numpy().reshape(y.shape)
    if act == RELU6:
        ref = np.clip(ref, 0, 6)
    if post[0] == POST_SIGMOID:
        ref = torch.sigmoid(torch.from_numpy(ref)).numpy()
    elif post[0] == POST_SILU:
        ref = torch.nn.functional.silu(torch.from_numpy(ref)).numpy()
    return y, ref


@pytest.mark.parametrize("cin", [1, 3, 5, 6, 48, 1027])
@pytest.mark.parametrize("cout", [4, 17, 1000])
def test_matches_torch(cin, cout):
    y, ref = _run(cin, cout)
    assert np.abs(y - ref).max() <= 1e-5 * np.abs(ref).max()


@pytest.mark.parametrize("act, post", [(RELU6, NO_POST), (0, (POST_SIGMOID, 0.0, 0.0)), (0, (POST_SILU, 0.0, 0.0))])
@pytest.mark.parametrize("threads", [1, 2])
def test_fused_epilogue(act, post, threads):
    y, ref = _run(240, 1152, act, post, threads=threads)
    assert np.abs(y - ref).max() <= 1e-5 * np.abs(ref).max() + 1e-6


def test_int8_grid():
    step = 0.05
    y, ref = _run(96, 40, grid=grid_of(step, -127, 127))
    q = np.clip(np.trunc(ref / step + np.copysign(0.5, ref)), -127, 127) * step
    assert np.abs(y - q).max() <= step * 1.001


def test_pick():
    def fc(cin, cout):
        return Geometry(1, cin, 1, 1, cout, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1)
    assert pick(fc(48, 1152), avx512=True).name == "matvec-lanes"
    assert pick(fc(48, 1152), avx512=False).name == "blas-rows"
    assert pick(fc(1024, 2048), avx512=True).name == "matvec-lanes"
    assert pick(fc(1280, 1000), avx512=True).name == "matvec"


def test_squeeze_excite_and_head_match_onnxruntime(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from mnntool.api import convert, load_session
    rng = np.random.default_rng(3)
    c, r, k = 96, 8, 1000
    inits = {"w1": rng.standard_normal((r, c, 1, 1)) * 0.2, "b1": rng.standard_normal(r),
             "w2": rng.standard_normal((c, r, 1, 1)) * 0.3, "b2": rng.standard_normal(c),
             "wf": rng.standard_normal((k, c)) * 0.1, "bf": rng.standard_normal(k)}
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["m"]),
             helper.make_node("Conv", ["m", "w1", "b1"], ["s1"]), helper.make_node("Relu", ["s1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["s2"]), helper.make_node("Sigmoid", ["s2"], ["g"]),
             helper.make_node("Mul", ["x", "g"], ["y"]),
             helper.make_node("GlobalAveragePool", ["y"], ["p"]), helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "wf", "bf"], ["logits"], transB=1)]
    graph = helper.make_graph(nodes, "se", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 7, 7])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v.astype(np.float32), n) for n, v in inits.items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, tmp_path / "m.onnx")
    convert(tmp_path / "m.onnx", tmp_path / "m.mnn")
    x = rng.standard_normal((1, c, 7, 7)).astype(np.float32)
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = load_session(tmp_path / "m.mnn", threads=1).run({"x": x})["logits"]
    assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()
