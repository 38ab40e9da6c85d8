"""A Session owns its settings: its thread count reaches the kernels it builds and is applied when it
runs, whatever another session set (a plan too small for two threads is built and run for one); preparing leaves the graph it was given as it was. Reference for
values: numpy's matmul and maximum in float64 (tolerance 1e-4 relative to the largest output)."""
import numba
import numpy as np
import pytest

from mnntool.ir.graph import Graph, Node, TensorInfo
from mnntool.runtime.session import Session
from mnntool.runtime.settings import Settings


def _graph(shape):
    w = np.random.default_rng(0).standard_normal((8, 16 * 3 * 3)).astype(np.float32)
    conv = Node("Convolution", ["x"], ["c"], "conv",
                {"common": {"outputCount": 8, "kernelX": 3, "kernelY": 3, "padX": 1, "padY": 1, "relu": True},
                 "weight": w.reshape(-1), "bias": np.zeros(8, np.float32)})
    g = Graph(nodes=[conv], inputs=["x"], outputs=["c"])
    g.tensors["x"] = TensorInfo("x", "float32", shape)
    return g, w


def _reference(x, w):
    n, c, h, wd = x.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    cols = np.stack([xp[:, :, i:i + h, j:j + wd] for i in range(3) for j in range(3)], 2)   # n, c, 9, h, w
    y = np.einsum("ok,nkhw->nohw", w.astype(np.float64), cols.reshape(n, c * 9, h, wd))
    return np.maximum(y, 0)


def test_settings_cap_and_default():
    cap = numba.config.NUMBA_NUM_THREADS
    assert Settings.of(None).threads == cap
    assert Settings.of(10_000).threads == cap
    assert Settings.of(1).threads == 1


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs two cores")
def test_each_session_runs_with_its_own_thread_count():
    g, w = _graph((1, 16, 96, 96))     # 21 MFLOP: over session.ONE_THREAD_BELOW_FLOPS
    one, two = Session(g, threads=1), Session(g, threads=2)
    x = np.random.default_rng(1).standard_normal((1, 16, 96, 96)).astype(np.float32)
    ref = _reference(x, w)
    for sess, threads in [(two, 2), (one, 1), (two, 2)]:
        y = sess.run({"x": x})["c"]
        assert numba.get_num_threads() == threads
        assert np.abs(y - ref).max() <= 1e-4 * np.abs(ref).max()


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs two cores")
def test_a_plan_too_small_for_two_threads_runs_on_one():
    """Under ONE_THREAD_BELOW_FLOPS (here 0.3 MFLOP) a 2-thread session builds and runs the plan as
    a 1-thread one; a larger input shape of the same session gets a 2-thread plan."""
    g, w = _graph((1, 16, None, None))
    two = Session(g, threads=2)
    for side, threads in [(12, 1), (96, 2), (12, 1)]:
        x = np.random.default_rng(1).standard_normal((1, 16, side, side)).astype(np.float32)
        y = two.run({"x": x})["c"]
        assert numba.get_num_threads() == threads and two.plan.settings.threads == threads
        ref = _reference(x, w)
        assert np.abs(y - ref).max() <= 1e-4 * np.abs(ref).max()


def test_prepare_leaves_the_graph_untouched():
    g, w = _graph((None, 16, None, None))
    sess = Session(g, threads=1)
    for shape in [(1, 16, 6, 6), (2, 16, 9, 7)]:
        x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
        y = sess.run({"x": x})["c"]
        ref = _reference(x, w)
        assert np.abs(y - ref).max() <= 1e-4 * np.abs(ref).max()
        assert g.tensors["x"].shape == (None, 16, None, None)
        assert "c" not in g.tensors or g.tensors["c"].shape is None
