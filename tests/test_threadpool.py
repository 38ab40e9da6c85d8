"""tune_process sets the pools before numpy loads: OpenBLAS then starts at one thread (checked by
threadpoolctl, independently of the flag), and sessions skip threadpoolctl's library scan."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = """
import json
from mnntool.threadpool import tune_process, BLAS_AT_ONE
names = tune_process()
import numpy
from threadpoolctl import threadpool_info
blas = [p["num_threads"] for p in threadpool_info() if p.get("user_api") == "blas"]
print(json.dumps({"names": names, "flag": BLAS_AT_ONE[0], "blas": blas}))
"""


def test_openblas_starts_at_one_thread():
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert "OPENBLAS_NUM_THREADS" in got["names"] and got["flag"]
    assert got["blas"] and all(n == 1 for n in got["blas"])


def test_a_users_setting_is_kept():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "2"}
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=120)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert "OPENBLAS_NUM_THREADS" not in got["names"] and not got["flag"]
