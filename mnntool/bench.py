"""Latency statistics for one model on one backend (mnntool's runtime, onnxruntime or MNN)."""
from __future__ import annotations

import resource
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from .errors import MnnToolError
from .inputs import random_feeds


def _stats(times_ms: list[float]) -> dict:
    a = np.asarray(times_ms)
    return {"min_ms": float(a.min()), "median_ms": float(np.median(a)), "mean_ms": float(a.mean()),
            "p90_ms": float(np.percentile(a, 90)), "p99_ms": float(np.percentile(a, 99)), "std_ms": float(a.std()),
            "max_ms": float(a.max())}


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class _Runner:
    """Uniform interface over the backends: prepare once, then run(feeds)."""

    def __init__(self, path: Path, backend: str, threads: int, shapes: dict):
        from .api import load_graph
        self.backend = backend
        self.profile_rows = None
        suffix = path.suffix.lower()
        if backend == "onnxruntime":
            if suffix != ".onnx":
                raise MnnToolError(f"{path}: --backend onnxruntime needs the source .onnx model")
            import onnxruntime as ort
            from .frontends.onnx import load_onnx
            self.graph = load_onnx(path, shapes)
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = threads
            opts.inter_op_num_threads = 1
            self.sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
            self.ort_inputs = {i.name: i.type for i in self.sess.get_inputs()}
            self.run = lambda feeds: self.sess.run(None, {k: v.astype(np.int64) if "int64" in self.ort_inputs[k]
                                                          else v for k, v in feeds.items()})
        elif backend == "mnn":
            from .runtime.mnn_backend import MnnSession
            mnn_path = path
            if suffix != ".mnn":
                from .api import convert
                self._tmp = tempfile.TemporaryDirectory()
                mnn_path = Path(self._tmp.name) / "model.mnn"
                convert(path, mnn_path, input_shapes=shapes)
            self.graph = load_graph(mnn_path, input_shapes=shapes)
            self.sess = MnnSession(str(mnn_path), self.graph.inputs, self.graph.outputs, threads=threads)
            self.run = self.sess.run
        elif backend == "numba":
            from .passes import run_pipeline
            from .runtime.session import Session
            self.graph = load_graph(path, input_shapes=shapes)
            if suffix != ".mnn":
                run_pipeline(self.graph, 1)
            self.sess = Session(self.graph, threads)
            self.run = self.sess.run
        else:
            raise MnnToolError(f"unknown backend '{backend}' (numba, onnxruntime, mnn)")


def bench(path, backend: str = "numba", threads: int = 1, warmup: int = 5, runs: int = 50,
          shapes: dict | None = None, profile: bool = False, progress=None) -> dict:
    from .ir.shape_inference import flops
    path = Path(path)
    if not path.exists():
        raise MnnToolError(f"{path}: no such file")
    if runs < 1 or warmup < 0:
        raise MnnToolError("--runs must be >= 1 and --warmup >= 0")
    t0 = time.perf_counter()
    r = _Runner(path, backend, threads, shapes or {})
    feeds = random_feeds(r.graph, shapes)
    if backend == "numba":
        r.sess.prepare({k: v.shape for k, v in feeds.items()})
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
        steps: list | None = [] if profile and backend == "numba" else None
        t0 = time.perf_counter()
        r.run(feeds, profile=steps) if steps is not None else r.run(feeds)
        times.append((time.perf_counter() - t0) * 1e3)
        if steps is not None:
            for s, dt in zip(r.sess.plan.steps, steps):
                per_step[(s.name, s.op)] += dt
        if progress:
            progress(1)
    out = {"model": str(path), "backend": backend, "threads": threads, "runs": runs, "warmup": warmup,
           **_stats(times), "first_run_ms": cold_ms, "load_prepare_ms": load_ms, "peak_rss_mb": _peak_rss_mb()}
    total_flops = flops(r.graph)
    out["gflops"] = total_flops / 1e9
    out["gflop_per_s"] = total_flops / 1e9 / (out["median_ms"] / 1e3) if out["median_ms"] else 0.0
    if backend == "numba":
        out["memory_pool_mb"] = r.sess.plan.pool_bytes / 1e6
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
