"""mnntool's runtime vs onnxruntime and MNN, same models, same machine, same run.

    python benchmarks/runtime_speed.py [--threads 1 2] [--runs 30] [--rounds 3] [--models resnet18 ...]

Prints one row per model and thread count with medians and the ratios mnntool/ORT and mnntool/MNN
(below 1.0 means mnntool is faster); --json writes them for tracking. A shared VM's speed drifts by
20-30% within minutes, so the three backends are measured in turn, `--rounds` times: the times shown
are the medians over rounds, the ratios the medians of each round's ratio (backends timed seconds apart);
the same for the fastest runs ("min"), which other tenants disturb least.
"""
from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.isolated import bench, converted, save_rows, speed_args  # noqa: E402


def main():
    args = speed_args(["resnet18", "mobilenetv2", "bert", "lstm"], rounds=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, src, dst in converted(args.models, tmp):
            for t in args.threads:
                rounds = []
                for _ in range(args.rounds):
                    rounds.append({"ours": bench(dst, "numba", t, 5, args.runs), "ort": bench(src, "onnxruntime", t, 5, args.runs),
                                   "mnn": bench(dst, "mnn", t, 5, args.runs)})
                med = lambda f: statistics.median(f(r) for r in rounds)  # noqa: E731
                row = {"model": name, "threads": t, "rounds": args.rounds,
                       "mnntool_ms": med(lambda r: r["ours"]["median_ms"]),
                       "ort_ms": med(lambda r: r["ort"]["median_ms"]), "mnn_ms": med(lambda r: r["mnn"]["median_ms"]),
                       "vs_ort": med(lambda r: r["ours"]["median_ms"] / r["ort"]["median_ms"]),
                       "vs_mnn": med(lambda r: r["ours"]["median_ms"] / r["mnn"]["median_ms"]),
                       "vs_mnn_each_round": [round(r["ours"]["median_ms"] / r["mnn"]["median_ms"], 3) for r in rounds],
                       # the fastest run is the one least disturbed by the VM's other tenants
                       "vs_ort_min": med(lambda r: r["ours"]["min_ms"] / r["ort"]["min_ms"]),
                       "vs_mnn_min": med(lambda r: r["ours"]["min_ms"] / r["mnn"]["min_ms"]),
                       "mnntool_first_run_ms": med(lambda r: r["ours"]["first_run_ms"])}
                rows.append(row)
                print(f"{name:12s} t={t}  mnntool {row['mnntool_ms']:8.2f} ms  ort {row['ort_ms']:8.2f} ms  "
                      f"mnn {row['mnn_ms']:8.2f} ms  x ort {row['vs_ort']:.2f}  x mnn {row['vs_mnn']:.2f} "
                      f"{row['vs_mnn_each_round']}  min: x ort {row['vs_ort_min']:.2f} x mnn {row['vs_mnn_min']:.2f}  "
                      f"first run {row['mnntool_first_run_ms']:.0f} ms", flush=True)
    save_rows(args.json, rows)


if __name__ == "__main__":
    main()
