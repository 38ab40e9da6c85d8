"""Memory of a long-running process (issue 49, item 2): RSS over many distinct input shapes of an open-shape
model, and over many runs of one shape of a fixture, sampled as it goes; reports the slope.

    python benchmarks/soak.py [--shapes 5000] [--runs 100000] [--model mobilenetv2|open] [--threads 1]

Shapes: a two-convolution model with open H/W (as the issue's), run once at each of N distinct (H, W)
from 16 to ~400 pixels; RSS after 50 shapes is the baseline ("within 50 MB of it after 5,000" is the
target). Runs: the fixture (or the open model at one shape) run N times; the slope is fitted over the
second half (after warm-up), in KB per 1,000 runs (target: under 1). Prints one JSON line per phase.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mnntool.threadpool import tune_process  # noqa: E402

tune_process()

import numpy as np  # noqa: E402


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def slope(xs, ys) -> float:
    xs, ys = np.asarray(xs, float), np.asarray(ys, float)
    return float(np.polyfit(xs, ys, 1)[0]) if len(xs) > 1 else 0.0


def open_model(path: Path) -> Path:
    import onnx
    from onnx import TensorProto as TP, helper as h
    rng = np.random.RandomState(0)
    inits = [onnx.numpy_helper.from_array((rng.randn(16, 3, 3, 3) * 0.3).astype(np.float32), "w1"),
             onnx.numpy_helper.from_array((rng.randn(16, 16, 3, 3) * 0.1).astype(np.float32), "w2")]
    nodes = [h.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["c1"], ["r1"]),
             h.make_node("Conv", ["r1", "w2"], ["y"], pads=[1, 1, 1, 1])]
    g = h.make_graph(nodes, "open", [h.make_tensor_value_info("x", TP.FLOAT, [1, 3, "H", "W"])],
                     [h.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


def distinct_shapes(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    seen, out = set(), []
    while len(out) < n:
        hw = (int(rng.integers(16, 400)), int(rng.integers(16, 400)))
        if hw not in seen:
            seen.add(hw)
            out.append(hw)
    return out


def soak_shapes(sess, n: int, every: int) -> dict:
    rng = np.random.default_rng(1)
    samples, t0, firsts = [], time.perf_counter(), []
    base = None
    for k, (hh, ww) in enumerate(distinct_shapes(n), 1):
        x = rng.standard_normal((1, 3, hh, ww)).astype(np.float32)
        t = time.perf_counter()
        sess.run({"x": x})
        firsts.append(time.perf_counter() - t)
        if k == 50:
            gc.collect()
            base = rss_mb()
        if k % every == 0 or k == n:
            gc.collect()
            samples.append((k, rss_mb()))
    ks, rs = zip(*samples)
    half = len(ks) // 2
    return {"phase": "shapes", "shapes": n, "rss_after_50_mb": round(base or rs[0], 1),
            "rss_end_mb": round(rs[-1], 1), "growth_mb": round(rs[-1] - (base or rs[0]), 1),
            "slope_kb_per_1000_shapes": round(slope(ks[half:], rs[half:]) * 1024 * 1000, 1),
            "first_run_ms_median": round(1000 * float(np.median(firsts)), 2),
            "seconds": round(time.perf_counter() - t0, 1), "samples": [(k, round(r, 1)) for k, r in samples]}


def soak_runs(sess, feeds: dict, n: int, every: int) -> dict:
    samples, t0 = [], time.perf_counter()
    for k in range(1, n + 1):
        sess.run(feeds)
        if k % every == 0 or k == n:
            samples.append((k, rss_mb()))
    ks, rs = zip(*samples)
    half = len(ks) // 2
    return {"phase": "runs", "runs": n, "rss_start_mb": round(rs[0], 1), "rss_end_mb": round(rs[-1], 1),
            "slope_kb_per_1000_runs": round(slope(ks[half:], rs[half:]) * 1024 * 1000, 2),
            "seconds": round(time.perf_counter() - t0, 1), "ms_per_run": round(1000 * (time.perf_counter() - t0) / n, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", type=int, default=5000)
    ap.add_argument("--runs", type=int, default=100_000)
    ap.add_argument("--model", default="open", help="the model of the runs phase: open, or a fixture name")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--every", type=int, default=0, help="sample RSS every N shapes/runs (default: ~40 samples)")
    a = ap.parse_args()
    import mnntool
    from mnntool import api
    tmp = Path(tempfile.mkdtemp())
    src = open_model(tmp / "open.onnx")
    api.convert(src, tmp / "open.mnn")
    if a.shapes:
        sess = mnntool.load(tmp / "open.mnn", threads=a.threads)
        print(json.dumps(soak_shapes(sess, a.shapes, a.every or max(1, a.shapes // 40))), flush=True)
    if a.runs:
        if a.model == "open":
            sess = mnntool.load(tmp / "open.mnn", threads=a.threads)
            feeds = {"x": np.random.default_rng(2).standard_normal((1, 3, 64, 64)).astype(np.float32)}
        else:
            from fixtures.models import build
            path = build(a.model, ROOT / "build" / "fixtures")
            api.convert(path, tmp / "fixture.mnn")
            sess = mnntool.load(tmp / "fixture.mnn", threads=a.threads)
            g = sess.graph
            rng = np.random.default_rng(2)
            feeds = {n: rng.standard_normal(g.tensors[n].shape).astype(np.float32) for n in g.inputs}
        print(json.dumps(soak_runs(sess, feeds, a.runs, a.every or max(1, a.runs // 40))), flush=True)


if __name__ == "__main__":
    main()
