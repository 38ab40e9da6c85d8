"""Per-step choice between a kernel's parallel form and its one-thread form (kernels/step_timing.py).

The chooser alone: with one form 3 ms slower than the other (a sleep), it keeps the faster after its
five first calls, in turns starting with the form it is told the threshold picks, whichever is slower, and
gives each call's own result. In a session: the model of test_parallel_steps and an Erf (a fastmath kernel,
timed against its parallel build on one thread) at 2 threads with the host's threshold set low (2,000:
most steps near it, so their parallel kernels and parallel steps are timed): each of eight runs (both forms
during the first five, the chosen one after) bit-identical to the one-thread run, every chooser settled."""
import time

import numpy as np
import pytest

from mnntool import api
from mnntool.runtime import host_tuning
from mnntool.runtime.kernels import step_timing
from mnntool.runtime.kernels.ops import parallel_steps
from mnntool.runtime.session import Session

from . import test_parallel_steps
from .test_parallel_steps import INPUTS

FAST = (1, 8, 30, 30)


def _model(path, extra=False):
    """test_parallel_steps' model and, with `extra`, an Erf (erf_flat: a fastmath kernel)."""
    outs = test_parallel_steps._model(path)
    if not extra:
        return outs
    import onnx
    from onnx import TensorProto as TP
    from onnx import helper as h
    m = onnx.load(str(path))
    m.graph.input.append(h.make_tensor_value_info("f", TP.FLOAT, list(FAST)))
    m.graph.node.append(h.make_node("Erf", ["f"], ["er"]))
    m.graph.output.append(h.make_tensor_value_info("er", TP.FLOAT, None))
    onnx.save(m, str(path))
    return outs + ["er"]


@pytest.mark.parametrize("first", [0, 1])
@pytest.mark.parametrize("slow", ["parallel", "serial"])
def test_the_faster_form_is_kept(slow, first):
    calls = []

    def form(name):
        def run(x):
            calls.append(name)
            if name == slow:
                time.sleep(0.003)
            return (name, x)
        return run

    t = step_timing.Timed(form("parallel"), form("serial"), first)
    for k in range(1 + 2 * step_timing.SAMPLES):
        assert t(k) == (calls[-1], k)
    turn = ["parallel", "serial"] if first == 0 else ["serial", "parallel"]     # first: the threshold's form
    assert calls == (turn * (1 + step_timing.SAMPLES))[:1 + 2 * step_timing.SAMPLES]
    assert t.chosen is (slow == "serial")
    calls.clear()
    for k in range(3):
        t(k)
    assert calls == ["serial" if slow == "parallel" else "parallel"] * 3


def test_timing_is_off_where_the_threshold_is_forced_or_the_defaults_run(monkeypatch):
    monkeypatch.setenv("MNNTOOL_HOST_TUNING", "measure")
    monkeypatch.delenv("MNNTOOL_PARALLEL_MIN_WORK", raising=False)
    monkeypatch.delenv("MNNTOOL_STEP_TIMING", raising=False)
    assert step_timing.timed(100_000, 100_000) and not step_timing.timed(10_000, 100_000)
    assert not step_timing.timed(6_400_000, 100_000) and not step_timing.timed(1000, 1000)   # 16,384 at least
    for name, value in (("MNNTOOL_STEP_TIMING", "off"), ("MNNTOOL_PARALLEL_MIN_WORK", "5"),
                        ("MNNTOOL_HOST_TUNING", "defaults")):
        with monkeypatch.context() as m:
            m.setenv(name, value)
            assert not step_timing.timed(100_000, 100_000)
            assert step_timing.choose("p", "s", 100_000, 100_000) == "p"


def test_timed_steps_give_the_one_thread_bits(tmp_path, monkeypatch):
    monkeypatch.setenv("MNNTOOL_HOST_TUNING", "measure")
    monkeypatch.delenv("MNNTOOL_PARALLEL_MIN_WORK", raising=False)
    monkeypatch.delenv("MNNTOOL_STEP_TIMING", raising=False)
    monkeypatch.setenv("MNNTOOL_ONE_THREAD_BELOW_FLOPS", "0")
    monkeypatch.setattr(host_tuning, "parallel_min_work", lambda threads: 2000)
    monkeypatch.setattr(step_timing, "MIN_WORK", 0)
    made = []

    class Recorded(step_timing.Timed):
        __slots__ = ("__weakref__",)

        def __init__(self, parallel, serial, first=0):
            super().__init__(parallel, serial, first)
            made.append(self)
    monkeypatch.setattr(step_timing, "Timed", Recorded)
    monkeypatch.setattr(parallel_steps, "Timed", Recorded)
    outs = _model(tmp_path / "m.onnx", extra=True)
    api.convert(tmp_path / "m.onnx", tmp_path / "m.mnn")
    rng = np.random.default_rng(1)
    feeds = {k: rng.standard_normal(v).astype(np.float32) for k, v in {**INPUTS, "f": FAST}.items()}
    graph = api.load_graph(tmp_path / "m.mnn")
    with np.errstate(divide="ignore"):
        want = Session(graph, threads=1).run(feeds)
        s = Session(graph, threads=2)
        for _ in range(1 + 2 * step_timing.SAMPLES + 3):
            got = s.run(feeds)
            for o in outs:
                assert np.array_equal(np.asarray(got[o]).view(np.uint32), np.asarray(want[o]).view(np.uint32)), o
    assert len(made) >= 6, made       # the copies, the binary ops, LeakyReLU, the SUM, the pad: timed
    assert all(t.chosen is not None for t in made), made
    # the fastmath kernel (Erf) against its parallel build on one thread
    assert any(isinstance(t.serial, step_timing.OneThread) for t in made), [repr(t)[:90] for t in made]


def test_fastmath_kernels_time_their_parallel_build_on_one_thread():
    """A fastmath kernel's two builds may round differently (GELU's erf_flat differed by 1 ulp on FastViT):
    its one-thread form is its parallel build on one thread, unless its arithmetic is all IR (conv_im2col);
    IEEE kernels (gemm, the lanes depthwise) compare against their serial twins."""
    from mnntool.runtime.kernels.micro import depthwise_lanes, float_gemm
    from mnntool.runtime.kernels.ops import elementwise
    assert not step_timing.exact_twin(elementwise.erf_flat)
    assert all(step_timing.exact_twin(f) for f in (float_gemm.gemm, float_gemm.conv_im2col,
                                                    depthwise_lanes.depthwise_lanes))


def test_only_calls_of_the_first_shapes_are_compared():
    """A kernel called on pieces of two sizes a step (three calls: two large, one small): the small piece,
    fast in either form, does not count; the parallel form, 3 ms slower on the large pieces, loses. Shapes
    that never repeat: after MAX_CALLS calls the threshold's form (here the parallel one) stays."""
    large, small = np.zeros(64), np.zeros(2)

    def form(slow):
        def run(x):
            if slow and x.size > 2:
                time.sleep(0.003)
            return slow
        return run

    t = step_timing.Timed(form(True), form(False))
    calls = 0
    while t.chosen is None:
        t(large if calls % 3 < 2 else small)
        calls += 1
        assert calls < 30
    assert t.chosen is False
    t = step_timing.Timed(form(True), form(False))
    for k in range(step_timing.MAX_CALLS):
        t(np.zeros(3 + k))
    assert t.chosen is True and t(large) is True


def test_a_permute_times_the_ops_own_one_thread_run(monkeypatch):
    """parallel_steps.permute near the threshold: a Timed of the parallel copy and the run the op passes as its
    one-thread code (tensor.py's permute_runs), both giving NumPy's transpose."""
    monkeypatch.setenv("MNNTOOL_HOST_TUNING", "measure")
    monkeypatch.delenv("MNNTOOL_PARALLEL_MIN_WORK", raising=False)
    monkeypatch.delenv("MNNTOOL_STEP_TIMING", raising=False)
    monkeypatch.setattr(host_tuning, "parallel_min_work", lambda threads: 40_000)
    shape, perm = (2, 64, 9, 40), (0, 2, 1, 3)
    ran = []

    def own(i, o):
        ran.append(1)
        np.copyto(o[0], i[0].transpose(perm))
    run = parallel_steps.permute(shape, perm, np.float32, 2, serial=own)
    assert isinstance(run, step_timing.Timed) and run.serial is own
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    for _ in range(1 + 2 * step_timing.SAMPLES):
        y = np.empty([shape[a] for a in perm], np.float32)
        run([x], [y])
        assert np.array_equal(y, x.transpose(perm))
    assert len(ran) == step_timing.SAMPLES and run.chosen is not None
