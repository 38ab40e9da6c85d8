"""Process-wide tuning of the thread pools, in one explicit call: the CLI and the benchmarks make it
first thing; a library user decides for themselves (importing mnntool changes nothing).

OpenMP's workers must stay awake from one kernel of a run to the next, and sleep soon after the run, as
MNN's pool does (it spins while a session runs): on this 2-core VM a worker that slept for 20 ms wakes
slowly for the rest of the next run. With GNU OpenMP's spin of 10k (~0.3 ms here), MobileNetV3 at 2
threads ran 5.0 ms back to back but 13.4 ms once per 20 ms (ShuffleNet 3.1 and 5.9); with 1M (~13 ms of
spinning after a run; onnxruntime's pool spins ~25 ms) 4.3 and 4.4 ms (2.7 and 2.9). The spin used to be
short because idle spinning workers starved OpenBLAS's threads (ResNet-18 at 2 threads 4x slower at the
default 300k); sessions now keep BLAS at one thread (runtime/settings.py), so nothing wants that core.
Read when OpenMP starts, so before Numba's first parallel kernel. OpenBLAS's own workers (a library
user's BLAS at more threads) spin after each sgemm: the shortest spin (2^4 cycles; read when OpenBLAS
loads, so before numpy is imported). And OpenBLAS at one thread from its start, as sessions keep it.
"""
from __future__ import annotations

import os
import sys


# whether OpenBLAS runs at one thread from its start (tune_process set it before numpy loaded): sessions
# keep BLAS at one thread (runtime/settings.py) and then need not ask threadpoolctl, whose scan of the
# process's libraries cost ~5 ms of a first run
BLAS_AT_ONE: list = [False]


def tune_process() -> list[str]:
    """Set the pool variables a user has not set; returns the names it set. Call before numpy and Numba
    are imported (it says so on stderr when numpy already is: OpenBLAS then keeps its default)."""
    set_now = []
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = "1000000"
        set_now.append("GOMP_SPINCOUNT")
    if "OPENBLAS_THREAD_TIMEOUT" not in os.environ:
        os.environ["OPENBLAS_THREAD_TIMEOUT"] = "4"
        set_now.append("OPENBLAS_THREAD_TIMEOUT")
        if "numpy" in sys.modules:
            print("mnntool: tune_process() after numpy was imported: OpenBLAS keeps its default spin",
                  file=sys.stderr)
    if "OPENBLAS_NUM_THREADS" not in os.environ and "numpy" not in sys.modules:
        os.environ["OPENBLAS_NUM_THREADS"] = "1"
        set_now.append("OPENBLAS_NUM_THREADS")
        BLAS_AT_ONE[0] = True
    return set_now
