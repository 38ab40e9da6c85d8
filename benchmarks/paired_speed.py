"""mnntool's runtime vs onnxruntime and MNN at 1 thread, the three taking turns run by run in one process.

    python benchmarks/paired_speed.py [--runs 200] [--repeats 3] [--models mobilenetv2 resnet18 ...]

`runtime_speed.py` times each backend for a second in its own process; on this shared VM other
tenants slow whole seconds by 20-70%, so one round's ratio ranged 0.47-1.70 for the same build. Here
every run of mnntool sits between a run of MNN and one of onnxruntime (the order turns each run), so a
slow spell hits all three alike and the ratio of medians holds still to a few percent. At more than
one thread (`paired(..., threads)`) each timed run follows a pause in which the previous runtime's
spinning workers go to sleep, and an untimed run (THREADS_GAP_S). Every backend runs after the others
have used the caches, as a model does inside an application, so times are above `runtime_speed`'s.
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mnntool.threadpool import tune_process  # noqa: E402

tune_process()      # as the CLI does: the timed runs are in this process
from mnntool.runners import backend_runner  # noqa: E402
from mnntool.inputs import random_feeds  # noqa: E402
from benchmarks.isolated import converted, save_rows  # noqa: E402


# At more threads each turn waits this long first: onnxruntime's pool spins ~25 ms after its run and
# mnntool's OpenMP workers ~13 ms (threadpool.py), and a spinning pool takes a core from the runtime whose
# turn it is (MNN's MobileNetV3 at 2 threads: 5.4 ms alone, 25 ms right after onnxruntime's run). Then
# one untimed run wakes the runtime's own workers (on this VM the first run after 40 ms of idling is
# 1.5-3x slower for all three: onnxruntime's MobileNetV3 8.5 ms against 2.8), and the next is timed, so
# each time is the runtime's steady state with no other pool on its cores.
THREADS_GAP_S = 0.04


# reference name in the results -> (backend, which file it runs)
REFS = {"ort": ("onnxruntime", "onnx"), "mnn": ("mnn", "mnn"), "ov": ("openvino", "onnx")}


def paired(mnn_path: Path, onnx_path: Path, runs: int, threads: int = 1, own_at: int | None = None,
           refs: tuple = ("ort", "mnn"), shapes: dict | None = None) -> dict:
    """Medians and ratios (vs_<ref> for each of `refs`: onnxruntime, MNN, OpenVINO); with own_at,
    mnntool at that many threads takes turns too (its time at `threads` against its own at `own_at`,
    measured the same way: vs_own). `shapes` fixes open input dims for every runtime alike."""
    files = {"onnx": onnx_path, "mnn": mnn_path}
    runners = {"mnntool": backend_runner(mnn_path, "numba", threads, shapes)}
    for ref in refs:
        backend, kind = REFS[ref]
        runners[ref] = backend_runner(files[kind], backend, threads, shapes)
    if own_at is not None:
        runners["own"] = backend_runner(mnn_path, "numba", own_at, shapes)
    feeds = random_feeds(runners["mnntool"].graph, shapes)
    for r in runners.values():
        for _ in range(10):
            r.run(feeds)
    names = list(runners)
    times = {n: [] for n in names}
    gap = THREADS_GAP_S if threads > 1 else 0.0
    for i in range(runs):
        for n in names[i % len(names):] + names[:i % len(names)]:
            if gap:
                time.sleep(gap)
                runners[n].run(feeds)
            t0 = time.perf_counter()
            runners[n].run(feeds)
            times[n].append((time.perf_counter() - t0) * 1e3)
    med = {n: statistics.median(v) for n, v in times.items()}
    ratios = {f"vs_{ref}": med["mnntool"] / med[ref] for ref in refs}
    if "own" in med:
        ratios["vs_own"] = med["mnntool"] / med["own"]
    return {**{f"{n}_ms": med[n] for n in names}, **ratios}


def main():
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3, help="independent measurements per model")
    ap.add_argument("--models", nargs="+", default=["resnet18", "mobilenetv2", "bert", "lstm"])
    ap.add_argument("--json", type=str, default=None)
    args = ap.parse_args()
    import tempfile
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, src, dst in converted(args.models, tmp):
            reps = [paired(dst, src, args.runs) for _ in range(args.repeats)]
            row = {"model": name, "threads": 1, "runs": args.runs, "repeats": reps,
                   **{k: statistics.median(r[k] for r in reps) for k in reps[0]}}
            rows.append(row)
            print(f"{name:12s} t=1  mnntool {row['mnntool_ms']:7.2f} ms  ort {row['ort_ms']:7.2f} ms  "
                  f"mnn {row['mnn_ms']:7.2f} ms  x ort {row['vs_ort']:.3f}  x mnn {row['vs_mnn']:.3f}  "
                  f"repeats x mnn {[round(r['vs_mnn'], 3) for r in reps]}", flush=True)
    save_rows(args.json, rows)


if __name__ == "__main__":
    main()
