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

from .compare import metrics
from .errors import MnnToolError
from .format import reader
from .inputs import random_feeds
from .runners import backend_runner, reference_runner


def verify(source, model, feeds: dict | list | None = None, shapes: dict | None = None, backend: str = "numba",
           min_cosine: float = 0.999, max_abs: float | None = None, threads: int | None = None,
           allow_io: bool = False) -> dict:
    """Per-layer metrics over one sample (a dict) or several (a list of dicts, metrics over all of them).
    The source runs in its own framework, its code with it: TensorFlow graphs with file or Python ops are
    refused unless `allow_io`."""
    samples = feeds if isinstance(feeds, list) else [feeds]
    merged_ref, merged_ours, result = {}, {}, None
    for sample in samples:
        r, ref, ours = _verify_one(source, model, sample, shapes, backend, min_cosine, max_abs, threads, allow_io)
        result = result or r
        for k, v in ref.items():
            merged_ref.setdefault(k, []).append(np.asarray(v).ravel())
        for k, v in ours.items():
            merged_ours.setdefault(k, []).append(np.asarray(v).ravel())
    if len(samples) == 1:
        return result
    for m in result["layers"] + result["outputs"]:
        a = np.concatenate(merged_ref[m["name"]]).astype(np.float64)
        b = np.concatenate(merged_ours[m["name"]]).astype(np.float64)
        keep = {k: m[k] for k in ("name", "op", "mnn_op", "shape") if k in m}
        m.clear()
        m.update(metrics(a, b), **keep)
        m["pass"] = m["cosine"] >= min_cosine and (max_abs is None or m["max_abs"] <= max_abs)
    first = next((m for m in result["layers"] if not m["pass"]), None)
    result["first_failing"] = first["name"] if first else None
    result["pass"] = all(o["pass"] for o in result["outputs"])
    result["samples"] = len(samples)
    return result


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
    """One self-contained page: verdict, a cosine-per-layer chart and the full layer table."""
    import html
    layers = r["layers"]
    width, height = 900, 220
    pts = []
    lo = min([m["cosine"] for m in layers] + [r["min_cosine"]]) if layers else 0.99
    lo = min(lo, 0.999)
    for k, m in enumerate(layers):
        x = 40 + (width - 60) * (k / max(len(layers) - 1, 1))
        y = 10 + (height - 40) * (1 - (m["cosine"] - lo) / max(1 - lo, 1e-12))
        pts.append(f"{x:.1f},{y:.1f}")
    thr_y = 10 + (height - 40) * (1 - (r["min_cosine"] - lo) / max(1 - lo, 1e-12))
    rows = []
    for m in layers:
        cls = "bad" if not m["pass"] else ""
        mark = " &#9664; first failing" if m["name"] == r["first_failing"] else ""
        rows.append(f"<tr class='{cls}'><td>{html.escape(m['name'])}{mark}</td><td>{m['op']}</td><td>{m['mnn_op']}</td>"
                    f"<td>{m['cosine']:.6f}</td><td>{m['max_abs']:.3g}</td><td>{m['rel_l2']:.3g}</td>"
                    f"<td>{m['snr_db']:.1f}</td></tr>")
    verdict = "PASS" if r["pass"] else "FAIL"
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>mnntool verify: {html.escape(r['model'])}</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse}} td,th{{padding:2px 8px;
border-bottom:1px solid #ddd;font-size:13px}} tr.bad td{{background:#fdd}} .v{{font-size:22px;font-weight:bold;
color:{'#080' if r['pass'] else '#c00'}}}</style></head><body>
<h2>{html.escape(r['model'])} vs {html.escape(r['source'])}</h2>
<p class="v">{verdict}</p><p>backend {r['backend']}, threshold cosine &ge; {r['min_cosine']}; {len(layers)} layers
matched, {len(r['unmatched'])} without a counterpart; first failing: {html.escape(str(r['first_failing']))}</p>
<svg width="{width}" height="{height}" style="border:1px solid #ccc"><polyline fill="none" stroke="#36c"
stroke-width="1.5" points="{' '.join(pts)}"/><line x1="40" x2="{width - 20}" y1="{thr_y:.1f}" y2="{thr_y:.1f}"
stroke="#c00" stroke-dasharray="4"/><text x="4" y="14" font-size="11">1.0</text>
<text x="4" y="{height - 30}" font-size="11">{lo:.4f}</text></svg>
<table><tr><th>tensor</th><th>source op</th><th>mnn op</th><th>cosine</th><th>max abs</th><th>rel L2</th>
<th>SNR dB</th></tr>{''.join(rows)}</table></body></html>"""
