"""Thread thresholds measured on the host (runtime/host_tuning.py): the measurement finds the size at
which the parallel kernel beats its serial twin in timings it makes itself; the figures are kept in the
file beside the kernel library and read back instead of measuring again; overrides win; a session plans
with them (a kernel below the threshold runs its serial twin) and its outputs do not change (the serial
and parallel kernels compute the same values element by element: equal bit for bit)."""
import json

import numpy as np
import pytest

from mnntool.errors import MnnToolError
from mnntool.runtime import host_tuning
from mnntool.runtime import kernels  # noqa: F401  (registers the measurement)
from mnntool.runtime.settings import cores


@pytest.fixture
def measuring(monkeypatch, tmp_path):
    monkeypatch.setenv("MNNTOOL_HOST_TUNING", "measure")
    monkeypatch.setenv("MNNTOOL_AOT_DIR", str(tmp_path))
    monkeypatch.delenv("MNNTOOL_PARALLEL_MIN_WORK", raising=False)
    monkeypatch.delenv("MNNTOOL_ONE_THREAD_BELOW_FLOPS", raising=False)
    monkeypatch.setattr(host_tuning, "_busy", lambda: False)
    host_tuning.forget()
    yield tmp_path
    host_tuning.forget()


def test_measured_threshold_is_the_first_size_that_pays(measuring):
    """The threshold restated from the timings the measurement returns: the first size of two in a row
    (or the last size timed) where parallel took <= GAIN x serial, times the kernel's work an element,
    clamped to BOUNDS; twice the largest size when none paid."""
    r = host_tuning.measure(2)
    rows = r["timings"]
    assert [x["elements"] for x in rows] == list(host_tuning.SIZES[:len(rows)])
    assert all(x["serial_us"] > 0 and x["parallel_us"] > 0 for x in rows)
    paid = [x["parallel_us"] <= host_tuning.GAIN * x["serial_us"] for x in rows]
    first = next((rows[k]["elements"] for k in range(len(rows))
                  if paid[k] and (k + 1 == len(rows) or paid[k + 1])), host_tuning.SIZES[-1] * 2)
    lo, hi = host_tuning.BOUNDS
    assert r["parallel_min_work"] == min(max(first * host_tuning.WORK_PER_ELEMENT, lo), hi)


def test_kept_in_the_file_and_read_back(measuring, monkeypatch):
    # a fixed measurement under the bound (a real one on a loaded 2-core host may clamp at it, and a clamped
    # figure is rightly kept out of the file: test_clamped_figure_is_not_kept)
    monkeypatch.setattr(host_tuning, "_probe", lambda t: {"parallel_min_work": 98_304, "source": "measured"})
    first = host_tuning.parallel_min_work(2)
    assert first == 98_304
    data = json.loads((measuring / "host_tuning.json").read_text())
    (entry,) = data.values()
    assert entry["2"]["parallel_min_work"] == first and entry["2"]["source"] == "measured"
    # a value in the file is used as it is, without measuring again
    entry["2"]["parallel_min_work"] = 123_456
    (measuring / "host_tuning.json").write_text(json.dumps(data))
    host_tuning.forget()
    monkeypatch.setattr(host_tuning, "measure", lambda t: pytest.fail("measured again"))
    assert host_tuning.parallel_min_work(2) == 123_456
    assert host_tuning.one_thread_below_flops(2) == int(123_456 * host_tuning.FLOPS_PER_WORK)
    assert host_tuning.report(2)["source"] == "measured"


def test_busy_host_is_not_measured(measuring, monkeypatch):
    """While the load average is above the core count nothing is measured (the timings would be the
    neighbours') or kept: the defaults serve."""
    monkeypatch.setattr(host_tuning, "_busy", lambda: True)
    monkeypatch.setattr(host_tuning, "measure", lambda t: pytest.fail("measured on a busy host"))
    assert host_tuning.parallel_min_work(2) == host_tuning.PARALLEL_MIN_WORK
    assert "busy" in host_tuning.report(2)["source"]
    assert not (measuring / "host_tuning.json").exists()


def test_overrides_and_defaults(monkeypatch, measuring):
    monkeypatch.setattr(host_tuning, "measure", lambda t: pytest.fail("measured"))
    monkeypatch.setenv("MNNTOOL_PARALLEL_MIN_WORK", "1000")
    monkeypatch.setenv("MNNTOOL_ONE_THREAD_BELOW_FLOPS", "5")
    assert host_tuning.parallel_min_work(4) == 1000 and host_tuning.one_thread_below_flops(4) == 5
    assert host_tuning.report(4)["source"] == "override"
    monkeypatch.setenv("MNNTOOL_PARALLEL_MIN_WORK", "lots")
    with pytest.raises(MnnToolError, match="MNNTOOL_PARALLEL_MIN_WORK"):
        host_tuning.parallel_min_work(4)
    monkeypatch.delenv("MNNTOOL_PARALLEL_MIN_WORK")
    monkeypatch.delenv("MNNTOOL_ONE_THREAD_BELOW_FLOPS")
    monkeypatch.setenv("MNNTOOL_HOST_TUNING", "defaults")
    host_tuning.forget()
    assert host_tuning.parallel_min_work(4) == host_tuning.PARALLEL_MIN_WORK
    assert host_tuning.report(4)["source"] == "defaults"


@pytest.mark.skipif(cores() < 2, reason="needs two threads")
def test_session_plans_by_the_threshold(monkeypatch, measuring, fixture_model):
    """kernels.sized picks by the host's threshold (the parallel kernel at or above it, the serial twin
    below); a session at 2 threads asks for it while planning, and its outputs are the same whichever
    side its kernels fall (the twins compute element by element as the parallel kernels do)."""
    import mnntool.runtime.kernels as kernels
    from mnntool import api
    from mnntool.runtime.kernels.compile.jit import Bound
    from mnntool.runtime.kernels.ops.elementwise import sigmoid_blocks
    from mnntool.runtime.session import Session
    monkeypatch.setenv("MNNTOOL_PARALLEL_MIN_WORK", "1000")
    assert not isinstance(kernels.sized(sigmoid_blocks, 1000, 2), Bound)
    assert isinstance(kernels.sized(sigmoid_blocks, 999, 2), Bound)
    src = fixture_model("mobilenetv2")
    api.convert(src, measuring / "m.mnn")
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    asked = []
    real = host_tuning.parallel_min_work
    monkeypatch.setattr(host_tuning, "parallel_min_work", lambda t: asked.append(t) or real(t))
    outs = []
    for limit in ("1", str(10 ** 12)):
        monkeypatch.setenv("MNNTOOL_PARALLEL_MIN_WORK", limit)
        monkeypatch.setenv("MNNTOOL_ONE_THREAD_BELOW_FLOPS", "0")
        s = Session(api.load_graph(measuring / "m.mnn"), threads=2)
        outs.append(next(iter(s.run({s.input_names[0]: x}).values())))
    assert set(asked) == {2}
    np.testing.assert_array_equal(outs[0], outs[1])


def test_clamped_figure_is_not_kept(measuring, monkeypatch):
    """A measurement clamped at the upper bound (parallel never paid: a loaded host) serves this process only."""
    monkeypatch.setattr(host_tuning, "_probe",
                        lambda t: {"parallel_min_work": host_tuning.BOUNDS[1], "source": "measured"})
    assert host_tuning.parallel_min_work(2) == host_tuning.BOUNDS[1]
    assert not (measuring / "host_tuning.json").exists()
