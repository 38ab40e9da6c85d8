"""SavedModels are read as data: converting one runs none of its code (a restore-time initializer that
writes a file writes nothing), verify refuses graphs with file or Python ops unless allowed, TF1-style
SavedModels (VariableV2 and resource variables) read their values from the checkpoint. References:
numpy on the values the model was built with, and a TF1 session's own output."""
import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
tf = pytest.importorskip("tensorflow")

import mnntool  # noqa: E402
from mnntool import api  # noqa: E402
from mnntool.errors import MnnToolError  # noqa: E402
from mnntool.frontends.tensorflow.inline import Flattened  # noqa: E402
from tests.test_cli import assert_one_line_error, run  # noqa: E402


def _hostile(tmp_path):
    """A tf.Module whose resource initializer (run by tf.saved_model.load) writes a marker file."""
    marker = tmp_path / "written_at_load.txt"

    class Res(tf.saved_model.experimental.TrackableResource):
        def _create_resource(self):
            return tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[], shared_name="hostile_res")

        def _initialize(self):
            tf.io.write_file(str(marker), "written at load")
            tf.raw_ops.AssignVariableOp(resource=self.resource_handle, value=1.0)

    class M(tf.Module):
        def __init__(self):
            self.w = tf.Variable(np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32))
            self.r = Res()

        @tf.function(input_signature=[tf.TensorSpec([1, 4], tf.float32, name="x")])
        def __call__(self, x):
            return {"y": tf.nn.relu(tf.matmul(x, self.w))}

    m = M()
    src = tmp_path / "sm"
    tf.saved_model.save(m, str(src), signatures={"serving_default": m.__call__})
    return src, marker, m.w.numpy()


def test_convert_runs_no_model_code(tmp_path):
    src, marker, w = _hostile(tmp_path)
    assert not marker.exists()
    dst = tmp_path / "m.mnn"
    api.convert(src, dst)
    assert not marker.exists()
    x = np.random.default_rng(1).standard_normal((1, 4)).astype(np.float32)
    np.testing.assert_allclose(mnntool.load(dst).run({"x": x})["y"], np.maximum(x @ w, 0), rtol=1e-5, atol=1e-6)


def test_verify_refuses_io_ops_unless_allowed(tmp_path):
    src, marker, _ = _hostile(tmp_path)
    dst = tmp_path / "m.mnn"
    api.convert(src, dst)
    code, out, err = run("verify", src, dst)
    assert_one_line_error(code, out, err, "WriteFile", "--allow-io-ops")
    assert not marker.exists()
    code, out, err = run("verify", src, dst, "--allow-io-ops")
    assert code == 0, err
    assert marker.exists()          # the flag means what it says: TensorFlow ran the model's code


def test_io_op_on_the_output_path_is_refused(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("abc")

    class M(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([1, 4], tf.float32, name="x")])
        def __call__(self, x):
            n = tf.cast(tf.strings.length(tf.io.read_file(str(secret))), tf.float32)
            return {"y": x * n}

    m = M()
    tf.saved_model.save(m, str(tmp_path / "sm"), signatures={"serving_default": m.__call__})
    with pytest.raises(MnnToolError, match="ReadFile"):
        api.convert(tmp_path / "sm", tmp_path / "m.mnn")
    assert not (tmp_path / "m.mnn").exists()


def test_tf1_saved_model_variables_come_from_the_checkpoint(tmp_path):
    v1 = tf.compat.v1
    g = tf.Graph()
    rng = np.random.default_rng(2)
    xs = rng.standard_normal((1, 4)).astype(np.float32)
    with g.as_default():
        x = v1.placeholder(tf.float32, [1, 4], name="x")
        w = v1.get_variable("w", initializer=rng.standard_normal((4, 3)).astype(np.float32), use_resource=False)
        b = v1.get_variable("b", initializer=rng.standard_normal(3).astype(np.float32), use_resource=True)
        y = tf.nn.relu(tf.matmul(x, w) + b, name="y")
        with v1.Session(graph=g) as s:
            s.run(v1.global_variables_initializer())
            v1.saved_model.simple_save(s, str(tmp_path / "sm"), {"x": x}, {"y": y})
            ref = s.run(y, {x: xs})
    api.convert(tmp_path / "sm", tmp_path / "m.mnn")
    np.testing.assert_allclose(mnntool.load(tmp_path / "m.mnn").run({"x": xs})["y"], ref, rtol=1e-5, atol=1e-6)


def test_self_calling_function_is_one_line(tmp_path):
    """A library function that calls itself would inline forever; the depth bound ends it."""
    from tensorflow.core.framework import graph_pb2
    gd = graph_pb2.GraphDef()
    f = gd.library.function.add()
    f.signature.name = "loop"
    a = f.signature.input_arg.add()
    a.name, a.type = "x", 1
    o = f.signature.output_arg.add()
    o.name, o.type = "y", 1
    call = f.node_def.add()
    call.name, call.op = "again", "loop"
    call.input.append("x")
    f.ret["y"] = "again:y:0"
    x = gd.node.add()
    x.name, x.op = "x", "Placeholder"
    c = gd.node.add()
    c.name, c.op = "c", "loop"
    c.input.append("x")
    with pytest.raises(MnnToolError, match="deeper than"):
        Flattened(gd, "g.pb").needed(["c:0"])
