"""Quantization: int8 PTQ with calibration, weight-only int8/int4, fp16 -- all in MNN's own format."""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import MnnToolError
from ..format import reader, writer


def _load_config(path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise MnnToolError(f"{path}: no such config file") from None
    except json.JSONDecodeError as e:
        raise MnnToolError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None


def quantize_file(src, dst, *, int8: bool = False, calib=None, method: str = "mse", per_channel: bool = True,
                  batches: int | None = None, weight_bits: int | None = None, fp16: bool = False,
                  asymmetric: bool = False, block_size: int | None = None, skip=(), auto_skip: float | None = None,
                  bias_correction: bool = True, symmetric_activations: bool = False, prep=None, config=None,
                  progress=None) -> dict:
    """Quantize a .mnn file into another; returns the report (sizes, per-layer accuracy, skipped layers)."""
    from .data import calibration_samples
    from .ptq import quantize_int8
    from .report import auto_skip as run_auto_skip, layer_report, worst_first
    from .weight_only import compress_weights
    if config:
        cfg = _load_config(config)
        method = cfg.get("method", method)
        skip = list(skip) + list(cfg.get("skip", []))
        per_channel = cfg.get("per_channel", per_channel)
        batches = cfg.get("batches", batches)
        symmetric_activations = cfg.get("symmetric_activations", symmetric_activations)
    modes = sum([bool(int8), weight_bits is not None, bool(fp16)])
    if modes != 1:
        raise MnnToolError("choose exactly one of --int8, --weight-bits 8|4, --fp16")
    if block_size is not None and weight_bits is None:
        raise MnnToolError("--block-size applies to weight-only quantization: add --weight-bits 8|4")
    src, dst = Path(src), Path(dst)
    g = reader.load(src)
    skip = set(skip)
    names = {n.name for n in g.nodes} | {o for n in g.nodes for o in n.outputs}
    unknown = sorted(s for s in skip if s not in names)
    if unknown:
        raise MnnToolError(f"--skip names no layer of {src}: {', '.join(unknown)}")
    report: dict = {"source": str(src), "output": str(dst), "size_before": src.stat().st_size}
    held_out: list = []
    if int8:
        if calib is None:
            raise MnnToolError("--int8 needs calibration data: --calib DIR")
        samples = calibration_samples(calib, g, prep)
        if batches:
            samples = samples[:batches]
        held_out = samples[-max(1, len(samples) // 5):] if len(samples) > 1 else samples
        calib_set = samples[:-len(held_out)] if len(samples) > 1 else samples

        def quantize(extra_skip):
            return quantize_int8(g, calib_set, method, per_channel, skip | set(extra_skip), bias_correction,
                                 progress=progress, asymmetric=not symmetric_activations)
        if auto_skip is not None:
            q, skipped, acc = run_auto_skip(g, quantize, held_out, auto_skip)
            report["auto_skipped"] = skipped
        else:
            q = quantize(set())
            acc = layer_report(g, q, held_out)
        report.update(mode="int8", method=method, per_channel=per_channel, calibration_samples=len(calib_set),
                      held_out_samples=len(held_out), symmetric_activations=symmetric_activations)
    else:
        from ..inputs import random_feeds
        q = reader.load(src)
        n, blocked = compress_weights(q, weight_bits, fp16, asymmetric, skip, block_size)
        if n == 0:
            raise MnnToolError(f"{src}: no float convolution weights to compress")
        report.update(mode="fp16" if fp16 else f"weight-int{weight_bits}", asymmetric=asymmetric, layers=n,
                      block_size=block_size, block_layers=blocked)
        acc = layer_report(g, q, [random_feeds(g)])
    report["size_after"] = writer.save(q, dst)
    report["ratio"] = report["size_before"] / report["size_after"]
    report["outputs"] = acc["outputs"]
    report["layers"] = acc["layers"]
    report["worst_layers"] = [l["name"] for l in worst_first(acc)[:5]] if int8 else []
    report["int8_layers"] = sum(1 for l in acc["layers"] if l["int8"])
    return report
