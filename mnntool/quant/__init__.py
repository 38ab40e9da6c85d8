"""Quantization: int8 PTQ with calibration, weight-only int8/int4, fp16 -- all in MNN's own format."""
from __future__ import annotations

from pathlib import Path

from ..errors import MnnToolError
from ..format import reader, writer
from .config import QuantConfig
from .data import CalibrationReader, FolderReader, ListReader

__all__ = ["QuantConfig", "CalibrationReader", "FolderReader", "ListReader", "quantize_file"]


def _reader(calib, g, prep) -> CalibrationReader:
    """A reader as it is, a list of feed dicts, or a folder."""
    if isinstance(calib, CalibrationReader):
        return calib
    if isinstance(calib, list):
        return ListReader(calib)
    return FolderReader(calib, g, prep)


def _shaped(g, shapes: dict, src):
    """The graph with inputs' open dims fixed, for reading calibration data (images are resized to it);
    the quantized file keeps the model's own open dims."""
    if not shapes:
        return g
    from dataclasses import replace

    from ..runtime.session import check_input_shape
    out = replace(g, tensors=dict(g.tensors))
    for name, shape in shapes.items():
        try:
            check_input_shape(g, name, shape)
        except MnnToolError as e:
            raise MnnToolError(f"{src}: --input-shape: {e}") from None
        out.tensors[name] = replace(g.tensors[name], shape=tuple(shape))
    return out


def _probe_feeds(g, shapes: dict) -> tuple[dict, str | None]:
    """Random inputs to measure weight-only accuracy on: --input-shape where given, open dims else 1
    (a decoder's single-token step), with a note saying so."""
    from ..inputs import random_feeds
    fixed, open_ = dict(shapes), []
    for name in g.inputs:
        shape = fixed.get(name) or g.tensors[name].shape or ()
        if not all(isinstance(d, int) and d > 0 for d in shape):
            fixed[name] = tuple(d if isinstance(d, int) and d > 0 else 1 for d in shape)
            open_.append(name)
    note = (f"accuracy measured with open dims of {', '.join(open_)} at 1 (set them with --input-shape)"
            if open_ else None)
    return random_feeds(g, fixed), note


def _with_plan_mode(cfg: QuantConfig) -> QuantConfig:
    """MNN's compression JSON carries weight-only plans: it implies weight-only quantization (layers it
    does not list at --weight-bits, 8 unless given) and cannot steer int8 or fp16."""
    if not (cfg.compression_params or cfg.write_compression_params):
        return cfg
    if cfg.int8 or cfg.fp16:
        opt = "--compression-params" if cfg.compression_params else "--write-compression-params"
        raise MnnToolError(f"{opt} carries weight-only plans (MNN's per-layer bits/block); drop "
                           f"{'--int8' if cfg.int8 else '--fp16'} or use --weight-bits 8|4")
    if cfg.weight_bits is None and cfg.compression_params and cfg.target_bits is None:
        from dataclasses import replace
        return replace(cfg, weight_bits=8)
    return cfg


SUGGEST_BELOW = 0.999     # an int8 output below this cosine vs fp32 gets a note pointing at --auto-skip
MEASURE_SAMPLES = 8       # weight-only: calibration samples the layers are measured on (unless --samples)


def _weight_only_samples(g, cfg: QuantConfig, src) -> tuple[list[dict], str, list[str]]:
    """The inputs weight-only accuracy (and, for --target-bits/--skip-budget, each layer's sensitivity) is
    measured on: --calib's first samples, else one seeded random sample; with what to call them."""
    if cfg.calib is None:
        feeds, note = _probe_feeds(g, cfg.input_shapes)
        return [feeds], "random N(0,1), seed 0, 1 sample (give --calib for real inputs)", [note] if note else []
    data = _reader(cfg.calib, _shaped(g, cfg.input_shapes, src), cfg.prep)
    data = data.split(cfg.samples or MEASURE_SAMPLES)[0]
    where = f" of {cfg.calib}" if isinstance(cfg.calib, (str, Path)) else ""
    return list(data), f"{len(data)} calibration sample(s){where}", list(getattr(data, "notes", []))


def quantize_file(src, dst, config: QuantConfig, progress=None) -> dict:
    """Quantize a .mnn file into another; returns the report (sizes, per-layer accuracy, skipped layers)."""
    from .ptq import float_report, quantize_int8
    from .report import auto_skip as run_auto_skip, layer_report, worst_first
    from .weight_only import compress_weights, head_layers
    cfg = _with_plan_mode(config)
    cfg.check()
    src, dst = Path(src), Path(dst)
    sources = (src, writer.weight_path(src), cfg.calib if isinstance(cfg.calib, (str, Path)) else None,
               cfg.compression_params)
    writer.check_output(dst, sources)      # refused before the (slow) calibration, not only at the write
    if cfg.write_compression_params:
        writer.check_output(cfg.write_compression_params, sources + (dst,))
    if cfg.external_weights:
        writer.check_output(writer.weight_path(dst), sources)
    g = reader.load(src)
    skip = set(cfg.skip)
    names = {n.name for n in g.nodes} | {o for n in g.nodes for o in n.outputs}
    unknown = sorted(s for s in skip if s not in names)
    if unknown:
        raise MnnToolError(f"--skip names no layer of {src}: {', '.join(unknown)}")
    report: dict = {"source": str(src), "output": str(dst),
                    "size_before": src.stat().st_size + (Path(g.weight_file).stat().st_size if g.weight_file else 0)}
    if cfg.int8:
        data = _reader(cfg.calib, _shaped(g, cfg.input_shapes, src), cfg.prep)
        report["notes"] = list(getattr(data, "notes", []))
        if cfg.samples:
            data = data.split(cfg.samples)[0]
        # the last fifth is held out to measure the result (one sample serves both)
        n = len(data)
        calib_set, held_out = data.split(n - max(1, n // 5)) if n > 1 else (data, data)
        held = list(held_out)       # auto-skip evaluates on it many times: read once

        def quantize(extra_skip, stats=None):
            q = quantize_int8(g, calib_set, cfg.method, cfg.per_channel, skip | set(extra_skip),
                              cfg.bias_correction, progress=progress, asymmetric=not cfg.symmetric_activations,
                              threads=cfg.threads, workers=cfg.workers, ray=cfg.ray, stats=stats)
            if not cfg.float_weights:       # the layers left float store int8 weights, computing in float
                compress_weights(q, 8)
            return q
        from .shards import pool
        with pool(cfg.workers, cfg.ray) as workers:     # held-out evaluations, sharded
            if cfg.skip_budget is not None:        # layers ranked by measured sensitivity (skip_budget.py)
                from .skip_budget import choose_int8
                q, skipped, acc, report["skip_budget"] = choose_int8(g, quantize, calib_set, held, cfg, skip,
                                                                     workers, progress)
                report["auto_skipped"] = skipped
            elif cfg.auto_skip is not None:
                q, skipped, acc = run_auto_skip(g, quantize, held, cfg.auto_skip, threads=cfg.threads, pool=workers)
                report["auto_skipped"] = skipped
            else:
                q = quantize(set())
                acc = layer_report(g, q, held, cfg.threads, workers)
        report.update(mode="int8", method=cfg.method, per_channel=cfg.per_channel, calibration_samples=len(calib_set),
                      held_out_samples=len(held_out), symmetric_activations=cfg.symmetric_activations)
    else:
        q = reader.load(src)
        head_bits = cfg.resolved_head_bits()
        plan = given = None
        samples, report["inputs"], notes = _weight_only_samples(g, cfg, src)
        report.setdefault("notes", []).extend(notes)
        if cfg.target_bits is not None:
            from .bit_budget import plan_target_bits
            pinned = {name: head_bits for name in head_layers(g)} if head_bits else {}
            plan, report["bit_plan"] = plan_target_bits(g, cfg.target_bits, samples, cfg.block_size,
                                                           cfg.asymmetric or cfg.hqq, cfg.hqq, skip, pinned,
                                                           cfg.threads, progress)
        elif cfg.auto_skip is not None or cfg.skip_budget is not None:
            from .skip_budget import choose_weight_only
            chosen, report["skip_budget"] = choose_weight_only(g, cfg, skip, head_bits, samples, progress)
            report["auto_skipped"] = chosen
            skip |= set(chosen)
        if plan is None and (cfg.compression_params or cfg.write_compression_params):
            from . import compression_params as cp
            given = cp.read(cfg.compression_params) if cfg.compression_params else None
            plan = cp.plan_for(g, cfg.weight_bits, cfg.asymmetric or cfg.hqq, cfg.block_size, skip,
                               head_layers(g) if head_bits else set(), head_bits, given, src)
        bits = cfg.weight_bits if plan is None else 8       # a plan sets each layer's bits
        n, blocked = compress_weights(q, bits, cfg.fp16, cfg.asymmetric, skip, cfg.block_size, cfg.hqq,
                                      head_bits if plan is None else None, plan)
        if plan is not None:
            report["layer_bits"] = {name: lp.bits for name, lp in plan.items()}
        if n == 0:
            raise MnnToolError(f"{src}: no float convolution weights to compress")
        mode = ("fp16" if cfg.fp16 else "weight-only per layer" if cfg.compression_params or cfg.target_bits
                else f"weight-int{cfg.weight_bits}")
        report.update(mode=mode,
                      asymmetric=cfg.asymmetric or cfg.hqq, hqq=cfg.hqq, head_bits=head_bits,
                      head_layers=sorted(head_layers(g) - skip - set(given or ())) if head_bits else [],
                      layers=n, block_size=cfg.block_size, block_layers=blocked)
        acc = layer_report(g, q, samples, cfg.threads)
    written = writer.write(q, dst, sources=sources, external=cfg.external_weights)
    if cfg.write_compression_params:        # after the model: no plan for a file that was not written
        from .compression_params import write as write_plan
        write_plan(cfg.write_compression_params, g, plan)
        report["compression_params_written"] = str(cfg.write_compression_params)
    report["size_after"], report["weight_file"] = written["bytes"], written["weight_file"]
    report["ratio"] = report["size_before"] / report["size_after"]
    report["outputs"] = acc["outputs"]
    report["layers"] = acc["layers"]
    report["worst_layers"] = [l["name"] for l in worst_first(acc)[:5]] if cfg.int8 else []
    report["int8_layers"] = sum(1 for l in acc["layers"] if l["int8"])
    # int8 layers that write float for float readers (ptq.float_outputs)
    report["int8_float_outputs"] = sum(1 for n in q.nodes if (n.param.get("symmetricQuan") or {}).get(
        "outputDataType") == "DT_FLOAT")
    if cfg.int8:
        report["float_layers"] = float_report(g, q, skip, report.get("auto_skipped") or [])
        worst = min((o["cosine"] for o in acc["outputs"]), default=1.0)
        if cfg.auto_skip is None and worst < SUGGEST_BELOW:
            report.setdefault("notes", []).append(
                f"output cosine vs fp32 {worst:.6f} on the held-out samples: --auto-skip {SUGGEST_BELOW} keeps "
                f"the fewest layers in float (int8 weights) that reach {SUGGEST_BELOW}")
    return report
