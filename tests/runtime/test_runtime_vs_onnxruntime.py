"""mnntool's runtime against onnxruntime: every per-op case and every fixture.

Tolerance (issue 3): cosine >= 0.99999 per output, and max abs <= 1e-3 x the output's scale.
"""
import numpy as np
import pytest

import mnntool
from mnntool import api
from tests.conftest import assert_close, mnn_convert, ort_run
from tests.frontends.test_onnx_ops import CASES, make_model

FIXTURE_FEEDS = {
    "mobilenetv2": lambda r: {"input": r.standard_normal((1, 3, 224, 224)).astype(np.float32)},
    "resnet18": lambda r: {"input": r.standard_normal((1, 3, 224, 224)).astype(np.float32)},
    "bert": lambda r: {"ids": r.integers(0, 1000, (1, 128)).astype(np.int64)},
    "lstm": lambda r: {"input": r.standard_normal((16, 1, 32)).astype(np.float32)},
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_case(tmp_path, name):
    src, dst = tmp_path / f"{name}.onnx", tmp_path / f"{name}.mnn"
    feeds = make_model(src, name)
    ref = ort_run(src, feeds)
    api.convert(src, dst)
    sess = mnntool.load(dst)
    got = sess.run(feeds)
    for out in sess.output_names:
        assert_close(ref[out], got[out], min_cos=0.99999)


@pytest.mark.parametrize("name", sorted(FIXTURE_FEEDS))
def test_fixture(tmp_path, fixture_model, name):
    src = fixture_model(name)
    dst = tmp_path / f"{name}.mnn"
    api.convert(src, dst)
    feeds = FIXTURE_FEEDS[name](np.random.default_rng(5))
    ref = ort_run(src, feeds)["output"]
    sess = mnntool.load(dst, threads=1)
    first = sess.run(feeds)["output"]
    assert_close(ref, first, min_cos=0.99999)
    second = sess.run(feeds)["output"]          # the memory plan must not leak state between runs
    np.testing.assert_array_equal(first, second)


@pytest.mark.parametrize("name", ["mobilenetv2", "resnet18"])
def test_mnn_made_file_runs(tmp_path, fixture_model, name):
    src = fixture_model(name)
    theirs = tmp_path / "theirs.mnn"
    mnn_convert(src, theirs)
    feeds = FIXTURE_FEEDS[name](np.random.default_rng(6))
    assert_close(ort_run(src, feeds)["output"], mnntool.load(theirs).run(feeds)["output"], min_cos=0.99999)


def test_keep_all_exposes_intermediates(tmp_path, fixture_model):
    dst = tmp_path / "r.mnn"
    api.convert(fixture_model("resnet18"), dst)
    sess = mnntool.load(dst)
    feeds = FIXTURE_FEEDS["resnet18"](np.random.default_rng(1))
    every = sess.run(feeds, keep_all=True)
    assert len(every) > 30      # ResNet-18: stem, 8 blocks of 3-4 steps, pool and head
    np.testing.assert_allclose(every["output"], sess.run(feeds)["output"], rtol=1e-5, atol=1e-6)


def test_run_after_prepare_uses_that_plan(tmp_path, fixture_model):
    """bench times the first run after prepare() as the cold run: it must not prepare a second time."""
    dst = tmp_path / "m.mnn"
    api.convert(fixture_model("mobilenetv2"), dst)
    sess = mnntool.load(dst)
    plan = sess.prepare({"input": (1, 3, 224, 224)})
    sess.run(FIXTURE_FEEDS["mobilenetv2"](np.random.default_rng(2)))
    assert sess.plan is plan


def test_wrong_feed_shape_is_a_clear_error(tmp_path, fixture_model):
    from mnntool.errors import MnnToolError
    dst = tmp_path / "m.mnn"
    api.convert(fixture_model("mobilenetv2"), dst)
    with pytest.raises(MnnToolError, match="input 'input'"):
        mnntool.load(dst).run({"input": np.zeros((1, 3, 32), np.float32)})


@pytest.mark.parametrize("hw,stride,pads", [((9, 7), 1, [1, 1, 1, 1]), ((10, 11), 2, [1, 1, 1, 1]),
                                            ((8, 8), 2, [0, 0, 1, 1]), ((6, 13), 1, [2, 0, 0, 2]),
                                            ((5, 5), 2, [0, 0, 0, 0]), ((3, 4), 1, [2, 2, 2, 2]),
                                            ((12, 12), 3, [1, 1, 1, 1]), ((9, 37), 1, [1, 1, 1, 1]),
                                            ((10, 41), 2, [1, 1, 1, 1]), ((6, 35), 1, [2, 0, 0, 2]),
                                            ((7, 34), 2, [0, 0, 1, 1]), ((5, 40), 3, [1, 1, 1, 1]),
                                            ((9, 33), 2, [2, 2, 0, 0]), ((7, 7), 1, [0, 0, 0, 0]),
                                            ((7, 7), 1, [1, 1, 1, 1]), ((14, 14), 1, [1, 1, 1, 1]),
                                            ((5, 9), 1, [2, 0, 0, 2]), ((1, 1), 1, [1, 1, 1, 1]),
                                            ((19, 30), 1, [1, 1, 1, 1]), ((21, 29), 2, [1, 1, 1, 1]),
                                            ((17, 33), 2, [2, 0, 1, 2]), ((9, 70), 1, [1, 1, 1, 1]),
                                            ((10, 131), 2, [1, 1, 1, 1])])
@pytest.mark.parametrize("avx512", [True, False])
def test_depthwise_3x3_kernel_edges(tmp_path, monkeypatch, hw, stride, pads, avx512):
    """Depthwise kernels read padding as zeros at every border, for odd sizes and strides 1-3. With
    AVX-512, strides 1 and 2 take the IR strip kernel (16 columns down blocks of 8 rows, masks set up
    per strip; 19 and 21 rows end blocks part way) on inputs under 64 wide, the IR row kernel (masked
    16-pixel steps at the borders and the row end) on wider ones, and stride-1 maps of the input's
    size up to 8 wide the flat one (16-pixel steps across rows, per-lane tap masks). Without it, stride 1 outputs wider than 6 take the padded-plane kernel, other outputs up to 16
    wide the channels-innermost kernel, wider stride-2 ones the border-checking row kernel; stride 3
    always takes the general row kernel."""
    from mnntool.runtime.kernels.micro import depthwise3x3
    if avx512 and not depthwise3x3.HAS_AVX512:
        pytest.skip("this CPU has no AVX-512")
    monkeypatch.setattr(depthwise3x3, "HAS_AVX512", avx512)
    import onnx
    from onnx import TensorProto as TP, helper as h, numpy_helper as nh
    r = np.random.default_rng(9)
    c = 5
    nodes = [h.make_node("Conv", ["x", "w", "b"], ["c"], group=c, pads=pads, strides=[stride, stride]),
             h.make_node("Clip", ["c", "lo", "hi"], ["y"])]
    inits = [nh.from_array(r.standard_normal((c, 1, 3, 3)).astype(np.float32), "w"),
             nh.from_array(r.standard_normal(c).astype(np.float32), "b"),
             nh.from_array(np.float32(0), "lo"), nh.from_array(np.float32(6), "hi")]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, [2, c, *hw])],
                     [h.make_empty_tensor_value_info("y")], initializer=inits)
    src, dst = tmp_path / "dw.onnx", tmp_path / "dw.mnn"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), src)
    feeds = {"x": r.standard_normal((2, c, *hw)).astype(np.float32) * 3}
    api.convert(src, dst)
    assert_close(ort_run(src, feeds)["y"], mnntool.load(dst).run(feeds)["y"], min_cos=0.99999)
