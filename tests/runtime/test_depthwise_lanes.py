"""The channels-in-lanes depthwise kernel (micro/depthwise_lanes.py, strategy dw-lanes) against torch's conv2d:
k 3/5/7, stride 1 and 2, odd and non-square maps, asymmetric pads, channel counts off a multiple of 16, rows
narrower than its 7-pixel tile and rows that end in an overlapping tile, the fused epilogue (ReLU6 bounds,
SiLU, the int8 grid), one and two workers, nothing written past the output; and converted ONNX models
against onnxruntime.

Tolerances: 2e-5 of the output's largest magnitude (fp32 sums of at most 49 products, in another order than
torch's); on the int8 grid, one grid step (a sum on a rounding boundary may round the other way)."""
import numpy as np
import pytest

from mnntool.runtime.kernels.ops.conv_strategies import HAS_AVX512, Geometry, Layer, pick
from mnntool.runtime.kernels.ops.conv_strategies.depthwise import LanesDepthwise
from mnntool.runtime.kernels.micro.epilogue import NO_GRID, NO_POST, POST_SILU, RELU6, grid_of

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not HAS_AVX512, reason="an AVX-512 kernel")


def _run(c, h, w, k, s, pads, act=0, post=NO_POST, grid=NO_GRID, threads=1, n=1, seed=0):
    t, l, b, r = pads
    oh, ow = (h + t + b - k) // s + 1, (w + l + r - k) // s + 1
    g = Geometry(n, c, h, w, c, oh, ow, k, k, s, s, 1, 1, t, l, b, r, c)
    rng = np.random.default_rng(seed)
    wt = rng.standard_normal((c, k * k)).astype(np.float32)
    bias = rng.standard_normal(c).astype(np.float32)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    kern = LanesDepthwise().build(g, Layer(wt, bias, act, grid, threads, post))
    size = n * c * oh * ow
    buf = np.full(size + 64, 7.0, np.float32)       # sentinels past the output
    y = buf[:size].reshape(n, c, oh, ow)
    for _ in range(2):                               # a second run on the same scratch
        kern.fn([x], [y])
    assert (buf[size:] == 7.0).all()
    xt = torch.nn.functional.pad(torch.from_numpy(x), (l, r, t, b))
    ref = torch.nn.functional.conv2d(xt, torch.from_numpy(wt.reshape(c, 1, k, k)), torch.from_numpy(bias), stride=s,
                                     groups=c).numpy()
    if act == RELU6:
        ref = np.clip(ref, 0, 6)
    if post[0] == POST_SILU:
        ref = ref / (1 + np.exp(-ref.astype(np.float64))).astype(np.float32)
    return y, ref


@pytest.mark.parametrize("k", [3, 5, 7])
@pytest.mark.parametrize("s", [1, 2])
@pytest.mark.parametrize("c, h, w", [(16, 7, 7), (40, 14, 14), (17, 9, 13), (33, 4, 6), (20, 28, 27)])
def test_matches_torch(c, h, w, k, s):
    p = k // 2
    y, ref = _run(c, h, w, k, s, (p, p, p, p))
    assert np.abs(y - ref).max() <= 2e-5 * np.abs(ref).max()


@pytest.mark.parametrize("pads", [(0, 0, 1, 1), (1, 0, 0, 2), (0, 0, 0, 0), (3, 2, 1, 0)])
@pytest.mark.parametrize("k, s", [(3, 2), (5, 1), (7, 2)])
def test_asymmetric_pads(pads, k, s):
    y, ref = _run(24, 12, 11, k, s, pads)
    assert np.abs(y - ref).max() <= 2e-5 * np.abs(ref).max()


def test_fused_relu6_and_silu_two_images_two_workers():
    y, ref = _run(48, 14, 14, 3, 1, (1, 1, 1, 1), act=RELU6, n=2, threads=2)
    assert np.abs(y - ref).max() <= 2e-5 * np.abs(ref).max()
    y, ref = _run(72, 14, 14, 5, 2, (2, 2, 2, 2), post=(POST_SILU, 0.0, 0.0), threads=2)
    assert np.abs(y - ref).max() <= 2e-5 * np.abs(ref).max()


def test_int8_grid():
    step = 0.05
    y, ref = _run(32, 7, 7, 3, 1, (1, 1, 1, 1), grid=grid_of(step, -127, 127))
    q = np.clip(np.trunc(ref / step + np.copysign(0.5, ref)), -127, 127) * step
    assert np.abs(y - q).max() <= step * 1.001
    assert np.allclose(y / step, np.round(y / step), atol=1e-3)


@pytest.mark.parametrize("c, h, k, s, want", [(16, 7, 3, 1, "dw-lanes"), (8, 7, 3, 1, "dw-flat"),
                                              (576, 14, 3, 2, "dw-lanes"), (8, 14, 5, 2, "dw-pairs"),
                                              (480, 14, 5, 1, "dw-lanes"), (240, 28, 3, 1, "dw-strips"),
                                              (120, 28, 5, 1, "dw-lanes"), (144, 56, 5, 2, "dw-lanes"),
                                              (144, 56, 3, 2, "dw-strips"), (72, 56, 5, 1, "dw-strips")])
def test_pick(c, h, k, s, want):
    p = k // 2
    o = (h + 2 * p - k) // s + 1
    g = Geometry(1, c, h, h, c, o, o, k, k, s, s, 1, 1, p, p, p, p, c)
    assert pick(g, avx512=True).name == want and pick(g, avx512=True, post=True).name == want


@pytest.mark.parametrize("c, h, w, k, s, act", [(64, 14, 14, 3, 1, "Relu"), (40, 7, 7, 5, 1, "Silu"),
                                                (24, 15, 13, 7, 2, "HardSwish")])
def test_models_match_onnxruntime(tmp_path, c, h, w, k, s, act):
    ort = pytest.importorskip("onnxruntime")
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from mnntool.api import convert, load_session
    rng = np.random.default_rng(1)
    wd = (rng.standard_normal((c, 1, k, k)) * 0.3).astype(np.float32)
    bd = rng.standard_normal(c).astype(np.float32)
    p = k // 2
    o = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    assert pick(Geometry(1, c, h, w, c, *o, k, k, s, s, 1, 1, p, p, p, p, c), avx512=True).name == "dw-lanes"
    nodes = [helper.make_node("Conv", ["x", "wd", "bd"], ["d"], group=c, kernel_shape=[k, k], pads=[p] * 4,
                              strides=[s, s])]
    if act == "Silu":       # x * sigmoid(x): the planner fuses it into the convolution as SiLU
        nodes += [helper.make_node("Sigmoid", ["d"], ["sg"]), helper.make_node("Mul", ["d", "sg"], ["y"])]
    else:
        nodes.append(helper.make_node(act, ["d"], ["y"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, w])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(wd, "wd"), numpy_helper.from_array(bd, "bd")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, tmp_path / "m.onnx")
    convert(tmp_path / "m.onnx", tmp_path / "m.mnn")
    x = rng.standard_normal((1, c, h, w)).astype(np.float32)
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = load_session(tmp_path / "m.mnn", threads=1).run({"x": x})["y"]
    assert np.abs(got - ref).max() <= 2e-5 * np.abs(ref).max()


def test_new_shapes_pack_nothing_again(tmp_path, monkeypatch):
    """A plan for a new input shape reuses the channels-in-lanes depthwise weights and the matvec-lanes FC
    weights packed for the first (weight_cache.packed_once): planning a shape costs no repacking. Outputs
    against onnxruntime, 2e-5 of max |y|."""
    ort = pytest.importorskip("onnxruntime")
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from mnntool.api import convert, load_session
    from mnntool.runtime.kernels.micro import depthwise_lanes, matvec_lanes
    rng = np.random.default_rng(5)
    c = 32
    inits = [numpy_helper.from_array((rng.standard_normal((c, 1, 5, 5)) * 0.3).astype(np.float32), "wd"),
             numpy_helper.from_array((rng.standard_normal((24, c, 1, 1)) * 0.2).astype(np.float32), "wf")]
    nodes = [helper.make_node("Conv", ["x", "wd"], ["d"], group=c, kernel_shape=[5, 5], pads=[2] * 4),
             helper.make_node("GlobalAveragePool", ["d"], ["p"]), helper.make_node("Conv", ["p", "wf"], ["y"])]
    graph = helper.make_graph(nodes, "open", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, "H", "W"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, tmp_path / "m.onnx")
    convert(tmp_path / "m.onnx", tmp_path / "m.mnn")
    packs = []
    for mod, name in ((depthwise_lanes, "lanes_weights"), (matvec_lanes, "pack")):
        real = getattr(mod, name)
        monkeypatch.setattr(mod, name, lambda *a, real=real, name=name: (packs.append(name), real(*a))[1])
    s = load_session(tmp_path / "m.mnn", threads=1)
    ref = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    for k, hw in enumerate([(14, 14), (9, 12), (20, 7)]):
        x = rng.standard_normal((1, c) + hw).astype(np.float32)
        want = ref.run(None, {"x": x})[0]
        assert np.abs(s.run({"x": x})["y"] - want).max() <= 2e-5 * np.abs(want).max()
        if k == 0:
            assert sorted(packs) == ["lanes_weights", "pack"]
    assert sorted(packs) == ["lanes_weights", "pack"]
