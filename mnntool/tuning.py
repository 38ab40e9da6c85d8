"""Process-wide tuning of the thread pools, in one explicit call: the CLI and the benchmarks make it
first thing; a library user decides for themselves (importing mnntool changes nothing).

OpenMP workers that spin long while idle starve OpenBLAS's threads (and the reverse) on small machines:
with GNU OpenMP's default 300k spins and both at 2 threads, ResNet-18 ran 4x slower than with 1. Workers
that sleep at once pay ~50 us to wake for each of a model's ~50 parallel kernels; a short spin (10k) keeps
them awake from one kernel to the next: at 2 threads ResNet-18 went from 21-27 to 17-18 ms. Read when
OpenMP starts, so before Numba's first parallel kernel. OpenBLAS's own workers spin after each sgemm while
Numba's kernels want that core: the shortest spin (2^4 cycles; read when OpenBLAS loads, so before numpy
is imported) took ResNet-18 at 2 threads from 31-34 ms to 27-28 ms.
"""
from __future__ import annotations

import os
import sys


def tune_process() -> list[str]:
    """Set the pool variables a user has not set; returns the names it set. Call before numpy and Numba
    are imported (it says so on stderr when numpy already is: OpenBLAS then keeps its default)."""
    set_now = []
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = "10000"
        set_now.append("GOMP_SPINCOUNT")
    if "OPENBLAS_THREAD_TIMEOUT" not in os.environ:
        os.environ["OPENBLAS_THREAD_TIMEOUT"] = "4"
        set_now.append("OPENBLAS_THREAD_TIMEOUT")
        if "numpy" in sys.modules:
            print("mnntool: tune_process() after numpy was imported: OpenBLAS keeps its default spin",
                  file=sys.stderr)
    return set_now
