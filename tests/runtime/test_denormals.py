"""Denormals flushed while a session runs (runtime/kernels/denormals.py): the calling thread's MXCSR bits set
for the run and given back after it, Numba's workers set, MNNTOOL_DENORMALS=keep leaving IEEE behaviour (as
onnxruntime's default, checked against it), a mistyped value one clear error."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

from mnntool import api
from mnntool.errors import MnnToolError
from mnntool.runtime.kernels import denormals
from mnntool.runtime.session import Session
from tests.conftest import one_node_files

TINY = np.float32(1e-20)      # TINY * TINY = 1e-40: a denormal float32


@pytest.fixture
def squares(tmp_path):
    """x * x as a one-node model, and onnxruntime's answer on a vector of TINYs (denormals kept)."""
    src, mnn = one_node_files(tmp_path, helper.make_node("Mul", ["x", "x"], ["y"]), (1, 64))
    x = np.full((1, 64), TINY, np.float32)
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert ref[0, 0] != 0 and abs(ref[0, 0]) < np.finfo(np.float32).tiny      # onnxruntime keeps the denormal
    return mnn, x, ref


def _bits() -> int:
    return denormals.mxcsr_update(0, 0) & denormals.FLUSH


@pytest.mark.parametrize("threads", [1, 2])
def test_a_run_flushes_and_gives_the_bits_back(monkeypatch, squares, threads):
    monkeypatch.setattr(denormals, "_ON", [True])
    mnn, x, ref = squares
    before = _bits()
    y = Session(api.load_graph(mnn), threads=threads).run({"x": x})["y"]
    assert np.all(y == 0)       # 1e-40 flushed; within 1.2e-38 of onnxruntime's answer
    assert np.abs(y - ref).max() < np.finfo(np.float32).tiny
    assert _bits() == before


def test_keep_leaves_ieee_denormals(monkeypatch, squares):
    monkeypatch.setattr(denormals, "_ON", [False])
    mnn, x, ref = squares
    before = _bits()
    y = Session(api.load_graph(mnn), threads=1).run({"x": x})["y"]
    assert np.array_equal(y, ref)
    assert denormals.enter(2) is None and _bits() == before


def test_workers_are_flushed(monkeypatch):
    """After a run's `enter` at 2 threads every thread of a 2-thread parallel loop reads FLUSH set in its MXCSR;
    after `leave` the calling thread has its own bits back and the worker keeps FLUSH."""
    numba = pytest.importorskip("numba")
    monkeypatch.setattr(denormals, "_ON", [True])
    monkeypatch.setattr(denormals, "_workers_done", [0])
    numba.set_num_threads(2)
    update = denormals.mxcsr_update.dispatcher()

    @numba.njit(parallel=True)
    def read(n):
        bits, ids = np.zeros(n, np.int64), np.zeros(n, np.int64)
        for i in numba.prange(n):
            bits[i], ids[i] = update(0, 0), numba.get_thread_id()
        return bits, ids

    before = _bits()
    old = denormals.enter(2)
    try:
        bits, ids = read(64)
        assert set(ids.tolist()) == {0, 1} and np.all(bits & denormals.FLUSH == denormals.FLUSH)
    finally:
        denormals.leave(old)
    bits, ids = read(64)
    assert np.all(bits[ids == 1] & denormals.FLUSH == denormals.FLUSH)
    assert np.all(bits[ids == 0] & denormals.FLUSH == before)


def test_a_mistyped_setting_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("MNNTOOL_DENORMALS", "flsh")
    with pytest.raises(MnnToolError, match="MNNTOOL_DENORMALS='flsh'"):
        denormals.enabled()
    monkeypatch.setenv("MNNTOOL_DENORMALS", "keep")
    assert denormals.enabled() is False and denormals.report() in ("flushed", "kept")
