"""Pooling token mixers (plan/fuse_pool_mixer.py -> kernels/ops/pool_mixer.py): r + s * (avgpool(y) - y)
as PoolFormer and EfficientFormer write it, against onnxruntime on the same ONNX model, abs and relative
error 1e-5 (values ~1: the box sums add in another order than onnxruntime's window loop). Padding
counted or not, y - pool, no layer scale, no residual, a 5 x 5 pool, maps of one or two rows or
columns, at 1 and 2 threads; left to the ops (still equal) where the pattern does not hold."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from mnntool import api
from mnntool.runtime.session import Session

ort = pytest.importorskip("onnxruntime")
TOL = dict(rtol=1e-5, atol=1e-5)


def _run_both(tmp_path, nodes, shape, inits, threads=1):
    rng = np.random.default_rng(0)
    m = h.make_model(h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, list(shape))],
                                  [h.make_tensor_value_info("y", TP.FLOAT, None)], inits),
                     opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "m.onnx"))
    api.convert(tmp_path / "m.onnx", tmp_path / "m.mnn")
    feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
    ref = ort.InferenceSession(str(tmp_path / "m.onnx")).run(None, feeds)[0]
    s = Session(api.load_graph(tmp_path / "m.mnn"), threads=threads)
    return s.run(feeds)["y"], ref, [st.op for st in s.plan.steps]


def _mixer(c, k=3, include=0, reverse=False, scale="channel", residual="x", norm=False):
    """Nodes and initializers: [norm ->] pool -> Sub [-> Mul(scale)] [-> Add(residual)] -> y."""
    rng = np.random.default_rng(1)
    inits, nodes = [], []
    y = "x"
    if norm:        # PoolFormer: the mixer reads a norm of x, the residual is x
        inits.append(nh.from_array((rng.random((1, c, 1, 1)) + 0.5).astype(np.float32), "g"))
        nodes.append(h.make_node("Mul", ["x", "g"], ["xn"]))
        y = "xn"
    nodes.append(h.make_node("AveragePool", [y], ["ap"], kernel_shape=[k, k], pads=[k // 2] * 4,
                             count_include_pad=include))
    last = "d"
    nodes.append(h.make_node("Sub", [y, "ap"] if reverse else ["ap", y], [last]))
    if scale:
        shape = (c, 1, 1) if scale == "channel" else (1,)
        inits.append(nh.from_array((rng.standard_normal(shape) * 0.5).astype(np.float32), "ls"))
        nodes.append(h.make_node("Mul", ["ls", last], ["m"]))
        last = "m"
    if residual:
        nodes.append(h.make_node("Add", [last, residual] if residual == "x" else [residual, last], ["y"]))
    else:
        nodes[-1].output[0] = "y"
    return nodes, inits


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", [
    dict(),                                             # EfficientFormer: x + ls * (pool(x) - x)
    dict(norm=True),                                    # PoolFormer: x + ls * (pool(norm(x)) - norm(x))
    dict(include=1, reverse=True, scale="scalar"),
    dict(scale=None, residual=None),
    dict(k=5, residual="xn", norm=True),
])
@pytest.mark.parametrize("shape", [(1, 8, 14, 14), (2, 3, 1, 5), (1, 4, 2, 1), (1, 5, 7, 9)])
def test_pool_mixer_matches_onnxruntime(tmp_path, case, shape, threads):
    nodes, inits = _mixer(shape[1], **case)
    got, ref, ops = _run_both(tmp_path, nodes, shape, inits, threads)
    assert "PoolMixer" in ops and "Pooling" not in ops
    assert ops.count("BinaryOp") == (1 if case.get("norm") else 0)
    np.testing.assert_allclose(got, ref, **TOL)


def test_not_fused_where_the_pattern_breaks(tmp_path):
    """A stride-2 pool, and a pool whose output has a second reader: the ops as they are."""
    shape = (1, 4, 8, 8)
    nodes = [h.make_node("AveragePool", ["x"], ["ap"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]),
             h.make_node("Sub", ["ap", "ap"], ["y"])]
    got, ref, ops = _run_both(tmp_path, nodes, shape, [])
    assert "PoolMixer" not in ops
    np.testing.assert_allclose(got, ref, **TOL)
    nodes = [h.make_node("AveragePool", ["x"], ["ap"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             h.make_node("Sub", ["ap", "x"], ["d"]), h.make_node("Mul", ["d", "ap"], ["y"])]
    got, ref, ops = _run_both(tmp_path, nodes, shape, [])
    assert "PoolMixer" not in ops and "Pooling" in ops
    np.testing.assert_allclose(got, ref, **TOL)
