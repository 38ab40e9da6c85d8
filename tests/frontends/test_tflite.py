"""The TFLite frontend against tf.lite.Interpreter (the reference), in mnntool's runtime and MNN's, on
models TensorFlow's TFLiteConverter makes: a MobileNet-style CNN (float, int8, int8 with int8 I/O), a
Keras LSTM (a WHILE loop in the file), and op-coverage functions. Tolerances: float cosine >= 0.9999
and max abs <= 1e-3 x max|ref|; int8 cosine >= 0.999 vs TFLite's own int8 arithmetic (MNN rounds
with float scales where TFLite uses fixed-point multipliers)."""
import warnings

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from fixtures import tflite_models as M  # noqa: E402
from mnntool import api  # noqa: E402
from mnntool.errors import MnnToolError  # noqa: E402
from mnntool.format import reader  # noqa: E402
from mnntool.runtime.session import Session  # noqa: E402
from tests.conftest import assert_close, mnn_run  # noqa: E402


def reference(data: bytes, feeds: list):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        interp = tf.lite.Interpreter(model_content=data)
    interp.allocate_tensors()
    for d, x in zip(interp.get_input_details(), feeds):
        interp.set_tensor(d["index"], x)
    interp.invoke()
    return [interp.get_tensor(d["index"]) for d in interp.get_output_details()], interp


def convert_and_run(tmp_path, data: bytes, feeds: list, name="m"):
    src, dst = tmp_path / f"{name}.tflite", tmp_path / f"{name}.mnn"
    src.write_bytes(data)
    api.convert(src, dst)
    g = reader.load(dst)
    named = dict(zip(g.inputs, feeds))
    ours = Session(g).run(named)
    theirs = mnn_run(dst, g.inputs, g.outputs, named)
    return g, [ours[o] for o in g.outputs], [theirs[o] for o in g.outputs]


def test_mobilenet_float(tmp_path):
    data = M.mobilenet_float()
    x = np.random.RandomState(0).uniform(-1, 1, (1, 32, 32, 3)).astype(np.float32)
    (ref,), _ = reference(data, [x])
    g, (ours,), (theirs,) = convert_and_run(tmp_path, data, [x])
    assert g.source == "TFLITE"
    assert_close(ref, ours)
    assert_close(ref, theirs)


def test_int8_model_keeps_its_int8_weights_and_scales(tmp_path):
    data = M.mobilenet_int8()
    x = np.random.RandomState(0).uniform(-1, 1, (1, 32, 32, 3)).astype(np.float32)
    (ref,), interp = reference(data, [x])
    g, (ours,), (theirs,) = convert_and_run(tmp_path, data, [x])
    int8 = [n for n in g.nodes if "symmetricQuan" in n.param]
    assert len(int8) >= 8
    # the first convolution's weights are the file's own int8 values, its output grid the file's scale
    details = {d["name"]: d for d in interp.get_tensor_details()}
    scales = sorted(d["quantization"][0] for d in details.values() if d["dtype"] == np.int8 and d["quantization"][0])
    out_scale = int8[0].param["quanParameter"]["scaleOut"]
    assert any(abs(out_scale - s) <= 1e-7 * s for s in scales)
    assert_close(ref, ours, min_cos=0.999, rel_abs=0.05)
    assert_close(ref, theirs, min_cos=0.999, rel_abs=0.05)
    # both runtimes read the int8 layers alike (exact agreement of int8 files is the int8 issue's subject)
    assert_close(theirs, ours, min_cos=0.9995, rel_abs=0.05)


def test_int8_inputs_and_outputs(tmp_path):
    data = M.mobilenet_int8(int8_io=True)
    x = np.random.RandomState(0).randint(-128, 128, (1, 32, 32, 3)).astype(np.int8)
    (ref,), _ = reference(data, [x])
    g, (ours,), (theirs,) = convert_and_run(tmp_path, data, [x])
    assert g.tensors[g.inputs[0]].dtype == "int8" and ours.dtype == np.int8 and theirs.dtype == np.int8
    for got in (ours, theirs):
        assert np.abs(got.astype(int) - ref.astype(int)).max() <= 2
        assert_close(ref.astype(np.float32), got.astype(np.float32), min_cos=0.999, rel_abs=0.05)


def test_keras_lstm_while_loop(tmp_path):
    data = M.lstm_model()
    x = np.random.RandomState(0).randn(2, 12, 8).astype(np.float32)
    (ref,), _ = reference(data, [x])
    _, (ours,), (theirs,) = convert_and_run(tmp_path, data, [x])
    assert_close(ref, ours)
    assert_close(ref, theirs)


def _coverage_functions():
    f32 = tf.float32

    def elementwise(x, y):
        a = tf.abs(x) + tf.exp(-tf.square(y)) - tf.math.sqrt(tf.abs(y) + 1.0) * tf.math.rsqrt(tf.abs(x) + 1.0)
        b = tf.math.log(tf.abs(x) + 1.0) / (tf.abs(y) + 0.5) + tf.sin(x) * tf.cos(y) - tf.floor(x) + tf.math.ceil(y)
        c = tf.maximum(x, y) - tf.minimum(x, y) + tf.math.squared_difference(x, y) + tf.round(x * 3.0)
        d = tf.nn.relu(x) + tf.nn.relu6(y * 4.0) + tf.nn.leaky_relu(x, 0.3) + tf.nn.elu(y) + tf.sigmoid(x) + tf.tanh(y)
        e = tf.where(x > y, x, y) + tf.where(tf.logical_and(x < 0.5, y >= -0.5), 1.0, 0.0) \
            + tf.cast(tf.logical_or(tf.equal(x, y), tf.not_equal(x, 0.0)), f32) + tf.pow(tf.abs(x) + 0.5, y)
        f = tf.nn.gelu(x, approximate=False) + tf.nn.gelu(y, approximate=True) - tf.negative(x) \
            + tf.cast(tf.logical_not(x <= y), f32) + tf.math.floormod(x, 0.7) + tf.math.floordiv(y, 0.3)
        return a + b + c + d + e + f + tf.add_n([x, y, x * y])

    def shapes(x):              # x: 2x6x8
        s = tf.strided_slice(x, [0, 1, 0], [2, 5, 8], [1, 2, 1])
        r = tf.reshape(s, [2, 16])
        t = tf.transpose(x, [0, 2, 1])
        parts = tf.split(t, 2, axis=1)
        v1, v2 = tf.split(x, [2, 4], axis=1)
        u = tf.unstack(x, axis=1)
        p = tf.stack([u[0], u[3]], axis=0)
        pad = tf.pad(x, [[0, 0], [1, 2], [0, 1]])
        mpad = tf.pad(x, [[0, 0], [2, 1], [1, 1]], mode="REFLECT")
        tile = tf.tile(x[:, :1], [1, 3, 1])
        g = tf.gather(x, [3, 0, 5], axis=1)
        gnd = tf.gather_nd(x, [[0, 1], [1, 4]])
        sl = tf.slice(x, [0, 2, 1], [2, 3, -1])
        sq = tf.squeeze(x[:, :1, :], axis=1)
        ex = tf.expand_dims(sq, 1)
        bm = tf.matmul(x, t[:, :, :5])
        cs = tf.cumsum(x, axis=2)
        return [r, parts[0] + parts[1][:, :, :6][:, :4], v1, v2, p, pad, mpad, tile, g, gnd, sl, ex, bm, cs,
                tf.broadcast_to(x[:, :1, :1], [2, 3, 8])]

    def reductions(x):          # x: 2x6x8
        return [tf.reduce_mean(x, axis=1), tf.reduce_sum(x, axis=[1, 2], keepdims=True), tf.reduce_max(x, axis=2),
                tf.reduce_min(x, axis=0), tf.reduce_prod(x[:, :2, :3] + 1.0, axis=2),
                tf.cast(tf.argmax(x, axis=2), tf.int32), tf.cast(tf.argmin(x, axis=1), tf.int32),
                tf.nn.softmax(x, axis=-1), tf.nn.log_softmax(x, axis=-1), tf.nn.l2_normalize(x, axis=-1),
                tf.cast(tf.reduce_any(x > 1.0, axis=2), f32), tf.cast(tf.reduce_all(x > -1.0, axis=2), f32)]

    def images(x):              # x: 1x8x8x4
        a = tf.image.resize(x, [16, 12], method="bilinear")
        b = tf.image.resize(x, [4, 16], method="nearest")
        c = tf.compat.v1.image.resize_bilinear(x, [5, 7], align_corners=True)
        d = tf.nn.depth_to_space(x, 2)
        e = tf.nn.space_to_depth(x, 2)
        f = tf.nn.local_response_normalization(x, depth_radius=1, bias=1.0, alpha=0.5, beta=0.75)
        w = tf.constant(np.random.RandomState(3).randn(3, 3, 5, 4).astype(np.float32))
        tconv = tf.nn.conv2d_transpose(x, w, [1, 16, 16, 5], strides=2, padding="SAME")
        return [a, b, c, d, e, f, tconv, tf.nn.max_pool2d(x, 3, 2, "SAME"), tf.nn.avg_pool2d(x, 2, 2, "VALID")]
    return {"elementwise": (elementwise, [((2, 5, 7), f32)] * 2), "shapes": (shapes, [((2, 6, 8), f32)]),
            "reductions": (reductions, [((2, 6, 8), f32)]), "images": (images, [((1, 8, 8, 4), f32)])}


@pytest.mark.parametrize("name", ["elementwise", "shapes", "reductions", "images"])
def test_op_coverage(tmp_path, name):
    fn, specs = _coverage_functions()[name]
    data = M.from_function(fn, *specs)
    rng = np.random.RandomState(4)
    feeds = [rng.uniform(-2, 2, s).astype(np.float32) for s, _ in specs]
    refs, interp = reference(data, feeds)
    _, ours, theirs = convert_and_run(tmp_path, data, feeds, name)
    for ref, a, b in zip(refs, ours, theirs):
        for got in (a, b):
            assert got.shape == ref.shape, (name, got.shape, ref.shape)
            assert_close(ref.astype(np.float64), got.astype(np.float64), rel_abs=2e-3)


def test_corrupt_and_foreign_files(tmp_path):
    data = M.mobilenet_float()
    bad = tmp_path / "t.tflite"
    bad.write_bytes(data[:200])
    with pytest.raises(MnnToolError, match="corrupt TFLite flatbuffer|names"):
        api.convert(bad, tmp_path / "o.mnn")
    bad.write_bytes(b"\x00" * 64)
    with pytest.raises(MnnToolError, match="not a TFLite model"):
        api.convert(bad, tmp_path / "o.mnn")
    assert not (tmp_path / "o.mnn").exists()


def test_hostile_loops_are_refused(tmp_path):
    """A WHILE whose body is the graph holding it, or one that never ends, is one error, not a crash."""
    from mnntool.frontends.tflite import Model, TfliteCtx, run_subgraph
    from mnntool.ir.graph import Graph
    scalar = {"shape": np.zeros(0, np.int32), "type": 2, "buffer": 1, "name": "c", "quantization": None}
    true = {"data": np.array([1, 0, 0, 0], np.uint8), "offset": 0, "size": 0}

    def model(cond_k, body_k):
        loop = {"opcode_index": 0, "inputs": [0], "outputs": [0], "builtin_options_type": "WhileOptions",
                "builtin_options": {"cond_subgraph_index": cond_k, "body_subgraph_index": body_k}}
        main = {"tensors": [scalar], "inputs": [0], "outputs": [0], "operators": [loop], "name": "main"}
        cond = {"tensors": [scalar], "inputs": [0], "outputs": [0], "operators": [], "name": "cond"}
        body = {"tensors": [dict(scalar, buffer=0)], "inputs": [0], "outputs": [0], "operators": [], "name": "body"}
        return Model(tmp_path / "h.tflite", {"operator_codes": [{"builtin_code": 119, "deprecated_builtin_code": 119}],
                                             "subgraphs": [main, cond, body], "buffers": [{}, true]})
    for cond_k, body_k, message in ((1, 0, "nested more than"), (1, 2, "loop steps to unroll")):
        m = model(cond_k, body_k)
        ctx = TfliteCtx(Graph(), str(tmp_path / "h.tflite"), m.subgraphs[0]["tensors"])
        with pytest.raises(MnnToolError, match=message):
            run_subgraph(ctx, m, 0, m.constants(ctx, 0))
