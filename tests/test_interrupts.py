"""SIGINT and SIGTERM during long commands: the real CLI in a child process, signalled once work has started
(it says so on stderr at a named test point, mnntool.interrupts.test_point), must exit 130 / 143 with the one
line "interrupted", leave no output and no temporary file, and leave no child process alive (the /proc scan
of its descendants taken while it ran, each checked gone after). A second run afterwards works."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from mnntool.interrupts import children

ROOT = Path(__file__).resolve().parents[1]
MNNTOOL = [sys.executable, "-m", "mnntool"]
CODE = {signal.SIGINT: 130, signal.SIGTERM: 143}


def _model(path: Path, channels: int = 16, size: int = 32) -> Path:
    """A few convolutions: quick to convert, slow enough to calibrate and compare in several steps."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for k, (cin, cout) in enumerate([(3, channels), (channels, channels), (channels, channels)]):
        w = numpy_helper.from_array((rng.standard_normal((cout, cin, 3, 3)) * 0.2).astype(np.float32), f"w{k}")
        inits.append(w)
        nodes.append(helper.make_node("Conv", [x, f"w{k}"], [f"c{k}"], pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [f"c{k}"], [f"r{k}"]))
        x = f"r{k}"
    g = helper.make_graph(nodes, "convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, channels, size, size])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """model.onnx, model.mnn and a calibration folder of 24 samples."""
    from mnntool import api
    d = tmp_path_factory.mktemp("interrupts")
    _model(d / "model.onnx")
    api.convert(str(d / "model.onnx"), str(d / "model.mnn"))
    calib = d / "calib"
    calib.mkdir()
    rng = np.random.default_rng(1)
    for k in range(24):
        np.save(calib / f"{k:03d}.npy", rng.standard_normal((1, 3, 32, 32)).astype(np.float32))
    return d


def _descendants(pid: int) -> set[int]:
    """Every live process below `pid` (children of children too), from /proc."""
    parent_of = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_bytes()
            except OSError:
                continue
            fields = stat[stat.rfind(b")") + 2:].split()
            if fields[0] != b"Z":
                parent_of[int(entry)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, pp in parent_of.items() if pp in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:].split()[0] != b"Z"


def _interrupt(args: list, point: str, sig: int, cwd: Path, want_children: bool = False, extra_env=None):
    """Start `mnntool ARGS` with the test point set, wait for its line on stderr, take its descendants,
    signal it; returns (exit code, stderr after the point, descendants, seconds from signal to exit)."""
    env = {**os.environ, "MNNTOOL_TEST_POINT": point, **(extra_env or {})}
    p = subprocess.Popen(MNNTOOL + args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        seen = []
        for line in p.stderr:           # blocks until the command reaches its test point (or exits)
            seen.append(line)
            if line.startswith("test point:"):
                break
        else:
            pytest.fail(f"the command ended before its test point (exit {p.wait()}): {''.join(seen)[-2000:]}")
        kids = _descendants(p.pid)
        if want_children:
            assert kids, "no worker processes were running when signalled"
        t0 = time.monotonic()
        os.kill(p.pid, sig)
        rest = p.stderr.read()
        rc = p.wait(timeout=60)
        took = time.monotonic() - t0
        p.stdout.read()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    deadline = time.monotonic() + 10    # an orphan killed but not yet reaped, or Python's resource tracker
    while any(_alive(k) for k in kids) and time.monotonic() < deadline:     # seeing its parent gone
        time.sleep(0.05)
    return rc, rest, {k for k in kids if _alive(k)}, took


def _check(rc, rest, left, sig, folder: Path, *gone: str):
    assert rc == CODE[sig], rest
    assert rest.strip().splitlines() == ["interrupted"], rest
    assert not left, f"processes left alive: {left}"
    names = sorted(p.name for p in folder.iterdir())
    for name in gone:
        assert not any(n == name or n.startswith(f".{name}.") for n in names), names


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_convert_mid_write(work, tmp_path, sig):
    """Stopped with its temporary output on disk: the temporary file goes, no output; a second run works."""
    out = tmp_path / "out.mnn"
    rc, rest, left, _ = _interrupt(["convert", str(work / "model.onnx"), str(out)], "write:stall", sig, tmp_path)
    _check(rc, rest, left, sig, tmp_path, "out.mnn")
    again = subprocess.run(MNNTOOL + ["convert", str(work / "model.onnx"), str(out)], capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert out.stat().st_size > 0 and sorted(p.name for p in tmp_path.iterdir()) == ["out.mnn"]


def test_quant_workers_sigterm(work, tmp_path):
    """quant --int8 --workers 2 stopped while calibrating: the spawned workers are killed, no file."""
    args = ["quant", str(work / "model.mnn"), str(tmp_path / "q.mnn"), "--int8", "--calib", str(work / "calib"),
            "--workers", "2"]
    rc, rest, left, _ = _interrupt(args, "progress:stall", signal.SIGTERM, tmp_path, want_children=True)
    _check(rc, rest, left, signal.SIGTERM, tmp_path, "q.mnn")


def test_verify_workers_sigint_real_work(work, tmp_path):
    """verify --workers 2 signalled while the workers compare samples (no stall: the parent waits on
    them): it stops in seconds, not after the remaining samples; no HTML report, no JUnit file."""
    args = ["verify", str(work / "model.onnx"), str(work / "model.mnn"), "--calib", str(work / "calib"), "-n", "24",
            "--workers", "2", "--report", str(tmp_path / "r.html"), "--junit", str(tmp_path / "r.xml")]
    rc, rest, left, took = _interrupt(args, "progress", signal.SIGINT, tmp_path)
    _check(rc, rest, left, signal.SIGINT, tmp_path, "r.html", "r.xml")
    assert took < 10


def test_bench_sigterm_real_work(work, tmp_path):
    """bench signalled in its timing loop (a million runs queued): stops in seconds."""
    args = ["bench", str(work / "model.mnn"), "--runs", "1000000", "--warmup", "0"]
    rc, rest, left, took = _interrupt(args, "progress", signal.SIGTERM, tmp_path)
    _check(rc, rest, left, signal.SIGTERM, tmp_path)
    assert took < 10


def test_llm_export_sigterm(tmp_path):
    """llm export stopped between layers: its temporary bundle folder goes, no bundle."""
    pytest.importorskip("torch")
    from fixtures.llm_checkpoints import build_random
    from tests.conftest import CACHE
    ckpt = build_random("llama", CACHE / "llama")
    rc, rest, left, _ = _interrupt(["llm", "export", str(ckpt), str(tmp_path / "bundle")], "progress:stall",
                                   signal.SIGTERM, tmp_path)
    _check(rc, rest, left, signal.SIGTERM, tmp_path, "bundle")
    assert list(tmp_path.iterdir()) == []


def test_json_reports_the_interrupt(work, tmp_path):
    """With --json, stdout still carries one JSON object saying why (as for errors)."""
    import json
    env = {**os.environ, "MNNTOOL_TEST_POINT": "write:stall"}
    p = subprocess.Popen(MNNTOOL + ["convert", str(work / "model.onnx"), str(tmp_path / "o.mnn"), "--json"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stderr.readline().startswith("test point: write")
    p.send_signal(signal.SIGINT)
    out, errs = p.communicate(timeout=60)
    assert p.returncode == 130 and errs.strip() == "interrupted"
    assert json.loads(out) == {"error": "interrupted", "signal": "SIGINT", "exit_code": 130}


def test_children_scan_sees_a_child():
    """The /proc scan kill_children relies on finds a child of this process (and not after it ends)."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert p.pid in children()
    finally:
        p.kill()
        p.wait()
    assert p.pid not in children()


_MNN_CHILD = r'''
import os, signal, sys, threading, time
from mnntool import interrupts, mnn_tools
interrupts.install()
seen = []
def signal_when_started():
    while not interrupts.children():
        time.sleep(0.005)
    seen.extend(interrupts.children())
    os.kill(os.getpid(), signal.SIGTERM)
threading.Thread(target=signal_when_started, daemon=True).start()
try:
    mnn_tools.mnnconvert("-f", "ONNX", "--modelFile", sys.argv[1], "--MNNModel", sys.argv[2], "--bizCode", "t")
    print("finished")
except interrupts.Interrupted as e:
    print("interrupted", e.exit_code, *seen)
'''


def test_mnn_tool_child_killed(work, tmp_path):
    """MNN's converter runs in a child process (mnn_tools): an interrupt in the parent kills it (and
    writes nothing)."""
    pytest.importorskip("MNN")
    p = subprocess.run([sys.executable, "-c", _MNN_CHILD, str(work / "model.onnx"), str(tmp_path / "m.mnn")],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    words = p.stdout.split()
    assert words[:2] == ["interrupted", "143"], p.stdout + p.stderr
    pids = [int(w) for w in words[2:]]
    assert pids and not any(_alive(k) for k in pids)
    assert not (tmp_path / "m.mnn").exists()


def test_deferred_holds_a_signal_until_the_commit_ends():
    """interrupts.deferred (around a pair of renames): a signal inside the block is delivered as it ends."""
    from mnntool.interrupts import deferred
    seen, order = [], []
    old = signal.signal(signal.SIGTERM, lambda s, f: seen.append(s))
    try:
        with deferred():
            os.kill(os.getpid(), signal.SIGTERM)      # Python runs a handler at the next bytecode: here
            order.append(list(seen))
        assert order == [[]] and seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, old)
