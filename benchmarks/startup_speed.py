"""Start-up: load+prepare and the first run, each in a fresh process, mnntool against MNN and
onnxruntime taking turns process by process.

    python benchmarks/startup_speed.py [--reps 5] [--threads 1] [--models mobilenetv2 resnet18 efficientnet_b0 ...]

Each process imports numpy and mnntool's timing module first (shared by all three), then times what
`mnntool bench` reports as load+prepare (the runtime's import, reading the model, planning and packing
for the input shape; MNN: `import MNN`, the interpreter and its session) and the first run after it.
mnntool's one-thread sessions use the ahead-of-time kernel library when `mnntool compile-kernels` built
one (the table says whether it loaded); without it every start imports Numba and loads its cache.
Models: the fixtures (mobilenetv2, resnet18, bert, lstm) and the zoo's (benchmarks/zoo_speed.py's
cached exports in build/zoo). Prints medians and ratios, also of the two together (the time to a first result: MNN leaves part of its preparing to
its first run); writes <out>/startup_speed_t<threads>.json.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FIXTURES = ("mobilenetv2", "resnet18", "bert", "lstm")

_CHILD = """
import json, sys
from mnntool.threadpool import tune_process
tune_process()
import numpy
from mnntool.timing import bench
shapes = json.loads(sys.argv[4])      # the .mnn's input shapes (onnxruntime: the export's may be symbolic)
r = bench(sys.argv[1], sys.argv[2], int(sys.argv[3]), warmup=0, runs=3, shapes={k: tuple(v) for k, v in shapes.items()})
print(json.dumps({k: r.get(k) for k in ("load_prepare_ms", "first_run_ms", "median_ms", "kernel_library")}))
"""


def _one(path: Path, backend: str, threads: int, shapes: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)        # a user's Python reads its bytecode caches
    done = subprocess.run([sys.executable, "-c", _CHILD, str(path), backend, str(threads), json.dumps(shapes)], env=env,
                          capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise RuntimeError(f"{path} on {backend}: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _models(names: list[str], tmp: Path) -> list[tuple[str, Path, Path]]:
    out = []
    zoo = ROOT / "build" / "zoo"
    for name in names:
        if name in FIXTURES:
            from benchmarks.isolated import converted
            out += list(converted([name], tmp))
        elif (zoo / f"{name.removeprefix('zoo:')}.speed.mnn").exists():
            bare = name.removeprefix("zoo:")
            out.append((name, zoo / f"{bare}.dynamo.onnx", zoo / f"{bare}.speed.mnn"))
        else:
            print(f"{name}: no export in {zoo} (run benchmarks/zoo_speed.py --models {name} first)", file=sys.stderr)
    return out


def main():
    ap = argparse.ArgumentParser()
    zoo_names = sorted(p.name[:-len(".speed.mnn")] for p in (ROOT / "build" / "zoo").glob("*.speed.mnn"))
    zoo_names = [f"zoo:{n}" if n in FIXTURES else n for n in zoo_names]     # the zoo's tiny bert is not the fixture
    ap.add_argument("--models", nargs="*", default=list(FIXTURES) + zoo_names)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "build"))
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, onnx_path, mnn_path in _models(args.models, Path(tmp)):
            from mnntool.api import load_graph
            from mnntool.inputs import random_feeds
            shapes = {k: list(v.shape) for k, v in random_feeds(load_graph(mnn_path), None).items()}
            runs = {"mnntool": [], "mnn": [], "ort": []}
            for i in range(args.reps):
                order = [("mnntool", mnn_path, "numba"), ("mnn", mnn_path, "mnn"), ("ort", onnx_path, "onnxruntime")]
                for key, path, backend in order[i % 3:] + order[:i % 3]:
                    runs[key].append(_one(path, backend, args.threads, shapes))
            med = {k: {m: statistics.median(r[m] for r in v) for m in ("load_prepare_ms", "first_run_ms", "median_ms")}
                   for k, v in runs.items()}
            row = {"model": name, "threads": args.threads, "reps": args.reps,
                   "kernel_library": runs["mnntool"][0]["kernel_library"] is not None, **{
                       f"{k}_{m}": round(med[k][m], 2) for k in med for m in med[k]}}
            for k in med:       # MNN leaves work to its first run (ResNet-18: weight transforms, ~0.4 s)
                row[f"{k}_first_result_ms"] = round(med[k]["load_prepare_ms"] + med[k]["first_run_ms"], 2)
            for other in ("mnn", "ort"):
                row[f"first_result_x_{other}"] = round(row["mnntool_first_result_ms"] / row[f"{other}_first_result_ms"], 2)
                row[f"load_prepare_x_{other}"] = round(med["mnntool"]["load_prepare_ms"] / med[other]["load_prepare_ms"], 2)
                row[f"first_run_x_{other}"] = round(med["mnntool"]["first_run_ms"] / med[other]["first_run_ms"], 2)
            rows.append(row)
            print(f"{name:30s} load+prepare {row['mnntool_load_prepare_ms']:7.1f} ms (MNN {row['mnn_load_prepare_ms']:6.1f}, "
                  f"ORT {row['ort_load_prepare_ms']:6.1f}) x MNN {row['load_prepare_x_mnn']:.2f}   first run "
                  f"{row['mnntool_first_run_ms']:7.1f} ms (MNN {row['mnn_first_run_ms']:6.1f}) x MNN "
                  f"{row['first_run_x_mnn']:.2f}   both x MNN {row['first_result_x_mnn']:.2f} x ORT {row['first_result_x_ort']:.2f}   library {'yes' if row['kernel_library'] else 'no'}", flush=True)
    if rows:
        for m in ("load_prepare_x_mnn", "first_run_x_mnn", "first_result_x_mnn", "load_prepare_x_ort", "first_run_x_ort",
                  "first_result_x_ort"):
            g = math.exp(sum(math.log(r[m]) for r in rows) / len(rows))
            print(f"geometric mean {m}: {g:.2f}   worst {max(r[m] for r in rows):.2f}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"startup_speed_t{args.threads}.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
