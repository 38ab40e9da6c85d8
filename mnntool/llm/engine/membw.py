"""The host's memory bandwidth, STREAM-like, at a thread count: what a decode step is measured against.

Decode reads every weight once per token, so its time per token is bounded below by (weight bytes +
the KV bytes read) / bandwidth. `measure(threads)` times, best of `reps`, a read (a sum over a buffer
several times the last-level cache) and a copy (bytes read + written), split over the threads in
contiguous chunks as the GEMV's rows are. Runs in `llm bench`'s own child process (engine/bench.py),
so the buffer does not count in the benchmark's peak RSS.
"""
from __future__ import annotations

import time

import numpy as np

from ...runtime.kernels.compile.jit import njit, prange


@njit(cache=True, fastmath=True)
def _sum(a):
    t = 0.0
    for i in range(a.size):
        t += a[i]
    return t


@njit(cache=True)
def _copy(a, b):
    for i in range(a.size):
        b[i] = a[i]


@njit(parallel=True, cache=True)
def read_sum(a, chunks, out):
    step = (a.size + chunks - 1) // chunks
    for c in prange(chunks):
        out[c] = _sum(a[c * step:(c + 1) * step])


@njit(parallel=True, cache=True)
def copy(a, b, chunks):
    step = (a.size + chunks - 1) // chunks
    for c in prange(chunks):
        _copy(a[c * step:(c + 1) * step], b[c * step:(c + 1) * step])


def measure(threads: int = 1, mb: int = 512, reps: int = 5) -> dict:
    """{"read_GBps", "copy_GBps", "threads", "buffer_MB"}: the best of `reps` passes."""
    from ...runtime.settings import Settings
    Settings.of(threads).apply()
    n = mb * (1 << 20) // 4
    a = np.ones(n, np.float32)
    b = np.zeros(n, np.float32)
    chunks = max(1, threads)
    part = np.zeros(chunks, np.float64)
    fr, fc = (read_sum, copy) if threads > 1 else (read_sum.serial(), copy.serial())
    fr(a[:1024], chunks, part)
    fc(a[:1024], b[:1024], chunks)
    best_r = best_c = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fr(a, chunks, part)
        best_r = min(best_r, time.perf_counter() - t)
        t = time.perf_counter()
        fc(a, b, chunks)
        best_c = min(best_c, time.perf_counter() - t)
    if float(part.sum()) != float(n):
        raise RuntimeError(f"bandwidth test: the sum {part.sum()} is not {n}")
    return {"read_GBps": a.nbytes / best_r / 1e9, "copy_GBps": 2 * a.nbytes / best_c / 1e9, "threads": threads,
            "buffer_MB": mb}
