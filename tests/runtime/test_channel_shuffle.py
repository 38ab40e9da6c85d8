"""ShuffleNet's channel shuffle (Concat -> Reshape (n, k, c, h, w) -> Transpose (0, 2, 1, 3, 4) -> Reshape)
is planned as one ChannelShuffle step (runtime.fusion.fuse_channel_shuffle); the file keeps the ops.
Reference: onnxruntime on the ONNX file, exact (the step moves values)."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h

from mnntool import api
from mnntool.runtime.session import Session

ort = pytest.importorskip("onnxruntime")


def _model(path, k: int, shape, extra_output: bool = False):
    n, c, hh, w = shape
    names = [f"x{a}" for a in range(k)]
    nodes = [h.make_node("Relu", [x], [x + "r"]) for x in names]     # producers of their own
    nodes += [h.make_node("Concat", [x + "r" for x in names], ["cat"], axis=1),
              h.make_node("Reshape", ["cat", "s5"], ["v"]),
              h.make_node("Transpose", ["v"], ["t"], perm=[0, 2, 1, 3, 4]),
              h.make_node("Reshape", ["t", "s4"], ["y"])]
    outs = [h.make_tensor_value_info("y", TP.FLOAT, None)] + \
        ([h.make_tensor_value_info("t", TP.FLOAT, None)] if extra_output else [])
    inits = [h.make_tensor("s5", TP.INT64, [5], [n, k, c, hh, w]), h.make_tensor("s4", TP.INT64, [4], [n, k * c, hh, w])]
    g = h.make_graph(nodes, "shuffle", [h.make_tensor_value_info(x, TP.FLOAT, list(shape)) for x in names], outs, inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))


@pytest.mark.parametrize("k,shape", [(2, (1, 58, 7, 9)), (3, (2, 4, 5, 5))])
def test_channel_shuffle_is_one_step(tmp_path, k, shape):
    _model(tmp_path / "s.onnx", k, shape)
    api.convert(tmp_path / "s.onnx", tmp_path / "s.mnn")
    g = api.load_graph(tmp_path / "s.mnn")
    rng = np.random.default_rng(0)
    feeds = {f"x{a}": rng.standard_normal(shape).astype(np.float32) for a in range(k)}
    ref = ort.InferenceSession(str(tmp_path / "s.onnx")).run(None, feeds)[0]
    s = Session(g)
    np.testing.assert_array_equal(s.run(feeds)["y"], ref)
    ops = [st.op for st in s.plan.steps]
    assert "ChannelShuffle" in ops and "Concat" not in ops and "Permute" not in ops, ops
    np.testing.assert_array_equal(Session(g).run(feeds, keep_all=True)["y"], ref)


def test_a_shuffle_read_midway_is_not_fused(tmp_path):
    _model(tmp_path / "s.onnx", 2, (1, 6, 3, 3), extra_output=True)
    api.convert(tmp_path / "s.onnx", tmp_path / "s.mnn")
    g = api.load_graph(tmp_path / "s.mnn")
    feeds = {f"x{a}": np.random.default_rng(a).standard_normal((1, 6, 3, 3)).astype(np.float32) for a in range(2)}
    ref = ort.InferenceSession(str(tmp_path / "s.onnx")).run(None, feeds)
    s = Session(g)
    out = s.run(feeds)
    assert "ChannelShuffle" not in [st.op for st in s.plan.steps]
    np.testing.assert_array_equal(out["y"], ref[0])


@pytest.mark.parametrize("k, shape", [(2, (1, 24, 56, 56)), (3, (2, 5, 7, 9))])
def test_parallel_shuffle_moves_every_value(k, shape):
    """At more threads, with the work for them, the shuffle is k parallel copies (parallel_steps.shuffle,
    copy_strided: rows of a plane, k planes apart): exact against the one-thread NumPy copy, a second run
    into the same buffer; an input that is not C-contiguous takes the NumPy copy."""
    from unittest import mock

    from mnntool.runtime import host_tuning
    from mnntool.runtime.kernels.ops import parallel_steps
    n, c = shape[:2]
    plane = int(np.prod(shape[2:]))
    rng = np.random.default_rng(k)
    xs = [rng.standard_normal(shape).astype(np.float32) for _ in range(k)]
    want = np.stack(xs, 2).reshape(n, c * k, *shape[2:])

    def numpy_run(i, o):
        out = o[0].reshape(n, c, k, plane)
        for a in range(k):
            np.copyto(out[:, :, a], i[a].reshape(n, c, plane))
    with mock.patch.object(host_tuning, "parallel_min_work", lambda threads: 1000):
        run = parallel_steps.shuffle(shape, k, np.float32, 3, numpy_run)
    assert run is not None
    for _ in range(2):
        y = np.full(want.shape, np.nan, np.float32)
        run(xs, [y])
        np.testing.assert_array_equal(y, want)
    y = np.full(want.shape, np.nan, np.float32)
    run([np.asfortranarray(x) for x in xs], [y])
    np.testing.assert_array_equal(y, want)
