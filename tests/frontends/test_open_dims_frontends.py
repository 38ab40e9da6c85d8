"""Dims an exporter leaves open take the size --input-shape gives, in every frontend besides ONNX (issue
49; ONNX: test_open_input_dims.py): TensorFlow (None in a Keras .keras/.h5, a SavedModel signature or a
.pb placeholder), TFLite (shape_signature -1), TorchScript (no declared shapes at all), torch.export .pt2
(torch.export.Dim) and Caffe (input_dim / Input shape 0 or -1). Each model is converted at two sizes and
compared with its own framework at that size (the reference: Keras / tf.function, tf.lite.Interpreter,
torch, a numpy conv for Caffe) in mnntool's runtime and in MNN: cosine >= 0.9999, max abs <= 1e-3 x
max|ref|. A fixed dim given another size is refused in one line naming the input."""
import contextlib
import io
import os
import warnings

import numpy as np
import pytest

from mnntool import api
from mnntool.errors import MnnToolError
from mnntool.runtime.session import Session
from tests.conftest import assert_close, mnn_run
from tests.test_cli import assert_one_line_error, run

SHAPES_NHWC = [(1, 8, 8, 3), (2, 12, 10, 3)]
SHAPES_NCHW = [(1, 3, 8, 8), (2, 3, 12, 10)]


def _dims(shape):
    return "x".join(map(str, shape))


def _check(src, tmp_path, name, shapes, reference, cli=True):
    """Convert src at each shape (the last through the CLI), run both runtimes, compare with reference."""
    for k, shape in enumerate(shapes):
        dst = tmp_path / f"{src.stem}_{k}.mnn"
        if cli and k == len(shapes) - 1:
            code, out, err = run("convert", src, dst, "--input-shape", f"{name}:{_dims(shape)}")
            assert code == 0, err
        else:
            api.convert(src, dst, input_shapes={name: list(shape)})
        g = api.load_graph(dst)
        x = np.random.RandomState(k).uniform(-1, 1, shape).astype(np.float32)
        ref = np.asarray(reference(x), np.float32)
        ours = Session(g).run({g.inputs[0]: x})[g.outputs[0]]
        assert_close(ref, ours)
        theirs = mnn_run(dst, g.inputs, g.outputs, {g.inputs[0]: x})[g.outputs[0]]
        assert_close(ref, theirs)


# --- TensorFlow and TFLite -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def keras_model():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    tf = pytest.importorskip("tensorflow")
    tf.keras.utils.set_random_seed(0)
    x = tf.keras.Input(shape=(None, None, 3), name="img")
    y = tf.keras.layers.Conv2D(4, 3, padding="same", activation="relu")(x)
    y = tf.keras.layers.GlobalAveragePooling2D()(y)
    y = tf.keras.layers.Dense(2)(y)
    return tf, tf.keras.Model(x, y)


def test_keras_and_h5_none_dims(tmp_path, keras_model):
    tf, m = keras_model
    src = tmp_path / "k.keras"
    m.save(src)
    _check(src, tmp_path, "img", SHAPES_NHWC, lambda x: m(x, training=False).numpy())
    assert_one_line_error(*run("convert", src, tmp_path / "r.mnn", "--input-shape", "img:8x8x3"), "img", "rank")
    h5 = tmp_path / "k.h5"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m.save(h5)
    _check(h5, tmp_path, "img", SHAPES_NHWC, lambda x: m(x, training=False).numpy(), cli=False)


def _concrete(tf, m):
    fn = tf.function(lambda img: m(img, training=False))
    return fn.get_concrete_function(tf.TensorSpec([None, None, None, 3], tf.float32, name="img"))


def test_saved_model_and_pb_none_dims(tmp_path, keras_model):
    tf, m = keras_model
    ref = lambda x: m(x, training=False).numpy()  # noqa: E731
    m.export(str(tmp_path / "sm"), verbose=False)     # serving_default: img [None, None, None, 3]
    _check(tmp_path / "sm", tmp_path, "img", SHAPES_NHWC, ref)
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2
    frozen = convert_variables_to_constants_v2(_concrete(tf, m))
    pb = tmp_path / "f.pb"
    pb.write_bytes(frozen.graph.as_graph_def().SerializeToString())
    name = frozen.inputs[0].op.name
    _check(pb, tmp_path, name, SHAPES_NHWC, ref, cli=False)


def test_tflite_shape_signature(tmp_path, keras_model):
    tf, m = keras_model
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        data = tf.lite.TFLiteConverter.from_keras_model(m).convert()
        interp = tf.lite.Interpreter(model_content=data)
    d = interp.get_input_details()[0]
    assert list(d["shape_signature"]) == [-1, -1, -1, 3]
    src = tmp_path / "m.tflite"
    src.write_bytes(data)

    def ref(x):
        interp.resize_tensor_input(d["index"], list(x.shape))
        interp.allocate_tensors()
        interp.set_tensor(d["index"], x)
        interp.invoke()
        return interp.get_tensor(interp.get_output_details()[0]["index"])
    _check(src, tmp_path, d["name"], SHAPES_NHWC, ref)
    bad = run("convert", src, tmp_path / "bad.mnn", "--input-shape", f"{d['name']}:1x8x8x4")    # the fixed 3 channels
    assert_one_line_error(*bad, d["name"], "conflicts")
    assert not (tmp_path / "bad.mnn").exists()


# --- torch: TorchScript and torch.export ------------------------------------------------------------------

@pytest.fixture(scope="module")
def torch_model():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                            torch.nn.Flatten(), torch.nn.Linear(4, 2)).eval()
    return torch, m


def _torch_ref(torch, m):
    def ref(x):
        with torch.no_grad():
            return m(torch.from_numpy(x)).numpy()
    return ref


def test_torchscript_has_no_declared_shape(tmp_path, torch_model):
    torch, m = torch_model
    src = tmp_path / "m.pt"
    torch.jit.script(m).save(str(src))
    name = [v.debugName() for v in torch.jit.load(str(src)).graph.inputs()][1].split(".")[0]
    _check(src, tmp_path, name, SHAPES_NCHW, _torch_ref(torch, m))


def test_exported_dynamic_dims(tmp_path, torch_model):
    torch, m = torch_model
    dims = {"x": {0: torch.export.Dim("n", max=64), 2: torch.export.Dim("h", min=4, max=512),
                  3: torch.export.Dim("w", min=4, max=512)}}

    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = m

        def forward(self, x):
            return self.m(x)
    ep = torch.export.export(Wrap().eval(), (torch.randn(2, 3, 8, 8),), dynamic_shapes=dims)
    src = tmp_path / "m.pt2"
    torch.export.save(ep, str(src))
    _check(src, tmp_path, "x", SHAPES_NCHW, _torch_ref(torch, m))
    with pytest.raises(MnnToolError, match="input-shape x: "):
        api.convert(src, tmp_path / "bad.mnn", input_shapes={"x": [1, 4, 8, 8]})     # channels are fixed at 3
    assert not (tmp_path / "bad.mnn").exists()


# --- Caffe -----------------------------------------------------------------------------------------------

def _caffe(tmp_path, open_dim, legacy):
    from fixtures.caffe_models import NetBuilder
    b = NetBuilder(f"open{open_dim}{'L' if legacy else ''}")
    if legacy:           # the old form: input: "data" input_dim: ... (four per input)
        b.net.input.append("data")
        b.net.input_dim.extend([1, 3, open_dim, open_dim])
        b.shapes["data"] = (1, 3, 8, 8)
    else:
        b.input("data", [1, 3, open_dim, open_dim])
    b.conv("conv", "data", 4, 3)
    b.simple("relu", "ReLU", ["conv"], (1, 4, 8, 8))
    proto = b.save(tmp_path)
    w, bias = (np.asarray(blob.data, np.float32).reshape(tuple(blob.shape.dim)) for blob in b.weights.layer[0].blobs)
    return proto, w, bias


def _conv_relu(x, w, b):
    n, c, h, wd = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((n, w.shape[0], h, wd), np.float64)
    for i in range(3):
        for j in range(3):
            out += np.einsum("nchw,oc->nohw", xp[:, :, i:i + h, j:j + wd], w[:, :, i, j])
    return np.maximum(out + b[None, :, None, None], 0)


@pytest.mark.parametrize("open_dim,legacy", [(0, False), (-1, False), (0, True)])
def test_caffe_open_input_dims(tmp_path, open_dim, legacy):
    proto, w, b = _caffe(tmp_path, open_dim, legacy)
    _check(proto, tmp_path, "data", SHAPES_NCHW, lambda x: _conv_relu(x, w, b))
    assert_one_line_error(*run("convert", proto, tmp_path / "none.mnn"), "data", "--input-shape")
    assert not (tmp_path / "none.mnn").exists()
    assert_one_line_error(*run("convert", proto, tmp_path / "r.mnn", "--input-shape", "data:1x3x8"), "data")
