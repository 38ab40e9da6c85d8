"""Conv+BatchNorm+ReLU/ReLU6 fold and fuse: fewer ops, same outputs in the real MNN runtime as onnxruntime.

Tolerance: cosine >= 0.9999, max abs <= 1e-3 x the output's scale.
"""
import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP, helper as h, numpy_helper as nh

from mnntool import api
from tests.conftest import assert_close, mnn_run, ort_run

R = np.random.RandomState(1)


def _model(path, act):
    f = lambda *s: R.randn(*s).astype(np.float32)  # noqa: E731
    nodes = [h.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             h.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["bn"])]
    if act == "relu":
        nodes.append(h.make_node("Relu", ["bn"], ["y"]))
    elif act == "relu6":
        nodes.append(h.make_node("Clip", ["bn", "lo", "hi"], ["y"]))
    else:
        nodes.append(h.make_node("Clip", ["bn", "lo", "hi5"], ["y"]))   # not ReLU6: must stay
    inits = [nh.from_array(v, n) for n, v in [("w", f(8, 3, 3, 3)), ("s", f(8)), ("b", f(8)), ("m", f(8)),
                                             ("v", np.abs(f(8)) + .5), ("lo", np.float32(0)), ("hi", np.float32(6)),
                                             ("hi5", np.float32(5))]]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, [1, 3, 10, 10])],
                     [h.make_empty_tensor_value_info("y")], initializer=inits)
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), path)


@pytest.mark.parametrize("act,left", [("relu", {"Convolution"}), ("relu6", {"Convolution"}),
                                      ("clip5", {"Convolution", "ReLU6"})])
def test_conv_bn_act_fused_and_correct(tmp_path, act, left):
    src, dst, raw = tmp_path / "m.onnx", tmp_path / "m.mnn", tmp_path / "m0.mnn"
    _model(src, act)
    report = api.convert(src, dst)
    assert "fold_affine_into_conv" in report["passes_changed"]
    ops = set(api.info(dst)["op_counts"]) - {"ConvertTensor"}
    assert ops == left
    api.convert(src, raw, optimize=0)
    assert "Scale" in api.info(raw)["op_counts"]
    feeds = {"x": R.randn(1, 3, 10, 10).astype(np.float32)}
    ref = ort_run(src, feeds)["y"]
    for path in (dst, raw):
        assert_close(ref, mnn_run(path, ["x"], ["y"], feeds)["y"])


def test_fixture_has_no_bn_or_standalone_relu(fixture_model, tmp_path):
    dst = tmp_path / "mb.mnn"
    api.convert(fixture_model("mobilenetv2"), dst)
    counts = api.info(dst)["op_counts"]
    assert not {"Scale", "ReLU", "ReLU6", "Identity", "Dropout"} & set(counts)


@pytest.mark.parametrize("first", ["conv", "matmul"])
def test_add_with_fused_relu_is_not_folded_as_affine(tmp_path, first):
    """Regression: once fuse_relu_into_binary gave an Add its ReLU, folding that Add into the conv (or the
    MatMul-turned-conv's bias) dropped the ReLU."""
    f = lambda *s: R.randn(*s).astype(np.float32)  # noqa: E731
    if first == "conv":
        nodes = [h.make_node("Conv", ["x", "w"], ["c"]), h.make_node("Add", ["c", "b"], ["a"])]
        inits, shape = [nh.from_array(f(4, 3, 1, 1), "w"), nh.from_array(f(1, 4, 1, 1), "b")], [1, 3, 5, 5]
    else:
        nodes = [h.make_node("MatMul", ["x", "w"], ["c"]), h.make_node("Add", ["c", "b"], ["a"])]
        inits, shape = [nh.from_array(f(6, 4), "w"), nh.from_array(f(4), "b")], [2, 6]
    nodes.append(h.make_node("Relu", ["a"], ["y"]))
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, shape)],
                     [h.make_empty_tensor_value_info("y")], initializer=inits)
    src, dst = tmp_path / "m.onnx", tmp_path / "m.mnn"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), src)
    feeds = {"x": f(*shape)}
    ref = ort_run(src, feeds)["y"]
    api.convert(src, dst, passes=["fuse_relu_into_binary", "fold_affine_into_conv", "matmul_to_conv"])
    assert_close(ref, mnn_run(dst, ["x"], ["y"], feeds)["y"])
    assert (ref == 0).any()


@pytest.mark.parametrize("pads,fused", [([0, 0, 1, 0, 0, 0, 2, 1], True), ([0, 1, 0, 0, 0, 0, 0, 0], False)])
def test_zero_pad_folds_into_the_conv(tmp_path, pads, fused):
    """Spatial zero padding (asymmetric too) becomes the conv's pads; channel padding stays a Padding op."""
    f = lambda *s: R.randn(*s).astype(np.float32)  # noqa: E731
    cin = 3 + pads[1] + pads[5]
    nodes = [h.make_node("Pad", ["x", "p"], ["xp"]), h.make_node("Conv", ["xp", "w"], ["y"], strides=[2, 2])]
    inits = [nh.from_array(np.array(pads, np.int64), "p"), nh.from_array(f(4, cin, 3, 3), "w")]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, [1, 3, 9, 8])],
                     [h.make_empty_tensor_value_info("y")], initializer=inits)
    src, dst = tmp_path / "m.onnx", tmp_path / "m.mnn"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), src)
    report = api.convert(src, dst)
    assert ("fuse_pad_into_conv" in report["passes_changed"]) == fused
    assert ("Padding" in api.info(dst)["op_counts"]) != fused
    feeds = {"x": f(1, 3, 9, 8)}
    assert_close(ort_run(src, feeds)["y"], mnn_run(dst, ["x"], ["y"], feeds)["y"])
    import mnntool
    assert_close(ort_run(src, feeds)["y"], mnntool.load(dst).run(feeds)["y"])
