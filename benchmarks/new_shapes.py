"""New input shapes (issue 46, item 4): the first run at a shape never seen against the steady-state
run at that shape, paired with onnxruntime, and RSS after 20 and after 2,000 distinct shapes.

    python benchmarks/new_shapes.py [--shapes 40] [--repeats 5] [--rss-shapes 2000] [--threads 1] [--json]
                                    [--warm-shapes 0]
                                    [--onnx MODEL.onnx --low 128 --high 256 --multiple 32]

The model is the issue's: two 3x3 convolutions (3 -> 16 -> 16 channels, a ReLU between) with open
H/W, run at N distinct (H, W) between 200 and 400 pixels. For each shape, mnntool and onnxruntime
take turns: each runs the new shape once (its first run: planning, buffers, anything compiled), then
`--repeats` more times each, alternating (the steady state: their median). The ratio first/steady is
taken per shape; the report gives its median and maximum (target: first <= 1.5x steady). A slow spell
of this shared VM hits both runtimes alike, so compare ratios, not one runtime's milliseconds; the
same ratio in the calling thread's CPU time, and the minor page faults of first and steady runs (fresh
memory a first run touches), hold still where other tenants load the machine. `--warm-shapes N` runs N other
shapes of the range first, once each: a fresh process's first shapes also pay what it pays once (kernels
loaded for sizes a strategy first picks there, without the ahead-of-time library ~50 ms each; buffers grown
to the range's largest), which the default (0) counts in.

The RSS phase runs in a child process of its own (nothing of the timing phase in its memory): mnntool
alone, one run at each of `--rss-shapes` distinct shapes from the same range, RSS read after 20 and at
the end (target: within 50 MB). `--json` prints one JSON object. `--onnx` runs an image model of
your own instead (one input (N, C, H, W) with H and W open; run at batch 1), between --low and --high,
multiples of --multiple (a text detector's 32).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mnntool.threadpool import tune_process  # noqa: E402

tune_process()      # as the CLI does: the timed runs are in this process

import numpy as np  # noqa: E402

from benchmarks.soak import open_model, rss_mb  # noqa: E402

LOW, HIGH = 200, 400        # pixels: the range of heights and widths


def distinct_shapes(n: int, seed: int, low: int = LOW, high: int = HIGH, multiple: int = 1) -> list[tuple[int, int]]:
    """n distinct (H, W) between low and high, each a multiple of `multiple` (a detector's stride)."""
    rng = np.random.default_rng(seed)
    seen, out = set(), []
    lo, hi = -(-low // multiple), high // multiple
    while len(out) < n:
        hw = (int(rng.integers(lo, hi + 1)) * multiple, int(rng.integers(lo, hi + 1)) * multiple)
        if hw not in seen:
            seen.add(hw)
            out.append(hw)
    return out


def models(tmp: Path, onnx_path: str | None = None) -> tuple[Path, Path]:
    """(the ONNX model, its .mnn): the issue's two-convolution model unless `onnx_path` is given."""
    from mnntool import api
    src = Path(onnx_path) if onnx_path else open_model(tmp / "open.onnx")
    api.convert(src, tmp / "open.mnn")
    return src, tmp / "open.mnn"


def image_input(sess) -> tuple[str, int]:
    """The model's (one) image input: its name and channel count (3 where the file leaves it open)."""
    name = sess.input_names[0]
    c = sess.graph.tensors[name].shape[1]
    return name, c if isinstance(c, int) and c > 0 else 3


def timed(fn) -> tuple[float, float, int]:
    """(wall ms, this thread's CPU ms, minor page faults) of one call: on a VM shared with other tenants
    the CPU time and the faults hold still where the wall time does not."""
    f0, c0, t0 = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt, time.thread_time(), time.perf_counter()
    fn()
    t, c = (time.perf_counter() - t0) * 1e3, (time.thread_time() - c0) * 1e3
    return t, c, resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - f0


def first_and_steady(n: int, repeats: int, threads: int, progress=None, onnx_path=None, low=LOW, high=HIGH,
                     multiple=1, warm_shapes: int = 0) -> dict:
    """Per shape: each runtime's first run and the median of its next `repeats`, taking turns. `warm_shapes`
    distinct shapes of the same range (none of the timed ones) run first, once each: what a process pays once
    (kernels loaded for the sizes a strategy picks, buffers grown to the range's largest) apart from what
    each new shape costs."""
    import onnxruntime as ort
    import mnntool
    tmp = Path(tempfile.mkdtemp())
    src, mnn = models(tmp, onnx_path)
    own = mnntool.load(mnn, threads=threads)
    input_name, channels = image_input(own)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    ref = ort.InferenceSession(str(src), opts, providers=["CPUExecutionProvider"])
    runs = {"mnntool": lambda x: own.run({input_name: x}), "onnxruntime": lambda x: ref.run(None, {input_name: x})}
    rng = np.random.default_rng(1)
    warm = rng.standard_normal((1, channels, 64, 64)).astype(np.float32)    # load-time work is not a new shape's
    for run in runs.values():
        for _ in range(3):
            run(warm)
    timed_shapes = distinct_shapes(n + warm_shapes, 0, low, high, multiple)
    for h, w in timed_shapes[n:]:
        x = rng.standard_normal((1, channels, h, w)).astype(np.float32)
        for run in runs.values():
            run(x)
    rows = []
    for k, (h, w) in enumerate(timed_shapes[:n]):
        x = rng.standard_normal((1, channels, h, w)).astype(np.float32)
        order = list(runs) if k % 2 == 0 else list(runs)[::-1]
        row = {"shape": [h, w]}
        for name in order:
            row[f"{name}_first_ms"], row[f"{name}_first_cpu_ms"], row[f"{name}_first_faults"] = \
                timed(lambda: runs[name](x))
        steady = {name: [] for name in runs}
        for _ in range(repeats):
            for name in order:
                steady[name].append(timed(lambda: runs[name](x)))
        for name in runs:
            wall, cpu, faults = zip(*steady[name])
            row[f"{name}_steady_ms"] = statistics.median(wall)
            row[f"{name}_steady_cpu_ms"] = statistics.median(cpu)
            row[f"{name}_steady_faults"] = statistics.median(faults)
            row[f"{name}_ratio"] = row[f"{name}_first_ms"] / row[f"{name}_steady_ms"]
            row[f"{name}_cpu_ratio"] = row[f"{name}_first_cpu_ms"] / row[f"{name}_steady_cpu_ms"]
        rows.append(row)
        if progress:
            progress(k + 1)
    out = {"model": str(onnx_path or "two 3x3 convolutions, open H/W"), "range": [low, high], "multiple": multiple,
           "shapes": n,
           "repeats": repeats, "threads": threads, "warm_shapes": warm_shapes, "rows": rows}
    for name in runs:
        ratios = [r[f"{name}_ratio"] for r in rows]
        out[name] = {"first_ms_median": statistics.median(r[f"{name}_first_ms"] for r in rows),
                     "first_ms_max": max(r[f"{name}_first_ms"] for r in rows),
                     "steady_ms_median": statistics.median(r[f"{name}_steady_ms"] for r in rows),
                     "ratio_median": statistics.median(ratios), "ratio_max": max(ratios),
                     "cpu_ratio_median": statistics.median(r[f"{name}_cpu_ratio"] for r in rows),
                     "first_faults_median": statistics.median(r[f"{name}_first_faults"] for r in rows),
                     "steady_faults_median": statistics.median(r[f"{name}_steady_faults"] for r in rows)}
    return out


def rss_over_shapes(n: int, threads: int, onnx_path=None, low=LOW, high=HIGH, multiple=1) -> dict:
    """(In the child) one run at each of n distinct shapes; RSS after 20 and after n."""
    import mnntool
    tmp = Path(tempfile.mkdtemp())
    _, mnn = models(tmp, onnx_path)
    sess = mnntool.load(mnn, threads=threads)
    name, channels = image_input(sess)
    rng = np.random.default_rng(2)
    at = {}
    t0 = time.perf_counter()
    for k, (h, w) in enumerate(distinct_shapes(n, 3, low, high, multiple), 1):
        sess.run({name: rng.standard_normal((1, channels, h, w)).astype(np.float32)})
        if k in (20, n):
            gc.collect()
            at[k] = rss_mb()
    return {"rss_shapes": n, "rss_after_20_mb": round(at[20], 1), f"rss_after_{n}_mb": round(at[n], 1),
            "rss_growth_mb": round(at[n] - at[20], 1), "rss_seconds": round(time.perf_counter() - t0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", type=int, default=40, help="distinct shapes timed (first run against steady)")
    ap.add_argument("--repeats", type=int, default=5, help="steady-state runs per shape and runtime")
    ap.add_argument("--rss-shapes", type=int, default=2000, help="distinct shapes of the RSS phase (0: skip it)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--warm-shapes", type=int, default=0,
                    help="distinct shapes of the range run once before the timed ones (a process's one-time costs)")
    ap.add_argument("--onnx", default=None, help="an image model of your own (input N,C,H,W with H and W open)")
    ap.add_argument("--low", type=int, default=LOW, help="smallest height and width")
    ap.add_argument("--high", type=int, default=HIGH, help="largest height and width")
    ap.add_argument("--multiple", type=int, default=1, help="heights and widths a multiple of this (a detector's stride)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--rss-child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rss_child:
        print(json.dumps(rss_over_shapes(a.rss_shapes, a.threads, a.onnx, a.low, a.high, a.multiple)))
        return
    if a.multiple < 1 or not 1 <= a.low <= a.high or \
            (a.high // a.multiple - -(-a.low // a.multiple) + 1) ** 2 < max(a.shapes + a.warm_shapes, a.rss_shapes):
        ap.error("--low/--high/--multiple: 1 <= low <= high, with at least as many (H, W) pairs (multiples of "
                 "--multiple) as shapes asked for")
    if a.warm_shapes < 0:
        ap.error("--warm-shapes: 0 or more")
    if a.rss_shapes and a.rss_shapes < 20:
        ap.error("--rss-shapes: at least 20 (RSS is compared with its value after 20 shapes)")
    from rich.progress import Progress
    with Progress(disable=not sys.stderr.isatty(), transient=True) as bar:
        task = bar.add_task("new shapes", total=a.shapes)
        result = first_and_steady(a.shapes, a.repeats, a.threads, lambda k: bar.update(task, completed=k), a.onnx,
                                  a.low, a.high, a.multiple, a.warm_shapes)
    if a.rss_shapes:
        child = subprocess.run([sys.executable, __file__, "--rss-child", "--rss-shapes", str(a.rss_shapes),
                                "--threads", str(a.threads), "--low", str(a.low), "--high", str(a.high),
                                "--multiple", str(a.multiple)]
                               + (["--onnx", a.onnx] if a.onnx else []), capture_output=True, text=True, check=True)
        result.update(json.loads(child.stdout.strip().splitlines()[-1]))
    result["cpu"] = _cpu_name()
    if a.json:
        print(json.dumps(result, indent=1))
        return
    for name in ("mnntool", "onnxruntime"):
        r = result[name]
        print(f"{name:12s} first {r['first_ms_median']:7.2f} ms (max {r['first_ms_max']:7.2f})  steady "
              f"{r['steady_ms_median']:6.2f} ms  first/steady median {r['ratio_median']:.2f}x "
              f"(max {r['ratio_max']:.2f}x; "
              f"CPU time {r['cpu_ratio_median']:.2f}x)  page faults first {r['first_faults_median']:.0f}, steady "
              f"{r['steady_faults_median']:.0f}")
    if a.rss_shapes:
        print(f"RSS after 20 shapes {result['rss_after_20_mb']} MB, after {a.rss_shapes} "
              f"{result[f'rss_after_{a.rss_shapes}_mb']} MB (growth {result['rss_growth_mb']} MB)")
    print(f"CPU: {result['cpu']}, {a.threads} thread(s)")


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return os.uname().machine


if __name__ == "__main__":
    main()
