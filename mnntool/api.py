"""The Python API behind the CLI: convert, inspect and load models."""
from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import numpy as np

from .errors import MnnToolError
from .format import writer
from .format.flatbuf import decode
from .ir.validate import validate
from .ir.shape_inference import flops, infer_shapes
from .loading import load_graph
from .passes import run_pipeline


def parse_input_shapes(specs) -> dict[str, tuple[int, ...]]:
    """'name:1x3x224x224' (several allowed) -> {name: (1, 3, 224, 224)}."""
    out = {}
    for spec in specs or []:
        name, sep, dims = spec.rpartition(":")
        try:
            shape = tuple(int(d) for d in dims.lower().split("x"))
            if not sep or not name or any(d <= 0 for d in shape):
                raise ValueError
        except ValueError:
            raise MnnToolError(f"--input-shape '{spec}': expected NAME:D1xD2x... with positive sizes") from None
        out[name] = shape
    return out


def load_session(path, threads: int | None = None):
    """A runtime session for any model file mnntool reads (.mnn directly, sources through their frontend)."""
    from .runtime.session import Session
    return Session(load_graph(path), threads)


def convert(src, dst, framework: str | None = None, input_shapes: dict | None = None, optimize: int = 1,
            biz_code: str = "mnntool", passes: list[str] | None = None, external_weights: bool | None = None,
            exact_gelu: bool = False) -> dict:
    """external_weights: True writes dst + dst.weight (MNN's --saveExternalData layout); None does so when
    the weights pass 2000 MB, as MNN's converter does. exact_gelu keeps GELU's erf form (MNN computes it
    ~40x slower than the tanh form its converter and ours write by default: passes/approximate_gelu.py)."""
    t0 = time.perf_counter()
    dst = Path(dst)
    sources = _sources(src)
    writer.check_output(dst, sources)      # fail before the (slow) conversion, not only at the write
    g = load_graph(src, framework, input_shapes)
    if passes is not None:      # MNN needs these, last, whatever else was chosen
        from .passes import LOWERING, REQUIRED
        passes = LOWERING + [p for p in passes if p not in REQUIRED + LOWERING] + REQUIRED
    if exact_gelu:
        from .passes import resolve
        passes = [p for p in resolve(optimize, passes) if p != "approximate_gelu"]
    report = run_pipeline(g, optimize, passes)
    if g.int8_plan:
        from .quant.ptq import apply_int8_plan
        apply_int8_plan(g)
    validate(g, str(src))
    params = g.param_count()
    written = writer.write(g, dst, biz_code, sources, consume=True, external=external_weights)
    return {"source": str(src), "output": str(dst), "weight_file": written["weight_file"], "ops": len(g.nodes),
            "params": params, "size_bytes": written["bytes"], "passes_changed": list(report), "passes": report,
            "optimize": optimize, "seconds": round(time.perf_counter() - t0, 3)}


def _sources(src) -> list[Path]:
    """The files a conversion reads (a .prototxt's .caffemodel beside it, a SavedModel's files): none of
    them may be the output."""
    src = Path(src)
    out = [src]
    if src.suffix.lower() == ".mnn":
        out.append(writer.weight_path(src))
    if src.suffix.lower() == ".prototxt":
        out.append(src.with_suffix(".caffemodel"))
    if src.is_dir():
        out += [p for p in src.rglob("*") if p.is_file()][:1000]
    return out


def _shape_str(shape) -> list | None:
    return None if shape is None else [d if isinstance(d, int) else str(d) for d in shape]


def info(path, framework: str | None = None, input_shapes: dict | None = None) -> dict:
    path = Path(path)
    g = load_graph(path, framework, input_shapes)
    vals = infer_shapes(g)
    return {
        "file": str(path), "format": "mnn" if path.suffix.lower() == ".mnn" else (framework or path.suffix[1:]),
        "size_bytes": path.stat().st_size + (Path(g.weight_file).stat().st_size if g.weight_file else 0),
        "weight_file": g.weight_file,
        "inputs": [{"name": n, "shape": _shape_str(g.tensors[n].shape), "dtype": g.tensors[n].dtype} for n in g.inputs],
        "outputs": [{"name": n, "shape": _shape_str(g.info(n).shape), "dtype": g.info(n).dtype} for n in g.outputs],
        "ops": len(g.nodes), "op_counts": dict(Counter(n.op for n in g.nodes).most_common()),
        "const_tensors": len(g.constants), "params": g.param_count(), "flops": flops(g, vals),
    }


def _jsonable(obj):
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def dump_json(path, out, framework: str | None = None, input_shapes: dict | None = None) -> None:
    """The whole model as JSON, like MNN's --JsonFile (the Net table, field names as in the schema)."""
    path = Path(path)
    writer.check_output(out, _sources(path))     # refused before the conversion, not only at the write
    if path.suffix.lower() == ".mnn" and framework is None:
        net = decode(path.read_bytes(), "Net")
    else:
        g = load_graph(path, framework, input_shapes)
        run_pipeline(g, 1)
        net = writer.graph_to_net(g)
    writer.atomic_write(out, json.dumps(_jsonable(net), indent=1).encode(), _sources(path))
