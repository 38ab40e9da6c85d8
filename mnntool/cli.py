"""The mnntool command line: parses options, calls mnntool.api, prints with rich."""
from __future__ import annotations

import json
import os
import sys
from typing import List, Optional

from .threadpool import tune_process

tune_process()      # before numpy and Numba load (see mnntool.threadpool)

import typer  # noqa: E402
from rich.table import Table  # noqa: E402

from . import api  # noqa: E402
from .cli_common import (  # noqa: E402
    EXTERNAL_WEIGHTS, FORMAT, FRAMEWORK, INPUT_SHAPE, INPUTS, JSON, MEAN, NORMAL, SAMPLES, SIZE, STD, THREADS,
    BenchBackend, Runtime, _human, _progress, console, err, u)
from .errors import MnnToolError  # noqa: E402

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Convert, optimize, quantize, check and time models in MNN's .mnn format.")


def _floats(text: str | None, what: str):
    if text is None:
        return None
    try:
        vals = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise MnnToolError(f"{what} '{text}': expected comma-separated numbers") from None
    return vals * 3 if len(vals) == 1 else vals


def _image_prep(mean, normal, size, fmt, std=None):
    from .quant.data import ImagePrep
    if fmt.upper() not in ("RGB", "BGR", "GRAY"):
        raise MnnToolError(f"--format {fmt}: expected RGB, BGR or GRAY")
    norm = _floats(normal, "--normal")
    if std is not None:
        s = _floats(std, "--std")
        if any(v == 0 for v in s):
            raise MnnToolError("--std must not contain 0")
        norm = tuple(1.0 / v for v in s)
    wh = None
    if size:
        try:
            w, h = (int(v) for v in size.lower().split("x"))
            wh = (w, h)
        except ValueError:
            raise MnnToolError(f"--size '{size}': expected WxH") from None
    return ImagePrep(mean=_floats(mean, "--mean") or (0.0, 0.0, 0.0), normal=norm or (1.0, 1.0, 1.0), size=wh,
                     fmt=fmt.upper())


@app.command()
def convert(src: Optional[str] = typer.Argument(None, help="Source model: .onnx, .pt2 (torch.export), .pt "
                                                               "(TorchScript), .prototxt "
                                                               "(Caffe), .pb / .keras / .h5 / SavedModel dir (TensorFlow), .tflite."),
            dst: Optional[str] = typer.Argument(None, help="Output .mnn file."),
            framework: Optional[str] = FRAMEWORK, input_shape: Optional[List[str]] = INPUT_SHAPE,
            optimize: int = typer.Option(1, "--optimize", "-O", min=0, max=2,
                                         help="0: as imported (+layout), 1: default passes, 2: to a fixed point."),
            passes: Optional[str] = typer.Option(None, "--passes",
                                                 help="Comma-separated passes to run instead, or 'list'."),
            biz_code: str = typer.Option("mnntool", "--biz-code", help="Free string stored in the file."),
            external_weights: bool = EXTERNAL_WEIGHTS,
            exact_gelu: bool = typer.Option(False, "--exact-gelu",
                                            help="Keep GELU's erf form (MNN computes it ~40x slower than the tanh "
                                                 "form written by default, as MNN's converter does; they differ "
                                                 "by at most 4.7e-4)."),
            as_json: bool = JSON):
    """Convert a model into MNN's .mnn format."""
    from .passes import DOCS, PIPELINES
    if passes == "list" or src == "passes":
        if as_json:
            print(json.dumps({"passes": DOCS, "levels": PIPELINES}))
            return
        t = Table(title="passes (default order: -O1)")
        t.add_column("pass")
        t.add_column("what it does")
        for name in PIPELINES[1]:
            t.add_row(name, DOCS[name])
        console.print(t)
        return
    if src is None:
        raise MnnToolError("convert needs a source model (or --passes list)")
    if dst is None:
        raise MnnToolError("convert needs SRC and DST")
    chosen = [p.strip() for p in passes.split(",") if p.strip()] if passes else None
    r = api.convert(src, dst, framework, api.parse_input_shapes(input_shape), optimize, biz_code, chosen,
                    external_weights or None, exact_gelu=exact_gelu)
    if as_json:
        print(json.dumps(r))
    else:
        weights = f" + {u(r['weight_file'])}" if r["weight_file"] else ""
        console.print(f"[green]converted[/] {u(src)} -> {u(dst)}{weights}: {r['ops']} ops, {_human(r['params'])} "
                      f"params, {_human(r['size_bytes'], 'B')} in {r['seconds']:.2f}s")
        for name, ch in r["passes"].items():
            removed = ", ".join(f"-{n} {op}" for op, n in ch["removed"].items())
            added = ", ".join(f"+{n} {op}" for op, n in ch["added"].items())
            console.print(f"  {name}: {ch['ops_before']} -> {ch['ops_after']} ops  {removed} {added}".rstrip())


@app.command()
def info(path: str = typer.Argument(..., help="A .mnn or .onnx model."),
         framework: Optional[str] = FRAMEWORK, input_shape: Optional[List[str]] = INPUT_SHAPE,
         dump_json: Optional[str] = typer.Option(None, "--dump-json", help="Write the whole model as JSON."),
         quant: bool = typer.Option(False, "--quant", help="Show the file's quantization instead: per layer the "
                                    "kind, bits, symmetry, block, scales; int8 tensors' grids (a .mnn)."),
         as_json: bool = JSON):
    """Show inputs, outputs, op counts, parameters, FLOPs and size."""
    if quant:
        return _quant_info(path, as_json)
    shapes = api.parse_input_shapes(input_shape)
    r = api.info(path, framework, shapes)
    if dump_json:
        api.dump_json(path, dump_json, framework, shapes)
    if as_json:
        print(json.dumps(r))
        return
    t = Table(title=f"{u(path)}  ({_human(r['size_bytes'], 'B')}, {r['ops']} ops, {_human(r['params'])} params, "
                    f"{_human(r['flops'], 'FLOP')})")
    t.add_column("tensor")
    t.add_column("name")
    t.add_column("shape")
    t.add_column("dtype")
    for kind in ("inputs", "outputs"):
        for x in r[kind]:
            t.add_row(kind[:-1], u(x["name"]), "x".join(map(str, x["shape"])) if x["shape"] is not None else "?", x["dtype"])
    console.print(t)
    ops = Table(title="op counts")
    ops.add_column("op")
    ops.add_column("count", justify="right")
    for op, n in r["op_counts"].items():
        ops.add_row(u(op), str(n))
    console.print(ops)


def _quant_info(path: str, as_json: bool) -> None:
    from .format import reader as mnn_reader
    from .quant.describe import describe
    if not path.lower().endswith(".mnn"):
        raise MnnToolError(f"{path}: --quant reads a .mnn file's quantization (convert and quant write them)")
    r = {"model": path, **describe(mnn_reader.load(path))}
    if as_json:
        print(json.dumps(r))
        return
    bpw = (f", {r['bits_per_weight_stored']:.4f} bits per weight stored (scales counted; "
           f"{r['bits_per_weight']:.2f} without)" if r["bits_per_weight"] else "")
    kinds = ", ".join(f"{n} {k}" for k, n in r["kinds"].items())
    t = Table(title=f"{u(path)}: {r['mode']} ({kinds}){bpw}")
    for col in ("layer", "op", "kind", "bits", "sym", "block", "weights", "scales min/median/max"):
        t.add_column(col, justify="right" if col in ("bits", "weights") else "left")
    for x in r["layers"]:
        sc = x["scales"]
        t.add_row(u(x["name"]), u(x["op"]), x["kind"], str(x["bits"]),
                  "" if x["symmetric"] is None else ("yes" if x["symmetric"] else "no"), str(x["block"] or ""),
                  str(x["weights"] or ""), f"{sc['min']:.3g}/{sc['median']:.3g}/{sc['max']:.3g}" if sc else "")
    console.print(t)
    if r["int8_tensors"]:
        console.print(f"{len(r['int8_tensors'])} int8 tensors (scale, zero point per tensor: --json lists them)")


@app.command()
def verify(source: str = typer.Argument(..., help="The source model (.onnx, .pt, .prototxt, .pb, .keras or a SavedModel directory)."),
           model: str = typer.Argument(..., help="The .mnn file to check."),
           inputs: Optional[List[str]] = INPUTS,
           calib: Optional[str] = typer.Option(None, "--calib", help="A folder of .npy/.npz samples or images."),
           samples: Optional[int] = SAMPLES,
           input_shape: Optional[List[str]] = INPUT_SHAPE,
           min_cosine: float = typer.Option(0.999, "--min-cosine", help="Pass threshold per tensor."),
           max_abs: Optional[float] = typer.Option(None, "--max-abs", help="Optional max abs error per tensor."),
           backend: Runtime = typer.Option("numba", "--backend", "-b",
                                           help="The runtime that runs the .mnn: numba (mnntool's) or mnn."),
           report: Optional[str] = typer.Option(None, "--report", help="Write an HTML report."),
           top: int = typer.Option(10, "--top", help="Worst layers to show."),
           mean: Optional[str] = MEAN, normal: Optional[str] = NORMAL, std: Optional[str] = STD,
           size: Optional[str] = SIZE,
           allow_io: bool = typer.Option(False, "--allow-io-ops", help="Run TensorFlow graphs whose ops reach "
                                         "files or Python (WriteFile, PyFunc, ...): only for models you trust."),
           workers: int = typer.Option(1, "--workers", "-w", min=1,
                                       help="Compare the samples in N local processes (the same numbers as one)."),
           ray: Optional[str] = typer.Option(None, "--ray", help="Compare the samples as Ray tasks (the same numbers "
                                             "as one process): local, auto, HOST:PORT or ray://HOST:PORT."),
           outputs_only: bool = typer.Option(False, "--outputs-only", help="Judge the final outputs only: layers "
                                             "below the threshold are reported but do not fail the run."),
           seed: int = typer.Option(0, "--seed", help="Seed of the random N(0,1) inputs used without --input, "
                                    "--calib or --load-inputs."),
           save_inputs: Optional[str] = typer.Option(None, "--save-inputs", help="Write the inputs used as "
                                                     "DIR/NNNN.npz, one per sample (read back by --load-inputs)."),
           load_inputs: Optional[str] = typer.Option(None, "--load-inputs", help="Read every sample of DIR (as "
                                                     "--save-inputs writes them: NNNN.npz, an array per input)."),
           save_outputs: Optional[str] = typer.Option(None, "--save-outputs", help="Write the source framework's "
                                                      "outputs (golden) as DIR/NNNN/NAME.npy."),
           thresholds: Optional[str] = typer.Option(None, "--thresholds", help="A .json or .toml file of limits per "
                                                    "output (by name) and per layer (by pattern); its top-level "
                                                    "min_cosine/max_abs replace the options'."),
           junit: Optional[str] = typer.Option(None, "--junit", help="Write a JUnit XML report: a test case per "
                                               "output and per failing layer."),
           out_format: Optional[str] = typer.Option(None, "--output-format", help="text, json or github (workflow "
                                                    "annotations, and a Markdown summary to $GITHUB_STEP_SUMMARY); "
                                                    "--format github/json/text is accepted too."),
           fmt: str = FORMAT, threads: int = THREADS, as_json: bool = JSON):
    """Per-layer comparison with the source framework; exit 1 when an output or a compared layer misses
    the thresholds (only outputs with --outputs-only), 3 when the files are not the same model (too few
    tensors match by name), 2 on a user error.

    Example: mnntool verify model.onnx model.mnn --junit verify.xml --format github

    The source model runs in its own framework (onnxruntime, torch, TensorFlow, OpenCV), and with it
    whatever the file holds: verify only models you trust. Converting never runs model code."""
    from .format import reader as mnn_reader
    from .format.writer import check_output, weight_path
    from .inputs import input_files, load_feeds
    from .quant.data import calibration_samples
    from .verifier import html_report, verify as run_verify
    if not 0.0 <= min_cosine <= 1.0:       # (also refuses NaN)
        raise MnnToolError(f"--min-cosine must be in [0, 1], got {min_cosine}")
    if max_abs is not None and not max_abs >= 0.0:
        raise MnnToolError(f"--max-abs must be at least 0, got {max_abs}")
    shapes = api.parse_input_shapes(input_shape)
    sources = api._sources(source) + [model, weight_path(model), calib] + input_files(inputs)
    if report:      # refused before the (slow) comparison, not only at the write
        check_output(report, sources)
    if fmt.lower() in ("github", "json", "text"):       # --format github: the report's format, not the image's
        out_format, fmt = out_format or fmt.lower(), "RGB"
    out_format = (out_format or ("json" if as_json else "text")).lower()
    if out_format not in ("text", "json", "github"):
        raise MnnToolError(f"--output-format {out_format}: expected text, json or github")
    as_json = out_format == "json"
    from .verifier import load_thresholds
    limits = load_thresholds(thresholds) if thresholds else None
    if load_inputs and (calib or inputs):
        raise MnnToolError("--load-inputs reads the samples itself: give it without --calib or --input")
    if junit:
        check_output(junit, sources)
    for what, folder in (("--save-inputs", save_inputs), ("--save-outputs", save_outputs)):
        if folder and os.path.exists(folder) and not os.path.isdir(folder):
            raise MnnToolError(f"{what} {folder}: exists and is not a folder")
    g = mnn_reader.load(model)
    prep = _image_prep(mean, normal, size, fmt, std)
    if load_inputs:
        from pathlib import Path
        if not Path(load_inputs).is_dir():
            raise MnnToolError(f"--load-inputs {load_inputs}: not a folder (a file of inputs goes to --input)")
        feeds = calibration_samples(load_inputs, g, None, None)
        files = sorted(p.name for p in Path(load_inputs).iterdir() if p.suffix.lower() in (".npy", ".npz"))
        described = {"kind": "files", "folder": load_inputs, "files": files or ["(one folder per sample)"]}
    elif calib:
        feeds = calibration_samples(calib, g, prep, samples or 4)
        described = {"kind": "calibration", "folder": calib, "samples": len(feeds)}
    elif inputs:
        feeds = load_feeds(inputs, g)
        described = {"kind": "files", "files": list(inputs)}
    else:
        feeds, described = None, None          # the verifier draws them with the seed
        if save_inputs:
            from .inputs import random_feeds
            for name, shape in (shapes or {}).items():
                if name in g.tensors:
                    g.tensors[name].shape = tuple(shape)
            feeds = random_feeds(g, shapes, seed)
            described = {"kind": "random", "distribution": "normal(0, 1); integer inputs uniform in [0, 100)",
                         "seed": seed}
    if save_inputs:
        from .verifier import save_inputs as write_inputs
        write_inputs(save_inputs, feeds if isinstance(feeds, list) else [feeds])
    several = isinstance(feeds, list) and len(feeds) > 1
    from .verify_report import junit_error, junit_xml, reporting_failure, write_reports
    with reporting_failure(junit, out_format, sources, lambda e: junit_error(e, source, model), "mnntool verify", model), \
            _progress("comparing samples", len(feeds) if several else 1, shown=several and not as_json) as step:
        r = run_verify(source, model, feeds, shapes, backend, min_cosine, max_abs, threads, allow_io,
                       progress=step, workers=workers, ray=ray, outputs_only=outputs_only, seed=seed,
                       inputs=described, save_outputs=save_outputs, thresholds=limits)
    write_reports(sources, report, lambda: html_report(r), junit, lambda: junit_xml(r))
    if as_json:
        print(json.dumps(r))
    elif not sys.stdout.isatty() or out_format == "github":     # logs: plain lines, names never cut
        from .verify_report import append_step_summary, github_lines, markdown_summary, plain_text
        print(plain_text(r, top))
        if out_format == "github":
            print("\n".join(github_lines(r)))
            append_step_summary(markdown_summary(r, top))
    else:
        from .verifier import inputs_text, verdict_text
        t = Table(title=f"{u(model)} vs {u(source)}: {len(r['layers'])} layers matched, {len(r['unmatched'])} without "
                        f"counterpart ({r['backend']})")
        for col in ("tensor", "op", "cosine", "max_abs", "rel_l2", "snr_db", ""):
            t.add_column(col, overflow="fold", min_width=16) if col == "tensor" else t.add_column(col)
        worst = sorted(r["layers"], key=lambda m: m["cosine"])[:top]
        order = {m["name"]: k for k, m in enumerate(r["layers"])}
        for m in sorted(worst, key=lambda m: order[m["name"]]):
            mark = "[red]first failing[/]" if m["name"] == r["first_failing"] else ("[red]fail[/]" if not m["pass"] else "")
            t.add_row(u(m["name"]), u(m["op"]), f"{m['cosine']:.6f}", f"{m['max_abs']:.3g}", f"{m['rel_l2']:.3g}",
                      f"{m['snr_db']:.1f}", mark)
        console.print(t)
        console.print(f"inputs: {u(inputs_text(r['inputs']))}", highlight=False)
        for o in r["outputs"]:
            verdict = "[green]pass[/]" if o["pass"] else "[red]FAIL[/]"
            console.print(f"output {u(o['name'])}: cosine {o['cosine']:.6f}, max abs {o['max_abs']:.3g} {verdict}")
        if r["first_failing"]:
            console.print(f"[red]first layer below the threshold:[/] {u(r['first_failing'])}")
        console.print(("[green]" if r["pass"] else "[red]") + u(verdict_text(r)) + "[/]", highlight=False)
    if r["exit_code"]:
        raise typer.Exit(r["exit_code"])


@app.command()
def run(model: str = typer.Argument(..., help="A .mnn (or .onnx) model."),
        inputs: Optional[List[str]] = INPUTS, input_shape: Optional[List[str]] = INPUT_SHAPE,
        output_dir: Optional[str] = typer.Option(None, "--output-dir", "-o", help="Write each output as NAME.npy."),
        threads: int = THREADS, as_json: bool = JSON):
    """Run a model in mnntool's runtime; write outputs as .npy or print a summary."""
    import numpy as np

    import io
    from pathlib import Path

    from .format.writer import atomic_write, check_output, weight_path
    from .inputs import input_files, load_feeds, random_feeds
    from .runtime.session import Session
    shapes = api.parse_input_shapes(input_shape)
    g = api.load_graph(model, input_shapes=shapes)
    feeds = load_feeds(inputs, g)
    missing = [n for n in g.inputs if n not in feeds]
    if missing and inputs:
        raise MnnToolError(f"{model}: no data for input(s) {', '.join(missing)}")
    if not inputs:
        feeds = random_feeds(g, shapes)
    sources = [model, weight_path(model)] + input_files(inputs)
    if output_dir and Path(output_dir).is_dir():     # refused before the run, not only at the write
        for name in g.outputs:
            check_output(Path(output_dir) / f"{name.replace('/', '_')}.npy", sources)
    outs = Session(g, threads).run(feeds)
    if output_dir:
        if Path(output_dir).exists() and not Path(output_dir).is_dir():
            raise MnnToolError(f"{output_dir}: exists and is not a directory (-o takes a directory for the .npy files)")
        try:
            Path(output_dir).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise MnnToolError(f"{output_dir}: cannot create the output directory ({e.strerror or e})") from None
    rows = []
    for name, arr in outs.items():
        if output_dir:
            buf = io.BytesIO()
            np.save(buf, arr)
            atomic_write(Path(output_dir) / f"{name.replace('/', '_')}.npy", buf.getvalue(), sources)
        f = arr.astype(np.float64)
        rows.append({"name": name, "shape": list(arr.shape), "dtype": str(arr.dtype), "min": float(f.min()),
                     "max": float(f.max()), "mean": float(f.mean())})
    if as_json:
        print(json.dumps({"model": model, "outputs": rows}))
        return
    t = Table(title=f"{u(model)} outputs")
    for col in ("output", "shape", "dtype", "min", "max", "mean"):
        t.add_column(col)
    for r in rows:
        t.add_row(u(r["name"]), "x".join(map(str, r["shape"])), r["dtype"], f"{r['min']:.4g}", f"{r['max']:.4g}",
                  f"{r['mean']:.4g}")
    console.print(t)


@app.command()
def bench(model: str = typer.Argument(..., help="A .mnn model (or the .onnx source for onnxruntime)."),
          threads: int = THREADS,
          warmup: int = typer.Option(5, "--warmup", "-w", min=0, help="Untimed runs first."),
          runs: int = typer.Option(50, "--runs", "-r", min=1, help="Timed runs."),
          input_shape: Optional[List[str]] = INPUT_SHAPE,
          backend: BenchBackend = typer.Option("numba", "--backend", "-b",
                                               help="numba (mnntool), onnxruntime (the source .onnx) or mnn."),
          profile: bool = typer.Option(False, "--profile", help="Time every op (numba backend)."),
          top: int = typer.Option(10, "--top", help="Rows of the profile tables."),
          as_json: bool = JSON):
    """Time a model: latency statistics, cold start, load time, GFLOP/s, memory, per-op profile."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if threads > cores:
        err.print(f"[yellow]warning:[/] --threads {threads} on {cores} core(s): the threads share the cores, "
                  "so the timings measure contention, not the model", highlight=False)

    from .timing import bench as run_bench
    shapes = api.parse_input_shapes(input_shape)
    with _progress(f"{backend} x{threads}", warmup + runs, shown=not as_json) as step:
        r = run_bench(model, backend, threads, warmup, runs, shapes, profile, progress=step)
    if as_json:
        print(json.dumps(r))
        return
    t = Table(title=f"{u(model)} on {backend}, {threads} thread(s), {runs} runs")
    for col in ("median", "mean", "min", "p90", "p99", "first run", "load+prepare", "GFLOP/s", "peak RSS"):
        t.add_column(col, justify="right")
    t.add_row(*(f"{r[k]:.2f} ms" for k in ("median_ms", "mean_ms", "min_ms", "p90_ms", "p99_ms", "first_run_ms",
                                             "load_prepare_ms")), f"{r['gflop_per_s']:.1f}", f"{r['peak_rss_mb']:.0f} MB")
    console.print(t)
    if backend == "numba" and threads == 1 and not r.get("kernel_library"):
        err.print("note: no ahead-of-time kernels for this CPU: `mnntool compile-kernels` (once) makes load+prepare "
                  "and the first run several times faster", highlight=False)
    if "profile" in r:
        for key, title in (("op_types", "time per op type"), ("ops", "slowest ops")):
            pt = Table(title=title)
            pt.add_column("op" if key == "op_types" else "name")
            if key == "ops":
                pt.add_column("op")
            else:
                pt.add_column("count", justify="right")
            pt.add_column("ms", justify="right")
            pt.add_column("%", justify="right")
            for row in r["profile"][key][:top]:
                first = [u(row["op"]), str(row["count"])] if key == "op_types" else [u(row["name"]), u(row["op"])]
                pt.add_row(*first, f"{row['ms']:.3f}", f"{row['percent']:.1f}")
            console.print(pt)


@app.command()
def quant(src: str = typer.Argument(..., help="A float .mnn model."),
          dst: str = typer.Argument(..., help="The quantized .mnn to write."),
          int8: bool = typer.Option(False, "--int8", help="Full int8: weights and activations (needs --calib)."),
          calib: Optional[str] = typer.Option(None, "--calib", help="Folder of .npy/.npz samples or images."),
          method: str = typer.Option("mse", "--method", help="Activation calibration: mse, kl, percentile, minmax."),
          per_channel: bool = typer.Option(True, "--per-channel/--per-tensor", help="Weight scales."),
          samples: Optional[int] = SAMPLES,
          batches: Optional[int] = typer.Option(None, "--batches", min=1, hidden=True, help="Old name of --samples."),
          weight_bits: Optional[int] = typer.Option(None, "--weight-bits", help="Weight-only: 8 or 4 bits."),
          asymmetric: bool = typer.Option(False, "--asymmetric", help="Weight-only: (min, scale) per channel."),
          block_size: Optional[int] = typer.Option(None, "--block-size",
                                                   help="Weight-only: one scale per N input channels (32, 64, 128)."),
          hqq: bool = typer.Option(False, "--hqq", help="Weight-only: zero points by half-quadratic optimisation "
                                                        "(as MNN's converter --hqq; implies --asymmetric)."),
          head_bits: Optional[int] = typer.Option(
              None, "--head-bits", help="Weight-only: bits of the layers that produce the outputs (a classifier's "
                                        "last FC, a language model's vocabulary projection); default 8 with "
                                        "--weight-bits 4."),
          fp16: bool = typer.Option(False, "--fp16", help="Store weights as half floats."),
          skip: Optional[str] = typer.Option(None, "--skip", help="Comma-separated layers to keep in float."),
          auto_skip: Optional[float] = typer.Option(None, "--auto-skip",
                                                    help="Keep the fewest layers in float for output cosine >= X "
                                                         "(int8, or weight-only: layers ranked by measured "
                                                         "sensitivity)."),
          skip_budget: Optional[float] = typer.Option(
              None, "--skip-budget", help="Keep at most P% of the weights in float (int8 or weight-only): the "
              "layers whose measured output error removed is largest within it; with --auto-skip X, the fewest "
              "of them that reach X."),
          skip_budget_by: str = typer.Option("weights", "--skip-budget-by",
                                             help="What --skip-budget counts: weights or macs."),
          target_bits: Optional[float] = typer.Option(
              None, "--target-bits", help="Weight-only: 4 or 8 bits per layer for at most B bits per weight on "
              "average (scales counted, as llama.cpp's bpw; `info --quant` reads the same), the 8 going to the "
              "layers whose measured output error at 4 bits removes the most within it."),
          bias_correction: bool = typer.Option(True, "--bias-correction/--no-bias-correction"),
          symmetric_activations: bool = typer.Option(
              False, "--symmetric-activations",
              help="int8: zero point 0 for every tensor (default: never-negative tensors use all 255 levels)."),
          float_weights: bool = typer.Option(
              False, "--float-weights",
              help="int8: layers kept in float keep fp32 weights (default: their weights are stored as int8, "
                   "their compute stays float)."),
          workers: int = typer.Option(1, "--workers", "-w", min=1,
                                      help="int8: calibrate in N local processes (same file as one process)."),
          ray: Optional[str] = typer.Option(None, "--ray",
                                            help="int8: calibrate on a Ray cluster (same file as one process): "
                                                 "local (start one here), auto (the running one), HOST:PORT "
                                                 "(the head's GCS) or ray://HOST:PORT (its client server)."),
          config: Optional[str] = typer.Option(None, "--config",
                                               help="JSON: method, skip, per_channel, samples, symmetric_activations."),
          compression_params: Optional[str] = typer.Option(
              None, "--compression-params", help="Weight-only: per-layer bits/block/asymmetry from MNN's "
              "compression JSON (MNNConvert --compressionParamsFile); unlisted layers get --weight-bits (8)."),
          write_compression_params: Optional[str] = typer.Option(
              None, "--write-compression-params", help="Weight-only: write the per-layer plan used as MNN's "
              "compression JSON, for MNNConvert --compressionParamsFile."),
          mean: Optional[str] = MEAN, normal: Optional[str] = NORMAL, std: Optional[str] = STD,
          size: Optional[str] = SIZE, fmt: str = FORMAT, input_shape: Optional[List[str]] = INPUT_SHAPE,
          threads: int = THREADS, external_weights: bool = EXTERNAL_WEIGHTS, as_json: bool = JSON):
    """Quantize a .mnn model: int8 PTQ, weight-only int8/int4, or fp16 -- files the MNN runtime runs."""
    from .quant import QuantConfig, quantize_file
    cfg = QuantConfig(int8=int8, weight_bits=weight_bits, fp16=fp16, calib=calib, method=method,
                      per_channel=per_channel, samples=samples or batches, threads=threads, workers=workers,
                      ray=ray, skip=tuple(x.strip() for x in skip.split(",") if x.strip()) if skip else (),
                      auto_skip=auto_skip, skip_budget=skip_budget, skip_budget_by=skip_budget_by,
                      target_bits=target_bits, bias_correction=bias_correction,
                      symmetric_activations=symmetric_activations, float_weights=float_weights,
                      prep=_image_prep(mean, normal, size, fmt, std),
                      asymmetric=asymmetric, block_size=block_size, hqq=hqq, head_bits=head_bits,
                      input_shapes=api.parse_input_shapes(input_shape), external_weights=external_weights or None,
                      compression_params=compression_params, write_compression_params=write_compression_params)
    if config:
        from .format.writer import check_output
        check_output(dst, [config])     # the output must not replace the config file it reads either
        cfg = cfg.with_file(config)
    with _progress("calibrating" if int8 else "measuring layers", None,
                   shown=(int8 or cfg.measures()) and not as_json) as step:
        r = quantize_file(src, dst, cfg, progress=step)
    for note in r.get("notes", []):     # on stderr, so --json output stays one document
        err.print(f"[yellow]warning:[/] {u(note)}")
    if as_json:
        print(json.dumps(r))
        return
    console.print(f"[green]quantized[/] {u(src)} -> {u(dst)} ({r['mode']}): {_human(r['size_before'], 'B')} -> "
                  f"{_human(r['size_after'], 'B')} ({r['ratio']:.2f}x smaller)")
    for o in r["outputs"]:
        console.print(f"  output {u(o['name'])}: cosine vs fp32 {o['cosine']:.6f}, max abs {o['max_abs']:.3g}")
    if r.get("head_layers"):
        console.print(f"  int{r['head_bits']} output layers: {u(', '.join(r['head_layers']))}")
    if r.get("int8_float_outputs"):
        console.print(f"  int8 layers writing float for float readers: {r['int8_float_outputs']} of {r['int8_layers']}")
    if r.get("inputs"):
        console.print(f"  measured on: {u(r['inputs'])}")
    if r.get("auto_skipped") is not None:
        console.print(f"  kept in float: {u(', '.join(r['auto_skipped']) or 'none')}")
    if r.get("skip_budget"):
        _print_skip_budget(r["skip_budget"])
    if r.get("bit_plan"):
        _print_bit_plan(r["bit_plan"])
    for f in r.get("float_layers", []):
        console.print(f"  float layer {u(f['name'])}: {f['reason']}, {f['weights']} weights")
    if r["worst_layers"]:
        t = Table(title="worst int8 layers (cosine vs fp32, held-out samples)")
        t.add_column("layer")
        t.add_column("cosine", justify="right")
        by_name = {l["name"]: l for l in r["layers"]}
        for name in r["worst_layers"]:
            t.add_row(u(name), f"{by_name[name]['cosine']:.6f}")
        console.print(t)


def _print_skip_budget(b: dict) -> None:
    limit = f" of {b['budget_percent']:g}% allowed" if b["budget_percent"] is not None else ""
    met = "" if b["target_met"] is None else (" (target met)" if b["target_met"] else
                                              f" (--auto-skip {b['target']:g} not reached within the budget)")
    console.print(f"  float {b['by']}: {b['used_percent']:.2f}%{limit}, layers ranked by measured sensitivity{met}")


def _print_bit_plan(p: dict) -> None:
    console.print(f"  bits per weight (scales counted): {p['achieved_bits_per_weight']:.4f} for a target of "
                  f"{p['target_bits']:g}")
    t = Table(title="bits per layer (output cosine with only that layer at 4 bits)")
    for col in ("layer", "weights", "cosine at 4 bits", "bits"):
        t.add_column(col, justify="left" if col == "layer" else "right")
    for row in p["plan"]:
        cos = f"{row['cosine_at_low']:.6f}" if row["cosine_at_low"] is not None else "fixed"
        t.add_row(u(row["name"]), str(row["weights"] or ""), cos, str(row["bits"] or "float"))
    console.print(t)


@app.command("compile-kernels")
def compile_kernels(force: bool = typer.Option(False, "--force", help="Build even when the library exists."),
                    as_json: bool = JSON):
    """Compile the runtime's kernels ahead of time for this CPU (a minute or two, once): one-thread
    sessions then load in ~0.1 s and run their first inference without compiling (pycc, needs a C
    compiler). Without it they compile with Numba (its cache: ~0.5 s a start)."""
    from .runtime.kernels.compile import aot, aot_build
    lib, _ = aot.library_paths()
    if lib.exists() and not force:
        r = {"library": str(lib), "kernels": None, "built": False}
    else:
        count = len(aot_build.read_manifest())
        with _progress("compiling kernels", count, shown=not as_json) as step:
            try:
                r = {**aot_build.build(quiet=True, progress=step), "built": True}
            except aot_build.BuildError as e:
                raise MnnToolError(str(e))
    from .runtime import host_tuning
    from .runtime.settings import cores
    counts = sorted({t for t in (2, 4, 8, 16, cores()) if 2 <= t <= cores()})
    if force:
        host_tuning.forget(measured=True)
    r["host_tuning"] = [host_tuning.report(t) for t in counts]    # measured once per host, kept beside the library
    if as_json:
        print(json.dumps(r))
        return
    if r["built"]:
        console.print(f"compiled {r['kernels']} kernels in {r['seconds']:.0f} s: {u(r['library'])}")
    else:
        console.print(f"up to date: {u(r['library'])} (--force rebuilds)")
    for t in r["host_tuning"]:
        console.print(f"{t['threads']} threads: parallel kernels from {t['parallel_min_work']:,} operations, "
                      f"plans on one thread below {t['one_thread_below_flops'] / 1e6:.1f} MFLOP ({t['source']})")


@app.command()
def ops(framework: str = typer.Option("onnx", "--framework", "-f", help="onnx, torch, tf, tflite or caffe."),
        where: bool = typer.Option(False, "--where", help="The op map: for every IR op its definition, each "
                                   "frontend's converters, its kernel (or numpy fallback) and its tests."),
        as_json: bool = JSON):
    """List the source ops a frontend converts (as MNNConvert's --OP does), or with --where the op map."""
    if where:
        return _op_map(as_json)
    names = supported_ops(framework)
    if as_json:
        print(json.dumps({"framework": framework, "count": len(names), "ops": names}))
        return
    console.print(f"{framework}: {len(names)} ops")
    console.print(", ".join(u(n) for n in names))


def _op_map(as_json: bool) -> None:
    from .opmap import FRONTENDS, op_map
    rows = op_map()
    if as_json:
        print(json.dumps({"count": len(rows), "ops": rows}))
        return
    t = Table(title=f"{len(rows)} IR ops: where each is defined, converted, run and tested")
    for col in ("op", "kind", "definition", *FRONTENDS, "kernel", "tests"):
        t.add_column(col)
    for r in rows:
        convs = [", ".join(sorted({c["source"] for c in r["converters"][fw]})[:3]) or "-" for fw in FRONTENDS]
        t.add_row(u(r["op"]), r["kind"], u(r["definition"]), *map(u, convs), u(r["kernel"]), str(len(r["tests"])))
    console.print(t)


def supported_ops(framework: str) -> list[str]:
    fw = framework.lower()
    if fw == "onnx":
        from .frontends.onnx import supported_ops as onnx_ops
        return onnx_ops()
    if fw in ("torch", "torchscript", "pytorch", "torch.export", "pt2"):
        # one table for TorchScript and torch.export programs (the package import registers it)
        from .frontends.torchscript import ATEN
        return sorted(ATEN)
    if fw in ("tf", "tensorflow"):
        from .frontends.tensorflow import supported_ops as tf_ops
        return tf_ops()
    if fw == "tflite":
        from .frontends.tflite import supported_ops as tflite_ops
        return tflite_ops()
    if fw == "caffe":
        from .frontends.caffe import supported_layers
        return supported_layers()
    raise MnnToolError(f"--framework {framework}: expected onnx, torch (or pt2), tf, tflite or caffe")


def _version(value: bool):
    if value:
        from ._version import MNN_FORMAT_VERSION, __version__
        print(f"mnntool {__version__} (writes MNN format {MNN_FORMAT_VERSION})")
        raise typer.Exit()


from .cli_llm import llm_app  # noqa: E402  (after the shared options it imports from here)

app.add_typer(llm_app, name="llm")

from .cli_debug import debug_app  # noqa: E402

app.add_typer(debug_app, name="debug")


@app.callback()
def _options(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                          help="Print the version and the MNN format it writes.")):
    """Convert, optimize, quantize, check and time models in MNN's .mnn format."""


def main():
    """Typer's standalone mode handles usage errors (exit 2) and typer.Exit codes; our own errors, which
    users cause, become one line and their exit code; SIGINT and SIGTERM stop the work (mnntool.interrupts)."""
    from .interrupts import Interrupted, install
    install()
    try:
        _main()
    except Interrupted as e:
        _interrupted(e)


def _interrupted(e) -> None:
    """The work's own cleanup has run on the way up (temporary outputs removed, pools stopped, Ray shut
    down); kill what children are left, then one line and the shell's code: 130 SIGINT, 143 SIGTERM."""
    from .interrupts import exit_now, kill_children, say
    kill_children()
    say(2, "interrupted")       # straight to the descriptor: a progress display may still hold sys.stderr
    if "--json" in sys.argv[1:]:
        say(1, json.dumps({"error": "interrupted", "signal": str(e), "exit_code": e.exit_code}))
    exit_now(e.exit_code)


def _main():
    try:
        rv = app(standalone_mode=False)
    except typer.Abort:
        err.print("aborted")
        sys.exit(130)
    except typer.exceptions.TyperException as e:     # a usage error: Typer's box on stderr, and the JSON object
        from typer import rich_utils
        rich_utils.rich_format_error(e)
        if "--json" in sys.argv[1:]:
            print(json.dumps({"error": e.format_message(), "exit_code": e.exit_code}))
        sys.exit(e.exit_code)
    except MnnToolError as e:
        _fail(str(e), e.code)
    except MemoryError as e:      # a model or input too large for this machine: one line, like any user error
        _fail(f"out of memory{': ' + ' '.join(str(e).split()) if str(e) else ''}", 2)
    sys.exit(rv if isinstance(rv, int) else 0)


def _fail(message: str, code: int):
    """The error as one line on stderr, and with --json also as a JSON object on stdout (a pipeline that
    parses stdout sees why, not an empty document)."""
    err.print(f"[red]error:[/] {u(message)}", highlight=False, soft_wrap=True)
    if "--json" in sys.argv[1:]:
        print(json.dumps({"error": message, "exit_code": code}))
    sys.exit(code)


if __name__ == "__main__":
    main()
