"""Latency statistics for one model on one backend (mnntool's runtime, onnxruntime or MNN)."""
from __future__ import annotations

import resource
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from .errors import MnnToolError
from .inputs import random_feeds
from .runners import backend_runner


def _stats(times_ms: list[float]) -> dict:
    a = np.asarray(times_ms)
    return {"min_ms": float(a.min()), "median_ms": float(np.median(a)), "mean_ms": float(a.mean()),
            "p90_ms": float(np.percentile(a, 90)), "p99_ms": float(np.percentile(a, 99)), "std_ms": float(a.std()),
            "max_ms": float(a.max())}


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def bench(path, backend: str = "numba", threads: int = 1, warmup: int = 5, runs: int = 50,
          shapes: dict | None = None, profile: bool = False, progress=None) -> dict:
    from .ir.shape_inference import flops
    path = Path(path)
    if not path.exists():
        raise MnnToolError(f"{path}: no such file")
    if runs < 1 or warmup < 0:
        raise MnnToolError("--runs must be >= 1 and --warmup >= 0")
    from .runtime import fallbacks
    before = fallbacks.snapshot()
    t0 = time.perf_counter()
    r = backend_runner(path, backend, threads, shapes)
    feeds = random_feeds(r.graph, shapes)
    r.prepare({k: v.shape for k, v in feeds.items()})
    load_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    r.run(feeds)
    cold_ms = (time.perf_counter() - t0) * 1e3
    for _ in range(warmup):
        r.run(feeds)
        if progress:
            progress(1)
    times = []
    per_step = defaultdict(float)
    for _ in range(runs):
        t0 = time.perf_counter()
        if profile:
            steps = r.profile(feeds) or []
        else:
            r.run(feeds)
            steps = []
        times.append((time.perf_counter() - t0) * 1e3)
        for name, op, dt in steps:
            per_step[(name, op)] += dt
        if progress:
            progress(1)
    out = {"model": str(path), "backend": backend, "threads": threads, "runs": runs, "warmup": warmup,
           **_stats(times), "first_run_ms": cold_ms, "load_prepare_ms": load_ms, "peak_rss_mb": _peak_rss_mb()}
    total_flops = flops(r.graph)
    out["gflops"] = total_flops / 1e9
    out["gflop_per_s"] = total_flops / 1e9 / (out["median_ms"] / 1e3) if out["median_ms"] else 0.0
    if backend == "numba":
        from .runtime.kernels.compile import aot
        out["memory_pool_mb"] = r.session.plan.pool_bytes / 1e6
        lib = aot.library()      # the one-thread kernels' ahead-of-time library, if one loaded
        out["kernel_library"] = str(lib.path) if lib is not None else None
        out["kernel_fallbacks"] = fallbacks.report(since=before)    # ops on numpy: their fast kernel failed
        from .runtime import host_tuning
        out["host_tuning"] = host_tuning.report(threads or 1)     # the thread thresholds the plan used
        from .runtime.kernels import amx_host
        out["int8_kernel"] = amx_host.report()       # the int8 GEMM's kernel (AMX, VNNI or float) and why
        from .runtime.kernels import denormals
        out["denormals"] = denormals.report()     # flushed to zero while runs run (MNNTOOL_DENORMALS), or kept
    if per_step:
        total = sum(per_step.values())
        by_type = defaultdict(lambda: [0.0, 0])
        for (name, op), dt in per_step.items():
            by_type[op][0] += dt
            by_type[op][1] += 1
        out["profile"] = {
            "ops": [{"name": n, "op": op, "ms": dt / runs * 1e3, "percent": 100 * dt / total}
                    for (n, op), dt in sorted(per_step.items(), key=lambda kv: -kv[1])],
            "op_types": [{"op": op, "count": c, "ms": dt / runs * 1e3, "percent": 100 * dt / total}
                         for op, (dt, c) in sorted(by_type.items(), key=lambda kv: -kv[1][0])],
        }
    return out
