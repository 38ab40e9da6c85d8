"""Run one `mnntool bench` in a child process and return its JSON.

Each backend gets a fresh process: MNN's thread pool (and OpenMP/OpenBLAS pools) left behind by an
earlier measurement in the same process can take the cores from the next one (seen: 2-thread runs
ten times slower after MNN had run in the process).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Iterator


def bench(path, backend: str, threads: int, warmup: int = 5, runs: int = 30) -> dict:
    cmd = [sys.executable, "-m", "mnntool", "bench", str(path), "--backend", backend, "--threads", str(threads),
           "--warmup", str(warmup), "--runs", str(runs), "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}")
    return json.loads(done.stdout)


def converted(models: list[str], tmp) -> "Iterator[tuple[str, Path, Path]]":
    """(name, source .onnx, .mnn in tmp) for each fixture model, built if missing and converted."""
    from fixtures.models import build
    from mnntool.api import convert
    root = Path(__file__).resolve().parents[1]
    for name in models:
        src = build(name, root / "build" / "fixtures")
        dst = Path(tmp) / f"{name}.mnn"
        convert(src, dst)
        yield name, src, dst


def speed_args(models: list[str], rounds: bool = False) -> argparse.Namespace:
    """The speed benchmarks' shared options: thread counts, runs, models, a JSON file for the rows and
    (when the benchmark takes it) rounds."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--runs", type=int, default=30)
    if rounds:
        ap.add_argument("--rounds", type=int, default=3,
                        help="measure the backends in turn this many times; ratios are the median of each round's")
    ap.add_argument("--models", nargs="+", default=models)
    ap.add_argument("--json", type=str, default=None)
    return ap.parse_args()


def save_rows(path: str | None, rows: list[dict]) -> None:
    if path:
        Path(path).write_text(json.dumps(rows, indent=1))
