"""mnntool: convert, optimize, quantize, verify and benchmark models in MNN's .mnn format."""

import os

# OpenMP workers that spin long while idle starve OpenBLAS's threads (and the reverse) on small
# machines: with GNU OpenMP's default 300k spins and both at 2 threads, ResNet-18 ran 4x slower than
# with 1. Workers that sleep at once pay ~50 us to wake for each of a model's ~50 parallel kernels; a
# short spin (10k) keeps them awake from one kernel to the next: at 2 threads ResNet-18 went from
# 21-27 to 17-18 ms. Read when OpenMP starts, so before Numba's first parallel kernel.
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "10000")
# and OpenBLAS's own workers spin after each sgemm while Numba's kernels want that core: the shortest
# spin (2^4 cycles; read when OpenBLAS loads, so before numpy is imported) took ResNet-18 at 2 threads
# from 31-34 ms to 27-28 ms
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

__version__ = "0.1.0"


def load(path, threads=None):
    """A runtime session: `mnntool.load("m.mnn").run({name: array}) -> {name: array}`."""
    from .runtime.session import load as _load
    return _load(path, threads)
