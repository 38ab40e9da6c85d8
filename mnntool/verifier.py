"""Which layer broke it? Compare every tensor of a .mnn model with its source model, layer by layer.

The source runs on its framework's runner (runners/: onnxruntime for ONNX and OpenCV for Caffe with
every intermediate tensor exposed, torch and TensorFlow for their final outputs); the .mnn on
mnntool's runtime keeping every tensor (or, with backend "mnn", on the real MNN runtime, asked for the
same tensors by name). Tensors are matched by name: passes
keep the name of the last tensor of what they fuse, so fused-away tensors are listed as unmatched.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .compare import Sums, metrics
from .errors import MnnToolError
from .format import reader
from .inputs import random_feeds
from .runners import backend_runner, reference_runner


def verify(source, model, feeds: dict | list | None = None, shapes: dict | None = None, backend: str = "numba",
           min_cosine: float = 0.999, max_abs: float | None = None, threads: int | None = None,
           allow_io: bool = False, progress=None, workers: int = 1, ray: str | None = None) -> dict:
    """Per-layer metrics over one sample (a dict) or several (a list of dicts, metrics over all of them,
    from per-sample sums merged in sample order: the same numbers for any `workers`, the local
    processes the samples are split over, or Ray tasks with `ray` an address as quant's --ray). The
    source runs in its own framework, its code with it: TensorFlow graphs with file or Python ops are
    refused unless `allow_io`."""
    samples = feeds if isinstance(feeds, list) else [feeds]
    args = (source, model, shapes, backend, min_cosine, max_abs, threads, allow_io)
    if len(samples) == 1:
        return _verify_one(source, model, samples[0], *args[2:])[0]
    if workers > 1 or ray is not None:
        from .quant.shards import pool, split_map
        with pool(workers, ray) as shards:
            parts = split_map(shards, _first_and_sums, samples, *args)
        result, per_sample = parts[0][0], [sums for _, sums in parts]
        if progress:
            progress(len(samples))
    else:
        result, per_sample = None, []
        for sample in samples:
            r, sums = _first_and_sums([sample], *args)[0]
            result = result or r
            per_sample.append(sums)
            if progress:
                progress(1)
    for m in result["layers"] + result["outputs"]:
        total = Sums.total(sums[m["name"]] for sums in per_sample)
        keep = {k: m[k] for k in ("name", "op", "mnn_op", "shape") if k in m}
        m.clear()
        m.update(total.metrics(), **keep)
        m["pass"] = m["cosine"] >= min_cosine and (max_abs is None or m["max_abs"] <= max_abs)
    first = next((m for m in result["layers"] if not m["pass"]), None)
    result["first_failing"] = first["name"] if first else None
    result["pass"] = all(o["pass"] for o in result["outputs"])
    result["samples"] = len(samples)
    return result


def _first_and_sums(samples, source, model, shapes, backend, min_cosine, max_abs, threads, allow_io) -> list:
    """For each sample, (its own result, {tensor: Sums} of source against .mnn)."""
    out = []
    for sample in samples:
        r, ref, ours = _verify_one(source, model, sample, shapes, backend, min_cosine, max_abs, threads, allow_io)
        out.append((r, {k: Sums.of(v, ours[k]) for k, v in ref.items() if k in ours}))
    return out


def _verify_one(source, model, feeds, shapes, backend, min_cosine, max_abs, threads, allow_io):
    source, model = Path(source), Path(model)
    if not source.exists():
        raise MnnToolError(f"{source}: no such file")
    g = reader.load(model)
    for name, shape in (shapes or {}).items():
        if name in g.tensors:
            g.tensors[name].shape = tuple(shape)
    feeds = dict(feeds) if feeds else random_feeds(g, shapes)
    for name in g.inputs:
        if name not in feeds:
            raise MnnToolError(f"no data for input '{name}'")
        if tuple(feeds[name].shape) != tuple(g.tensors[name].shape or feeds[name].shape) and \
                all(isinstance(d, int) and d > 0 for d in g.tensors[name].shape or ()):
            raise MnnToolError(f"input '{name}' has shape {list(feeds[name].shape)}, the model wants "
                               f"{list(g.tensors[name].shape)}")
    shapes = {k: tuple(v.shape) for k, v in feeds.items()}
    ref, order = reference_runner(source, shapes, allow_io).run_all(feeds)
    runner = backend_runner(model, backend, threads, {k: shapes[k] for k in g.inputs}) \
        if backend != "onnxruntime" else None
    if runner is None:
        raise MnnToolError("verify compares the .mnn file: --backend numba or mnn")
    ours, _ = runner.run_all({k: feeds[k] for k in g.inputs}, [n for n, _ in order])
    used_backend = runner.name
    producer = {o: n.op for n in g.nodes for o in n.outputs}
    layers, unmatched = [], []
    for name, op_type in order:
        if name not in ref:
            continue
        if name not in ours:
            unmatched.append({"name": name, "op": op_type})
            continue
        a, b = np.asarray(ref[name]), np.asarray(ours[name])
        if a.size != b.size:
            unmatched.append({"name": name, "op": op_type, "reason": f"shape {list(a.shape)} vs {list(b.shape)}"})
            continue
        m = metrics(a.astype(np.float64), b.reshape(a.shape).astype(np.float64))
        m.update(name=name, op=op_type, mnn_op=producer.get(name, "?"), shape=list(a.shape))
        m["pass"] = m["cosine"] >= min_cosine and (max_abs is None or m["max_abs"] <= max_abs)
        layers.append(m)
    first = next((m for m in layers if not m["pass"]), None)
    outputs = []
    for name in g.outputs:
        if name not in ref:
            raise MnnToolError(f"{model}: output '{name}' is not a tensor of {source}")
        if name not in ours:
            raise MnnToolError(f"{model}: the runtime did not produce output '{name}'")
        a = np.asarray(ref[name])
        m = metrics(a.astype(np.float64), np.asarray(ours[name]).reshape(a.shape).astype(np.float64))
        m["name"] = name
        m["pass"] = m["cosine"] >= min_cosine and (max_abs is None or m["max_abs"] <= max_abs)
        outputs.append(m)
    result = {"source": str(source), "model": str(model), "backend": used_backend, "min_cosine": min_cosine,
              "max_abs": max_abs, "samples": 1, "outputs": outputs, "layers": layers, "unmatched": unmatched,
              "first_failing": first["name"] if first else None, "pass": all(o["pass"] for o in outputs)}
    matched = {m["name"] for m in layers} | set(g.outputs)
    return (result, {k: v for k, v in ref.items() if k in matched},
            {k: v for k, v in ours.items() if k in matched})


def html_report(r: dict) -> str:
    """One self-contained page: verdict, final outputs, a cosine-per-layer chart with labelled axes,
    the layer table and the tensors without a counterpart. Jinja2 escapes every value (names come from
    the model file)."""
    from importlib.resources import files

    from jinja2 import Environment, select_autoescape
    env = Environment(autoescape=select_autoescape(default=True, default_for_string=True))
    page = env.from_string(files("mnntool").joinpath("templates/verify.html").read_text())
    return page.render(r=r, chart=_chart(r))


def _chart(r: dict, width: int = 900, height: int = 260) -> dict:
    """Cosine per matched layer as polyline points, on axes from the lowest cosine (or the threshold) to 1."""
    layers = r["layers"]
    left, right, top, bottom = 70, 20, 10, 45
    lo = min([m["cosine"] for m in layers] + [r["min_cosine"], 0.999])
    lo = max(lo, -1.0)

    def y(c):
        return top + (height - top - bottom) * (1 - (c - lo) / max(1 - lo, 1e-12))
    n = len(layers)
    xs = [left + (width - left - right) * (k / max(n - 1, 1)) for k in range(n)]
    ticks = [lo + (1 - lo) * f for f in (0, 0.25, 0.5, 0.75, 1)]
    return {"width": width, "height": height, "left": left, "right": width - right, "top": top,
            "base": height - bottom, "threshold_y": y(r["min_cosine"]),
            "points": " ".join(f"{x:.1f},{y(m['cosine']):.1f}" for x, m in zip(xs, layers)),
            "yticks": [(y(t), f"{t:.5f}") for t in ticks],
            "xticks": [(xs[k], k) for k in sorted({0, n // 2, n - 1})] if n else [],
            "fails": [(xs[k], y(m["cosine"])) for k, m in enumerate(layers) if not m["pass"]]}
