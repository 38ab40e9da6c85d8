"""Which layer broke it? Compare every tensor of a .mnn model with its source model, layer by layer.

The source runs on its framework's runner (runners/: onnxruntime for ONNX and OpenCV for Caffe with
every intermediate tensor exposed, torch and TensorFlow for their final outputs); the .mnn on
mnntool's runtime keeping every tensor (or, with backend "mnn", on the real MNN runtime, asked for the
same tensors by name). Tensors are matched by name: passes
keep the name of the last tensor of what they fuse, so fused-away tensors are listed as unmatched. Tensors
int8 equalization divided per channel (quant/equalize.py) carry the suffix "/equalized": they count as
paired for the same-model rule and are listed under "rescaled", not compared (their values differ by design).

Verdict (`result["exit_code"]`, what `mnntool verify` exits with):
  0  every output and every compared layer meets the thresholds (outputs only with `outputs_only`);
  1  an output, or a compared layer, misses them;
  3  not the same model: an output of the .mnn is not a tensor of the source or has another size, or the
     source exposes its intermediate tensors (ONNX, Caffe) and fewer than min(2, N, S), or under 10% of
     N, of the tensors of the .mnn match a tensor of the source by name; N is the number of tensors the
     .mnn's ops compute (layout conversions aside), S the source's tensors (SAME_MODEL_MIN_LAYERS,
     SAME_MODEL_MIN_FRACTION).
(2, a user error, is any MnnToolError.)
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .compare import Sums, metrics
from .errors import MnnToolError
from .format import reader
from .inputs import random_feeds
from .runners import backend_runner, reference_runner

SCHEMA = "mnntool.verify/2"        # the JSON report's layout; bumped when a key changes meaning
SAME_MODEL_MIN_LAYERS = 2
SAME_MODEL_MIN_FRACTION = 0.10
EXIT_PASS, EXIT_ACCURACY, EXIT_USER, EXIT_NOT_SAME_MODEL = 0, 1, 2, 3


class NotSameModel(MnnToolError):
    """The .mnn file and the source are not the same model (exit code 3)."""

    def __init__(self, message: str):
        super().__init__(message, code=EXIT_NOT_SAME_MODEL)


def verify(source, model, feeds: dict | list | None = None, shapes: dict | None = None, backend: str = "numba",
           min_cosine: float = 0.999, max_abs: float | None = None, threads: int | None = None,
           allow_io: bool = False, progress=None, workers: int = 1, ray: str | None = None,
           outputs_only: bool = False, seed: int = 0, inputs: dict | None = None,
           save_outputs: str | Path | None = None, thresholds: dict | None = None) -> dict:
    """Per-layer metrics over one sample (a dict) or several (a list of dicts, metrics over all of them,
    from per-sample sums merged in sample order: the same numbers for any `workers`, the local
    processes the samples are split over, or Ray tasks with `ray` an address as quant's --ray). The
    source runs in its own framework, its code with it: TensorFlow graphs with file or Python ops are
    refused unless `allow_io`.

    `result["pass"]` needs every output and every compared layer to pass (the outputs only with
    `outputs_only`); `result["exit_code"]` is the CLI's verdict (see the module's docstring).
    Without `feeds` the inputs are normal random numbers drawn with `seed`; `inputs` describes where
    given feeds came from (the report carries it). `save_outputs`: a folder receiving the source
    framework's outputs of sample k as NNNN/NAME.npy (golden outputs). `thresholds` (see
    `load_thresholds`) sets limits per output and per layer over `min_cosine`/`max_abs`."""
    samples = feeds if isinstance(feeds, list) else [feeds]
    if inputs is None:
        inputs = {"kind": "random", "distribution": "normal(0, 1); integer inputs uniform in [0, 100)",
                  "seed": seed} if feeds is None else {"kind": "given"}
    if thresholds:      # the file's defaults replace the arguments'
        min_cosine = thresholds.get("default", {}).get("min_cosine", min_cosine)
        max_abs = thresholds.get("default", {}).get("max_abs", max_abs)
    args = (source, model, shapes, backend, min_cosine, max_abs, threads, allow_io, seed, save_outputs is not None)
    if len(samples) == 1:
        result, ref, _ = _verify_one(source, model, samples[0], *args[2:-1])
        if save_outputs is not None:
            _save_outputs(save_outputs, [{k: ref[k] for k in result["output_names"]}])
        return _finish(result, min_cosine, outputs_only, inputs, thresholds)
    if workers > 1 or ray is not None:
        from .quant.shards import pool, split_map
        with pool(workers, ray) as shards:
            parts = split_map(shards, _first_and_sums, samples, *args)
        result, per_sample = parts[0][0], [sums for _, sums, _ in parts]
        golden = [outs for _, _, outs in parts]
        if progress:
            progress(len(samples))
    else:
        result, per_sample, golden = None, [], []
        for sample in samples:
            r, sums, outs = _first_and_sums([sample], *args)[0]
            result = result or r
            per_sample.append(sums)
            golden.append(outs)
            if progress:
                progress(1)
    if save_outputs is not None:
        _save_outputs(save_outputs, golden)
    for m in result["layers"] + result["outputs"]:
        total = Sums.total(sums[m["name"]] for sums in per_sample)
        keep = {k: m[k] for k in ("name", "op", "mnn_op", "shape") if k in m}
        m.clear()
        m.update(total.metrics(), **keep)
        m["pass"] = m["cosine"] >= min_cosine and (max_abs is None or m["max_abs"] <= max_abs)
    result["samples"] = len(samples)
    return _finish(result, min_cosine, outputs_only, inputs, thresholds)


def load_thresholds(path) -> dict:
    """A thresholds file (.json or .toml): defaults, then per output by name, then per layer by pattern
    (fnmatch on the tensor name, the first that matches wins); an output's own entry also rules its
    row among the layers. Keys: min_cosine, max_abs.

        min_cosine = 0.999
        [outputs.logits]
        min_cosine = 0.995
        [[layers]]
        match = "/features/features.0/*"
        min_cosine = 0.98
    """
    import json
    import tomllib
    path = Path(path)
    if not path.is_file():
        raise MnnToolError(f"--thresholds {path}: no such file")
    try:
        data = tomllib.loads(path.read_text()) if path.suffix.lower() == ".toml" else json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise MnnToolError(f"--thresholds {path}: not valid {'TOML' if path.suffix.lower() == '.toml' else 'JSON'} "
                           f"({' '.join(str(e).split())[:120]})") from None
    if not isinstance(data, dict):
        raise MnnToolError(f"--thresholds {path}: expected an object/table at the top")

    def limits(d, where) -> dict:
        if not isinstance(d, dict):
            raise MnnToolError(f"--thresholds {path}: {where} must be an object/table")
        bad = set(d) - {"min_cosine", "max_abs", "match"}
        if bad:
            raise MnnToolError(f"--thresholds {path}: {where}: unknown key(s) {', '.join(sorted(bad))} "
                               "(min_cosine, max_abs)")
        out = {}
        for k in ("min_cosine", "max_abs"):
            if k in d:
                v = d[k]
                if isinstance(v, bool) or not isinstance(v, (int, float)) or \
                        not (0.0 <= v <= 1.0 if k == "min_cosine" else v >= 0.0):
                    raise MnnToolError(f"--thresholds {path}: {where}: {k} {v!r} must be "
                                       f"{'in [0, 1]' if k == 'min_cosine' else 'at least 0'}")
                out[k] = float(v)
        return out
    bad = set(data) - {"min_cosine", "max_abs", "outputs", "layers"}
    if bad:
        raise MnnToolError(f"--thresholds {path}: unknown key(s) {', '.join(sorted(bad))} "
                           "(min_cosine, max_abs, outputs, layers)")
    outputs = data.get("outputs", {})
    layers = data.get("layers", [])
    if not isinstance(outputs, dict) or not isinstance(layers, list):
        raise MnnToolError(f"--thresholds {path}: 'outputs' is a table by output name, 'layers' a list")
    rules = []
    for k, d in enumerate(layers):
        if not isinstance(d, dict) or not isinstance(d.get("match"), str):
            raise MnnToolError(f"--thresholds {path}: layers[{k}] needs a 'match' pattern")
        rules.append({"match": d["match"], **limits(d, f"layers[{k}]")})
    return {"default": limits({k: data[k] for k in ("min_cosine", "max_abs") if k in data}, "the top"),
            "outputs": {name: limits(d, f"outputs.{name}") for name, d in outputs.items()}, "layers": rules,
            "file": str(path)}


def _limits(thresholds: dict | None, name: str, min_cosine: float, max_abs: float | None) -> tuple:
    from fnmatch import fnmatchcase
    if not thresholds:
        return min_cosine, max_abs
    lim = {"min_cosine": min_cosine, "max_abs": max_abs, **thresholds.get("default", {})}
    own = thresholds.get("outputs", {}).get(name)
    if own is None:
        own = next((r for r in thresholds.get("layers", []) if fnmatchcase(name, r["match"])), {})
    lim.update({k: v for k, v in own.items() if k != "match"})
    return lim["min_cosine"], lim["max_abs"]


def _finish(result: dict, min_cosine: float, outputs_only: bool, inputs: dict, thresholds: dict | None = None) -> dict:
    """The verdict over the (merged) metrics: first failing layer, pass, exit code, report metadata."""
    from . import __version__
    if thresholds:
        unknown = set(thresholds.get("outputs", {})) - set(result["output_names"])
        if unknown:
            raise MnnToolError(f"--thresholds {thresholds.get('file', '')}: {', '.join(sorted(unknown))} is not an "
                               f"output of {result['model']} (outputs: {', '.join(result['output_names'])})")
        for m in result["layers"] + result["outputs"]:
            c, a = _limits(thresholds, m["name"], min_cosine, result["max_abs"])
            m["pass"] = m["cosine"] >= c and (a is None or m["max_abs"] <= a)
            if (c, a) != (min_cosine, result["max_abs"]):
                m["limits"] = {"min_cosine": c, "max_abs": a}
        result["thresholds"] = thresholds
    first = next((m for m in result["layers"] if not m["pass"]), None)
    result["first_failing"] = first["name"] if first else None
    result["failing_layers"] = sum(not m["pass"] for m in result["layers"])
    result["outputs_pass"] = all(o["pass"] for o in result["outputs"])
    result["layers_pass"] = first is None
    result["outputs_only"] = outputs_only
    result["pass"] = result["outputs_pass"] and (outputs_only or result["layers_pass"])
    same = result["match"]["same_model"]
    result["exit_code"] = EXIT_NOT_SAME_MODEL if not same else (EXIT_PASS if result["pass"] else EXIT_ACCURACY)
    if not same:
        result["pass"] = False
    result["inputs"] = inputs
    result.pop("output_names", None)
    head = {"schema": SCHEMA, "mnntool_version": __version__}
    rest = {k: v for k, v in result.items() if k not in head}
    result.clear()
    result.update(head, **rest)
    return result


def _save_outputs(folder, golden: list[dict]) -> None:
    """Golden outputs: sample k's output NAME as FOLDER/NNNN/NAME.npy ('/' in names as '_')."""
    import io

    from .format.writer import atomic_write
    folder = Path(folder)
    for k, outs in enumerate(golden):
        d = folder / f"{k:04d}"
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise MnnToolError(f"--save-outputs {folder}: cannot create the folder ({e.strerror or e})") from None
        for name, arr in outs.items():
            buf = io.BytesIO()
            np.save(buf, np.asarray(arr))
            atomic_write(d / f"{name.replace('/', '_')}.npy", buf.getvalue())


def save_inputs(folder, samples: list[dict]) -> None:
    """Sample k as FOLDER/NNNN.npz, an array per input by name: what --load-inputs (or --calib, or
    --input FILE.npz for one sample) reads back."""
    import io

    from .format.writer import atomic_write
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise MnnToolError(f"--save-inputs {folder}: cannot create the folder ({e.strerror or e})") from None
    for k, sample in enumerate(samples):
        buf = io.BytesIO()
        np.savez(buf, **{name: np.asarray(v) for name, v in sample.items()})
        atomic_write(folder / f"{k:04d}.npz", buf.getvalue())


def _first_and_sums(samples, source, model, shapes, backend, min_cosine, max_abs, threads, allow_io, seed=0,
                    keep_outputs=False) -> list:
    """For each sample, (its own result, {tensor: Sums} of source against .mnn, the source's outputs
    when `keep_outputs` else None)."""
    out = []
    for sample in samples:
        r, ref, ours = _verify_one(source, model, sample, shapes, backend, min_cosine, max_abs, threads, allow_io,
                                   seed)
        outs = {k: ref[k] for k in r["output_names"]} if keep_outputs else None
        out.append((r, {k: Sums.of(v, ours[k]) for k, v in ref.items() if k in ours}, outs))
    return out


def _verify_one(source, model, feeds, shapes, backend, min_cosine, max_abs, threads, allow_io, seed=0):
    source, model = Path(source), Path(model)
    if not source.exists():
        raise MnnToolError(f"{source}: no such file")
    g = reader.load(model)
    for name, shape in (shapes or {}).items():
        if name in g.tensors:
            g.tensors[name].shape = tuple(shape)
    feeds = dict(feeds) if feeds else random_feeds(g, shapes, seed)
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
    layers, unmatched, rescaled = [], [], []
    from .quant.equalize import EQUALIZED
    for name, op_type in order:
        if name not in ref:
            continue
        if name not in ours:
            if name + EQUALIZED in producer:    # int8 equalization divided it per channel: paired, not compared
                rescaled.append({"name": name, "op": op_type, "model_name": name + EQUALIZED})
            else:
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
            raise NotSameModel(f"{model}: output '{name}' is not a tensor of {source}: not the same model")
        if name not in ours:
            raise MnnToolError(f"{model}: the runtime did not produce output '{name}'")
        a = np.asarray(ref[name])
        if a.size != np.asarray(ours[name]).size:
            raise NotSameModel(f"{model}: output '{name}' has shape {list(np.shape(ours[name]))}, "
                               f"{list(a.shape)} in {source}: not the same model")
        m = metrics(a.astype(np.float64), np.asarray(ours[name]).reshape(a.shape).astype(np.float64))
        m["name"] = name
        m["pass"] = m["cosine"] >= min_cosine and (max_abs is None or m["max_abs"] <= max_abs)
        outputs.append(m)
    computed = {o for n in g.nodes if n.op != "ConvertTensor" for o in n.outputs} - set(g.inputs)
    inner = [n for n, _ in order if n in ref and n not in g.outputs]
    need = min(SAME_MODEL_MIN_LAYERS, len(computed), len(inner) + len(g.outputs))
    paired = len(layers) + len(rescaled)
    same = not inner or (paired >= need and paired >= SAME_MODEL_MIN_FRACTION * len(computed))
    match = {"layers": len(layers), "rescaled": len(rescaled), "mnn_tensors": len(computed),
             "source_tensors": len(inner) + len(outputs),
             "same_model": same,
             "rule": f"the source exposes its layers, so at least min({SAME_MODEL_MIN_LAYERS}, N, S) and "
                     f"{SAME_MODEL_MIN_FRACTION:.0%} of the N tensors the .mnn's ops compute (layout "
                     f"conversions aside) must match one of the S tensors of the source by name"
                     if inner else "the source exposes its outputs only: outputs must match by name and size"}
    result = {"source": str(source), "model": str(model), "backend": used_backend, "min_cosine": min_cosine,
              "max_abs": max_abs, "samples": 1, "outputs": outputs, "layers": layers, "unmatched": unmatched,
              "rescaled": rescaled,
              "match": match, "output_names": list(g.outputs),
              "first_failing": first["name"] if first else None, "pass": all(o["pass"] for o in outputs)}
    matched = {m["name"] for m in layers} | set(g.outputs)
    return (result, {k: v for k, v in ref.items() if k in matched},
            {k: v for k, v in ours.items() if k in matched})


def inputs_text(inputs: dict | None) -> str:
    """One line saying which inputs the comparison used."""
    inputs = inputs or {"kind": "given"}
    kind = inputs.get("kind")
    if kind == "random":
        return f"random inputs: {inputs.get('distribution', 'normal(0, 1)')}, seed {inputs.get('seed', 0)}"
    if kind == "files":
        return "input files: " + ", ".join(map(str, inputs.get("files", [])))
    if kind == "calibration":
        return f"calibration samples: {inputs.get('samples', '?')} from {inputs.get('folder', '?')}"
    return "inputs given by the caller"


def verdict_text(r: dict) -> str:
    """Why the run passed or failed, in one sentence."""
    if r.get("exit_code") == EXIT_NOT_SAME_MODEL:
        m = r.get("match", {})
        return (f"NOT THE SAME MODEL: {m.get('layers', 0)} of the {m.get('mnn_tensors', 0)} tensors of the .mnn "
                f"match a tensor of the source ({m.get('rule', '')})")
    bad_out = [o["name"] for o in r["outputs"] if not o["pass"]]
    bad_layers = r.get("failing_layers", sum(not m["pass"] for m in r["layers"]))
    if r["pass"]:
        extra = f" ({bad_layers} layer(s) below the threshold ignored: --outputs-only)" if bad_layers else ""
        return f"PASS: every output{'' if r.get('outputs_only') else ' and every compared layer'} meets the " \
               f"thresholds{extra}"
    parts = []
    if bad_out:
        parts.append(f"{len(bad_out)} of {len(r['outputs'])} output(s)")
    if bad_layers and not r.get("outputs_only"):
        parts.append(f"{bad_layers} of {len(r['layers'])} compared layer(s)")
    return "FAIL: " + " and ".join(parts) + " below the thresholds"


def html_report(r: dict) -> str:
    """One self-contained page: verdict, final outputs, a cosine-per-layer chart with labelled axes,
    the layer table and the tensors without a counterpart. Jinja2 escapes every value (names come from
    the model file)."""
    from importlib.resources import files

    from jinja2 import Environment, select_autoescape
    env = Environment(autoescape=select_autoescape(default=True, default_for_string=True))
    page = env.from_string(files("mnntool").joinpath("templates/verify.html").read_text())
    return page.render(r=r, chart=_chart(r), inputs=inputs_text(r.get("inputs")), verdict=verdict_text(r))


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
