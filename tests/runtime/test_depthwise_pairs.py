"""depthwise_pairs (k x k depthwise, two output rows a vector, maps at most 8 wide) against torch's conv2d
with the fused epilogue, and the strategy that runs it (dw-pairs: stride 2 to maps <= 8 wide, fewer than 16
channels) in whole converted models against onnxruntime. Tolerance 2e-5 of the largest output for the kernel (sums of up to
49 products), 5e-5 for the models (a 1x1 convolution and an activation on top)."""
import numpy as np
import pytest

from mnntool.runtime.kernels.micro.float_gemm import HAS_AVX512, epilogue_of
from mnntool.runtime.kernels.micro.epilogue import NO_GRID, POST_HARDSWISH, POST_SILU, RELU6

torch = pytest.importorskip("torch")
F = torch.nn.functional
pytestmark = pytest.mark.skipif(not HAS_AVX512, reason="AVX-512 LLVM IR kernel")


def _geometry(k, s, h, w, t, l):
    """Paddings (top, left, bottom, right) and the output size of a case; None pads are centred."""
    t = k // 2 if t is None else min(t, k - 1)
    l = k // 2 if l is None else min(l, k - 1)
    b_pad, r_pad = k - 1 - t, k - 1 - l
    return t, l, b_pad, r_pad, (h + t + b_pad - k) // s + 1, (w + l + r_pad - k) // s + 1


def _cases():
    """Every kernel size, stride and map of the grid whose output the kernel takes (1 to MAX_WIDTH wide)."""
    from mnntool.runtime.kernels.micro.depthwise_pairs import MAX_WIDTH
    maps = [(14, 14, None, None), (15, 13, None, None), (7, 7, None, None), (16, 16, 1, 2), (5, 3, 0, 0),
            (2, 9, 2, 1), (1, 1, None, None)]
    return [(k, s, *m) for k in (3, 5, 7) for s in (1, 2) for m in maps
            if _geometry(k, s, *m)[5] in range(1, MAX_WIDTH + 1) and _geometry(k, s, *m)[4] >= 1]


@pytest.mark.parametrize("k, s, h, w, t, l", _cases())
@pytest.mark.parametrize("post", [0, POST_SILU, POST_HARDSWISH])
def test_depthwise_pairs_match_torch(k, s, h, w, t, l, post):
    from mnntool.runtime.kernels.micro.depthwise_pairs import depthwise_pairs, pick_index
    t, l, b_pad, r_pad, oh, ow = _geometry(k, s, h, w, t, l)
    c = 5
    rng = np.random.default_rng(k * 1000 + s * 100 + h * 10 + w)
    x = rng.standard_normal((c, h, w)).astype(np.float32)
    wt = rng.standard_normal((c, k * k)).astype(np.float32) / k
    b = rng.standard_normal(c).astype(np.float32)
    ref = F.conv2d(F.pad(torch.from_numpy(x)[None], (l, r_pad, t, b_pad)), torch.from_numpy(wt.reshape(c, 1, k, k)),
                   torch.from_numpy(b), stride=s, groups=c)[0]
    ref = {0: lambda v: v, POST_SILU: F.silu, POST_HARDSWISH: F.hardswish}[post](ref).numpy()
    whole = np.full(ref.size + 16, 7.0, np.float32)     # past the output: the last store must not reach it
    out = whole[:ref.size].reshape(ref.shape)
    epf, grid = epilogue_of(0, NO_GRID, (post, 0.0, 0.0))
    depthwise_pairs(x, wt.reshape(-1), b, k, s, t, l, pick_index(ow, s), epf, grid, np.zeros(w, np.float32), out)
    np.testing.assert_allclose(out, ref, rtol=0, atol=2e-5 * max(1.0, float(np.abs(ref).max())))
    assert (whole[ref.size:] == 7.0).all()


def test_depthwise_pairs_relu6_bounds():
    """The ReLU6 bounds of the epilogue (before any post), 3x3 stride 2 from 14x14 to 7x7."""
    from mnntool.runtime.kernels.micro.depthwise_pairs import depthwise_pairs, pick_index
    rng = np.random.default_rng(1)
    c = 16
    x = (rng.standard_normal((c, 14, 14)) * 4).astype(np.float32)
    wt = rng.standard_normal((c, 9)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    ref = torch.clamp(F.conv2d(torch.from_numpy(x)[None], torch.from_numpy(wt.reshape(c, 1, 3, 3)), torch.from_numpy(b),
                               stride=2, padding=1, groups=c)[0], 0, 6).numpy()
    out = np.empty(ref.shape, np.float32)
    epf, grid = epilogue_of(RELU6, NO_GRID)
    depthwise_pairs(x, wt.reshape(-1), b, 3, 2, 1, 1, pick_index(7, 2), epf, grid, np.zeros(14, np.float32), out)
    np.testing.assert_allclose(out, ref, rtol=0, atol=2e-5 * float(np.abs(ref).max()))


def _model(c, h, w, k, act):
    """Depthwise k x k stride 2 ("same" padding, torch-style) -> activation -> 1x1 convolution, as ONNX."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(c + h + k)
    wd = (rng.standard_normal((c, 1, k, k)) / k).astype(np.float32)
    bd = rng.standard_normal(c).astype(np.float32)
    wp = (rng.standard_normal((8, c, 1, 1)) / np.sqrt(c)).astype(np.float32)
    p = k // 2
    nodes = [helper.make_node("Conv", ["x", "wd", "bd"], ["d"], group=c, kernel_shape=[k, k], strides=[2, 2],
                              pads=[p] * 4)]
    nodes.append(helper.make_node(act, ["d"], ["a"]) if act != "Silu" else None)
    if act == "Silu":
        nodes[-1:] = [helper.make_node("Sigmoid", ["d"], ["sg"]), helper.make_node("Mul", ["d", "sg"], ["a"])]
    nodes.append(helper.make_node("Conv", ["a", "wp"], ["y"], kernel_shape=[1, 1]))
    g = helper.make_graph(nodes, "dw_pairs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, w])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(a, n) for a, n in ((wd, "wd"), (bd, "bd"), (wp, "wp"))])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


# fewer than 16 channels: from 16 channels in the lanes (dw-lanes) runs these layers
@pytest.mark.parametrize("c, h, w, k, act", [(8, 14, 14, 3, "Relu"), (12, 14, 14, 5, "Silu"),
                                             (8, 15, 13, 7, "HardSwish"), (15, 16, 16, 5, "Sigmoid")])
def test_models_with_paired_rows_match_onnxruntime(tmp_path, c, h, w, k, act):
    ort = pytest.importorskip("onnxruntime")
    import onnx

    from mnntool.api import convert, load_session
    from mnntool.runtime.kernels.ops.conv_strategies import Geometry, pick
    p = k // 2
    g = Geometry(1, c, h, w, c, (h + 2 * p - k) // 2 + 1, (w + 2 * p - k) // 2 + 1, k, k, 2, 2, 1, 1, p, p, p, p, c)
    assert pick(g, avx512=True).name == "dw-pairs" and pick(g, avx512=True, post=True).name == "dw-pairs"
    m = _model(c, h, w, k, act)
    onnx.save(m, tmp_path / "m.onnx")
    convert(tmp_path / "m.onnx", tmp_path / "m.mnn")
    x = np.random.default_rng(0).standard_normal((1, c, h, w)).astype(np.float32)
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = load_session(tmp_path / "m.mnn", threads=1).run({"x": x})["y"]
    assert np.abs(got - ref).max() <= 5e-5 * np.abs(ref).max()
