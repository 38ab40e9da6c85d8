"""Per-step choice between a kernel's parallel form and its one-thread form (kernels/step_timing.py).

The chooser alone: with one form 3 ms slower than the other (a sleep), it keeps the faster after its
six first calls, in turns starting with the form it is told the threshold picks, whichever is slower, and
gives each call's own result. In a session: the model of
test_parallel_steps at 2 threads with the host's threshold set low (every step near it, so every
parallel kernel and every parallel step is timed): each of eight runs (both forms during the first six,
the chosen one after) bit-identical to the one-thread run, and every chooser settled."""
import time

import numpy as np
import pytest

from mnntool import api
from mnntool.runtime import host_tuning
from mnntool.runtime.kernels import step_timing
from mnntool.runtime.kernels.ops import parallel_steps
from mnntool.runtime.session import Session

from .test_parallel_steps import INPUTS, _model


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
    for k in range(2 + 2 * step_timing.SAMPLES):
        assert t(k) == (calls[-1], k)
    turn = ["parallel", "serial"] if first == 0 else ["serial", "parallel"]     # first: the threshold's form
    assert calls == turn * (1 + step_timing.SAMPLES)
    assert t.chosen is (slow == "serial")
    calls.clear()
    for k in range(3):
        t(k)
    assert calls == ["serial" if slow == "parallel" else "parallel"] * 3


def test_timing_is_off_where_the_threshold_is_forced_or_the_defaults_run(monkeypatch):
    monkeypatch.setenv("MNNTOOL_HOST_TUNING", "measure")
    monkeypatch.delenv("MNNTOOL_PARALLEL_MIN_WORK", raising=False)
    monkeypatch.delenv("MNNTOOL_STEP_TIMING", raising=False)
    assert step_timing.timed(1000, 1000) and not step_timing.timed(100, 1000)
    assert not step_timing.timed(64_000, 1000)
    for name, value in (("MNNTOOL_STEP_TIMING", "off"), ("MNNTOOL_PARALLEL_MIN_WORK", "5"),
                        ("MNNTOOL_HOST_TUNING", "defaults")):
        with monkeypatch.context() as m:
            m.setenv(name, value)
            assert not step_timing.timed(1000, 1000)
            assert step_timing.choose("p", "s", 1000, 1000) == "p"


def test_timed_steps_give_the_one_thread_bits(tmp_path, monkeypatch):
    monkeypatch.setenv("MNNTOOL_HOST_TUNING", "measure")
    monkeypatch.delenv("MNNTOOL_PARALLEL_MIN_WORK", raising=False)
    monkeypatch.delenv("MNNTOOL_STEP_TIMING", raising=False)
    monkeypatch.setenv("MNNTOOL_ONE_THREAD_BELOW_FLOPS", "0")
    monkeypatch.setattr(host_tuning, "parallel_min_work", lambda threads: 1000)
    made = []

    class Recorded(step_timing.Timed):
        __slots__ = ("__weakref__",)

        def __init__(self, parallel, serial, first=0):
            super().__init__(parallel, serial, first)
            made.append(self)
    monkeypatch.setattr(step_timing, "Timed", Recorded)
    monkeypatch.setattr(parallel_steps, "Timed", Recorded)
    outs = _model(tmp_path / "m.onnx")
    api.convert(tmp_path / "m.onnx", tmp_path / "m.mnn")
    rng = np.random.default_rng(1)
    feeds = {k: rng.standard_normal(v).astype(np.float32) for k, v in INPUTS.items()}
    graph = api.load_graph(tmp_path / "m.mnn")
    with np.errstate(divide="ignore"):
        want = Session(graph, threads=1).run(feeds)
        s = Session(graph, threads=2)
        for _ in range(2 + 2 * step_timing.SAMPLES + 2):
            got = s.run(feeds)
            for o in outs:
                assert np.array_equal(np.asarray(got[o]).view(np.uint32), np.asarray(want[o]).view(np.uint32)), o
    assert len(made) >= 6, made       # the copies, the binary ops, LeakyReLU, the SUM, the pad: timed
    assert all(t.chosen is not None for t in made), made
