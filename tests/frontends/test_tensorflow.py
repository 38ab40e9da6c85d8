"""TensorFlow frontend: a Keras MobileNetV2 (.keras), a Keras ResNet-style SavedModel, a frozen .pb op zoo,
Keras recurrent layers (.keras: While loops with TensorLists) and a Keras transformer block (SavedModel: einsums)
-> .mnn -> mnntool's runtime and the real MNN runtime, compared with TensorFlow itself (cosine >= 0.9999,
max abs <= 1e-3 x the output's scale)."""
import os
import sys

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
tf = pytest.importorskip("tensorflow")

import mnntool  # noqa: E402
from mnntool import api  # noqa: E402
from mnntool.errors import MnnToolError  # noqa: E402
from tests.conftest import CACHE, assert_close, mnn_run  # noqa: E402
from tests.test_cli import assert_one_line_error, run  # noqa: E402


def _tf_outputs(name, path, g, x):
    if name in ("mobilenetv2", "rnn"):
        import keras
        return {"output": keras.models.load_model(str(path), compile=False)(x, training=False).numpy()}
    if name in ("resnet", "attention"):
        r = tf.saved_model.load(str(path)).signatures["serving_default"](**{g.inputs[0]: tf.constant(x)})
        return {k: v.numpy() for k, v in r.items()}
    gd = tf.compat.v1.GraphDef()
    gd.ParseFromString(path.read_bytes())
    fn = tf.compat.v1.wrap_function(lambda: tf.graph_util.import_graph_def(gd, name=""), [])
    outs = [fn.graph.get_tensor_by_name(o + ":0") for o in g.outputs]
    pruned = fn.prune([fn.graph.get_tensor_by_name("x:0")], outs)
    return {o: v.numpy() for o, v in zip(g.outputs, pruned(tf.constant(x)))}


@pytest.mark.parametrize("name", ["op_zoo", "resnet", "mobilenetv2", "rnn", "attention"])
def test_tf_model_matches_tensorflow_in_both_runtimes(tmp_path, name):
    from fixtures.tf_models import build
    src = build(name, CACHE)
    dst = tmp_path / f"{name}.mnn"
    api.convert(src, dst)
    sess = mnntool.load(dst)
    g = sess.graph
    key = g.inputs[0]
    x = np.random.default_rng(3).standard_normal(g.tensors[key].shape).astype(np.float32)
    ref = _tf_outputs(name, src, g, x)
    assert sorted(ref) == sorted(g.outputs)
    ours = sess.run({key: x})
    theirs = mnn_run(dst, [key], list(g.outputs), {key: x})
    for o in g.outputs:
        assert_close(ref[o], ours[o])
        assert_close(ref[o], theirs[o])


def test_keras_nhwc_is_converted_once(tmp_path):
    """The Keras MobileNetV2 gets one Permute (at its input) and no batch-norm arithmetic after folding."""
    from fixtures.tf_models import build
    g = api.load_graph(build("mobilenetv2", CACHE))
    assert sum(n.op == "Permute" for n in g.nodes) == 1
    dst = tmp_path / "m.mnn"
    api.convert(build("mobilenetv2", CACHE), dst)
    ops = api.info(dst)["op_counts"]
    assert ops["Convolution"] + ops["ConvolutionDepthwise"] == 53 and ops.get("BinaryOp", 0) <= 10 + 1


def test_input_shape_override_and_batch(tmp_path):
    from fixtures.tf_models import build
    src = build("resnet", CACHE)
    g = api.load_graph(src, input_shapes={"image": (2, 64, 64, 3)})
    assert g.tensors["image"].shape == (2, 64, 64, 3)
    x = np.random.default_rng(5).standard_normal((2, 64, 64, 3)).astype(np.float32)
    dst = tmp_path / "r.mnn"
    api.convert(src, dst, input_shapes={"image": (2, 64, 64, 3)})
    ref = tf.saved_model.load(str(src)).signatures["serving_default"](image=tf.constant(x))["output_0"].numpy()
    assert_close(ref, mnntool.load(dst).run({"image": x})["output_0"])


def test_unsupported_ops_are_listed_at_once(tmp_path):
    @tf.function(input_signature=[tf.TensorSpec([4, 4], tf.float32, name="x")])
    def odd(x):
        return tf.linalg.det(x[None]) + tf.linalg.inv(x)
    path = tmp_path / "odd.pb"
    path.write_bytes(odd.get_concrete_function().graph.as_graph_def().SerializeToString())
    code, out, err = run("convert", path, tmp_path / "o.mnn")
    assert_one_line_error(code, out, err, "unsupported TensorFlow ops", "MatrixDeterminant", "MatrixInverse")
    assert not (tmp_path / "o.mnn").exists()


def test_bad_tf_inputs(tmp_path, monkeypatch):
    bad = tmp_path / "bad.pb"
    bad.write_bytes(b"\x0a\xff\xff\xff garbage")
    assert_one_line_error(*run("convert", bad, tmp_path / "o.mnn"), "not a TensorFlow GraphDef")
    (tmp_path / "empty_dir").mkdir()
    assert_one_line_error(*run("convert", tmp_path / "empty_dir", tmp_path / "o.mnn"), "not a TensorFlow SavedModel")

    @tf.function(input_signature=[tf.TensorSpec([None, None, None, 3], tf.float32, name="img")])
    def dyn(x):
        return tf.nn.relu(x)
    path = tmp_path / "dyn.pb"
    path.write_bytes(dyn.get_concrete_function().graph.as_graph_def().SerializeToString())
    assert_one_line_error(*run("convert", path, tmp_path / "o.mnn"), "--input-shape img:")
    assert run("convert", path, tmp_path / "o.mnn", "--input-shape", "img:1x8x8x3")[0] == 0
    from mnntool.frontends import tensorflow as tff
    monkeypatch.setitem(sys.modules, "tensorflow", None)
    with pytest.raises(MnnToolError, match=r"pip install 'mnntool\[tf\]'"):
        tff._tf()


UNARY_OPS = ["Abs", "Neg", "Floor", "Ceil", "Square", "Sqrt", "Rsqrt", "Exp", "Log", "Sin", "Cos", "Reciprocal",
             "Log1p", "Softplus", "Erf", "Relu", "Relu6", "Sigmoid", "Tanh", "Elu", "LeakyRelu"]
BINARY_OPS = ["AddV2", "Sub", "Mul", "RealDiv", "Maximum", "Minimum", "SquaredDifference", "Pow", "BiasAdd"]


def _single_op_pb(tmp_path, fn, shape):
    f = tf.function(fn, input_signature=[tf.TensorSpec(shape, tf.float32, name="x")])
    path = tmp_path / "op.pb"
    path.write_bytes(f.get_concrete_function().graph.as_graph_def().SerializeToString())
    return path, f


@pytest.mark.parametrize("name", UNARY_OPS + BINARY_OPS)
def test_each_elementwise_op_matches_tensorflow(tmp_path, name):
    """Each op on its own, on an NHWC tensor made NCHW by a convolution first (so the layout path is used)."""
    rng = np.random.default_rng(7)
    w = rng.standard_normal((1, 1, 3, 4)).astype(np.float32)
    other = (rng.random(4) + 0.5).astype(np.float32)      # per-channel constant: permuted for the NCHW tensor
    positive = name in ("Sqrt", "Rsqrt", "Log", "Reciprocal", "Log1p", "Pow")

    def fn(x):
        y = tf.nn.conv2d(x, w, 1, "VALID")
        y = tf.abs(y) + 0.5 if positive else y
        op = getattr(tf.raw_ops, name)
        if name in BINARY_OPS:
            return op(value=y, bias=other) if name == "BiasAdd" else op(x=y, y=other)
        return op(features=y) if name in ("Relu", "Relu6", "Elu", "LeakyRelu", "Softplus") else op(x=y)
    path, f = _single_op_pb(tmp_path, fn, [1, 5, 6, 3])
    x = rng.standard_normal((1, 5, 6, 3)).astype(np.float32)
    dst = tmp_path / "op.mnn"
    api.convert(path, dst)
    g = api.load_graph(dst)
    ref = f(tf.constant(x)).numpy()
    assert_close(ref, mnntool.load(dst).run({"x": x})[g.outputs[0]])
    assert_close(ref, mnn_run(dst, ["x"], [g.outputs[0]], {"x": x})[g.outputs[0]])
