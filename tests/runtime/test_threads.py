"""One Session shared by many threads (a web service's thread pool): every concurrent run gives, bit for
bit, the answer the same input gets run alone. A plan's buffers and its kernels' work arrays serve one
run at a time (Session._checkout); runs that find every plan of their shape busy prepare another."""
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h

import mnntool
from mnntool import api
from mnntool.runtime import session as session_mod
from tests.conftest import save_onnx


def _open_model(path):
    """Two padded convolutions on open H/W (the issue's OCR-like case), then a residual add."""
    rng = np.random.RandomState(0)
    inits = [onnx.numpy_helper.from_array((rng.randn(8, 3, 3, 3) * 0.3).astype(np.float32), "w1"),
             onnx.numpy_helper.from_array((rng.randn(8, 8, 3, 3) * 0.3).astype(np.float32), "w2")]
    nodes = [h.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             h.make_node("Relu", ["c1"], ["r1"]),
             h.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             h.make_node("Add", ["c2", "r1"], ["y"])]
    g = h.make_graph(nodes, "open", [h.make_tensor_value_info("x", TP.FLOAT, [1, 3, "H", "W"])],
                     [h.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    save_onnx(g, path)


def _hammer(sess, feeds_list, threads, calls_each):
    """Each of `threads` workers runs `calls_each` feeds (cycling through feeds_list from its own offset);
    returns [(feed index, output)]."""
    def work(t):
        got = []
        for k in range(calls_each):
            i = (t * 7 + k) % len(feeds_list)
            got.append((i, sess.run(feeds_list[i])))
        return got
    with ThreadPoolExecutor(threads) as pool:
        return [r for part in pool.map(work, range(threads)) for r in part]


def _check(sess, feeds_list, threads, calls_each):
    alone = [sess.run(f) for f in feeds_list]
    results = _hammer(sess, feeds_list, threads, calls_each)
    assert len(results) == threads * calls_each
    for i, out in results:
        for name, ref in alone[i].items():
            np.testing.assert_array_equal(out[name], ref, err_msg=f"feed {i} output {name}")
    # after the storm, plans kept stay bounded
    assert all(len(v) <= session_mod.MAX_IDLE_PER_SHAPE for v in sess._idle.values())
    assert len(sess._plans) <= session_mod.MAX_PLANS


@pytest.fixture(scope="module")
def mobilenet(tmp_path_factory, fixture_model):
    dst = tmp_path_factory.mktemp("threads") / "m.mnn"
    api.convert(fixture_model("mobilenetv2"), dst)
    return dst


@pytest.mark.parametrize("threads,calls", [(8, 6), (16, 3)])
def test_shared_session_mobilenet(mobilenet, threads, calls):
    sess = mnntool.load(mobilenet)
    rng = np.random.default_rng(threads)
    feeds = [{"input": rng.standard_normal((1, 3, 224, 224)).astype(np.float32)} for _ in range(6)]
    _check(sess, feeds, threads, calls)


def test_shared_session_open_shapes(tmp_path):
    src = tmp_path / "open.onnx"
    _open_model(src)
    sess = mnntool.load(src)
    rng = np.random.default_rng(3)
    shapes = [(16, 16), (16, 24), (24, 16), (32, 8), (8, 40)]
    feeds = [{"x": rng.standard_normal((1, 3) + s).astype(np.float32)} for s in shapes for _ in range(2)]
    _check(sess, feeds, 16, 40)


def test_more_shapes_than_plans_under_threads(tmp_path):
    """Shapes beyond MAX_PLANS evict plans while other threads run them: answers stay right."""
    src = tmp_path / "open.onnx"
    _open_model(src)
    sess = mnntool.load(src)
    rng = np.random.default_rng(4)
    feeds = [{"x": rng.standard_normal((1, 3, 8 + 4 * k, 12)).astype(np.float32)}
             for k in range(session_mod.MAX_PLANS + 4)]
    _check(sess, feeds, 8, 24)


def test_shared_mnn_session(mobilenet):
    pytest.importorskip("MNN")
    from mnntool.runtime.mnn_backend import MnnSession
    sess = MnnSession(str(mobilenet), ["input"], ["output"], threads=1)
    rng = np.random.default_rng(5)
    feeds = [{"input": rng.standard_normal((1, 3, 224, 224)).astype(np.float32)} for _ in range(4)]
    alone = [sess.run(f) for f in feeds]
    results = _hammer(sess, feeds, 8, 4)
    for i, out in results:
        np.testing.assert_array_equal(out["output"], alone[i]["output"])
