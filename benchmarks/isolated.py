"""Run one `mnntool bench` in a child process and return its JSON.

Each backend gets a fresh process: MNN's thread pool (and OpenMP/OpenBLAS pools) left behind by an
earlier measurement in the same process can take the cores from the next one (seen: 2-thread runs
ten times slower after MNN had run in the process).
"""
from __future__ import annotations

import json
import subprocess
import sys


def bench(path, backend: str, threads: int, warmup: int = 5, runs: int = 30) -> dict:
    cmd = [sys.executable, "-m", "mnntool", "bench", str(path), "--backend", backend, "--threads", str(threads),
           "--warmup", str(warmup), "--runs", str(runs), "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}")
    return json.loads(done.stdout)
