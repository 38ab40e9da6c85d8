"""Mixed 4/8-bit weight-only plans (`quant --target-bits`) against plans of the same size chosen at random,
and against uniform int4 (`--weight-bits 4`, heads at 8) and int8: output cosine vs fp32 on held-out
inputs the plan was not measured on, with the stored bits per weight (scales counted) of each.

    python benchmarks/mixed_precision.py [--models resnet18 mobilenetv2] [--targets 4.6 5 6]
                                         [--random 5] [--measure 2] [--held-out 4]

`--int8-auto-skip X` instead compares, for int8, `--auto-skip X` (layers ranked by the error each adds in
the full int8 model) with `--skip-budget 100 --auto-skip X` (ranked by measured leave-one-out gains):
layers and weights kept float, output cosine on the held-out samples (`--calib N` N(0,1) samples, the
last fifth held out by quant):

    python benchmarks/mixed_precision.py --int8-auto-skip 0.9999 [--models resnet18] [--calib 10]

Inputs are seeded N(0,1) (measurement seeds 0.., held-out seeds 1000..): the fixtures have random
weights, so no real data exists for them. Prints one JSON object.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.wide_speed import cpu_name  # noqa: E402
from fixtures.models import build  # noqa: E402
from mnntool.api import convert  # noqa: E402
from mnntool.format import reader  # noqa: E402
from mnntool.quant import QuantConfig, quantize_file  # noqa: E402
from mnntool.quant.bit_budget import quantized_node, stored_bits  # noqa: E402
from mnntool.quant.compression_params import LayerPlan, conv_layers  # noqa: E402
from mnntool.quant.describe import describe  # noqa: E402
from mnntool.quant.weight_only import compress_weights  # noqa: E402
from mnntool.runtime.session import Session  # noqa: E402


def _feeds(g, seed):
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(g.tensors[name].shape).astype(np.float32) for name in g.inputs}


def _cosines(g, q, held) -> dict:
    ref, got = Session(g), Session(q)
    c = []
    for f in held:
        a, b = ref.run(f), got.run(f)
        c.append(min(float(np.dot(a[k].ravel().astype(np.float64), b[k].ravel()) /
                           (np.linalg.norm(a[k]) * np.linalg.norm(b[k]))) for k in g.outputs))
    return {"worst": min(c), "mean": float(np.mean(c))}


def _random_plan(src, costs, budget, rng) -> dict:
    names = list(costs)
    plan = {name: 4 for name in names}
    spent = sum(c[4] for c in costs.values())
    for name in rng.permutation(names):
        extra = costs[name][8] - costs[name][4]
        if spent + extra <= budget:
            plan[name], spent = 8, spent + extra
    return plan


def _with(src, bits_of):
    q = reader.load(src)
    compress_weights(q, 8, plan={name: LayerPlan(b) for name, b in bits_of.items()})
    return q


def run_model(name, targets, n_random, n_measure, n_held, folder) -> dict:
    src = folder / f"{name}.mnn"
    convert(build(name, ROOT / "build" / "fixtures"), src)
    g = reader.load(src)
    measure = [_feeds(g, s) for s in range(n_measure)]
    held = [_feeds(g, 1000 + s) for s in range(n_held)]
    costs = {n.name: {b: stored_bits(quantized_node(n, LayerPlan(b))) for b in (4, 8)} for n in conv_layers(g)}
    total = describe(g)["weights"]
    out = {"model": name, "layers": len(costs), "weights": total, "uniform": {}, "targets": []}
    for bits in (4, 8):
        quantize_file(src, folder / f"u{bits}.mnn", QuantConfig(weight_bits=bits))
        q = reader.load(folder / f"u{bits}.mnn")
        out["uniform"][f"int{bits}"] = {"bits_per_weight": describe(q)["bits_per_weight_stored"],
                                        **_cosines(g, q, held)}
    rng = np.random.default_rng(0)
    for t in targets:
        rep = quantize_file(src, folder / "t.mnn", QuantConfig(target_bits=t, calib=measure))
        q = reader.load(folder / "t.mnn")
        row = {"target": t, "bits_per_weight": describe(q)["bits_per_weight_stored"],
               "eight_bit_layers": sum(r["bits"] == 8 for r in rep["bit_plan"]["plan"]),
               "planned": _cosines(g, q, held), "random": []}
        for _ in range(n_random):
            plan = _random_plan(src, costs, t * total, rng)
            rq = _with(src, plan)
            row["random"].append({"bits_per_weight": describe(rq)["bits_per_weight_stored"], **_cosines(g, rq, held)})
        out["targets"].append(row)
        print(json.dumps(row), file=sys.stderr)
    return out


def int8_skip(name, target, n_calib, folder) -> dict:
    src = folder / f"{name}.mnn"
    convert(build(name, ROOT / "build" / "fixtures"), src)
    g = reader.load(src)
    calib = [_feeds(g, 2000 + s) for s in range(n_calib)]
    sizes = {n.name: int(np.asarray(n.param["weight"]).size) for n in conv_layers(g)}
    total = sum(sizes.values())
    out = {"model": name, "target": target, "calibration_samples": n_calib}
    for label, extra in (("added_error", {}), ("measured", {"skip_budget": 100.0})):
        rep = quantize_file(src, folder / "i.mnn", QuantConfig(int8=True, calib=calib, auto_skip=target, **extra))
        out[label] = {"float_layers": len(rep["auto_skipped"]),
                      "float_weights_percent": 100.0 * sum(sizes[x] for x in rep["auto_skipped"]) / total,
                      "output_cosine": min(o["cosine"] for o in rep["outputs"])}
    print(json.dumps(out), file=sys.stderr)
    return out


def _table(results: list, int8: bool) -> dict:
    """The results as columns and rows (tools/results_tables.py renders them in the docs)."""
    if int8:
        columns = ["model", "--auto-skip", "ranking", "layers kept float", "weights kept float", "output cosine"]
        rows = [[r["model"], r["target"], label, r[key]["float_layers"], f"{r[key]['float_weights_percent']:.1f}%",
                 f"{r[key]['output_cosine']:.5f}"]
                for r in results for key, label in (("added_error", "error each adds (--auto-skip alone)"),
                                                    ("measured", "measured (--skip-budget 100)"))]
        return {"columns": columns, "rows": rows}
    columns = ["model", "quantization", "bits per weight", "worst output cosine",
               "random plans, same budget: bits / worst cosine"]
    rows = []
    for r in results:
        for k, u in r["uniform"].items():
            rows.append([r["model"], f"--weight-bits {k[3:]}", f"{u['bits_per_weight']:.3f}", f"{u['worst']:.5f}", ""])
        for t in r["targets"]:
            rand = t["random"]
            rows.append([r["model"], f"--target-bits {t['target']:g}", f"{t['bits_per_weight']:.3f}",
                         f"{t['planned']['worst']:.5f}",
                         f"{min(x['bits_per_weight'] for x in rand):.2f}-{max(x['bits_per_weight'] for x in rand):.2f}"
                         f" / {min(x['worst'] for x in rand):.5f}-{max(x['worst'] for x in rand):.5f}"])
    return {"columns": columns, "rows": rows}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["resnet18", "mobilenetv2"])
    ap.add_argument("--targets", nargs="+", type=float, default=[4.6, 5.0, 6.0])
    ap.add_argument("--random", type=int, default=5)
    ap.add_argument("--measure", type=int, default=2)
    ap.add_argument("--held-out", type=int, default=4)
    ap.add_argument("--int8-auto-skip", type=float)
    ap.add_argument("--calib", type=int, default=10)
    ap.add_argument("--json", help="also write the results, with a table of them, to this file")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        if a.int8_auto_skip is not None:
            results = [int8_skip(m, a.int8_auto_skip, a.calib, Path(d)) for m in a.models]
        else:
            results = [run_model(m, a.targets, a.random, a.measure, a.held_out, Path(d)) for m in a.models]
    out = {"cpu": cpu_name(), "cores": os.cpu_count(), "date": datetime.date.today().isoformat(),
           "command": "python benchmarks/mixed_precision.py " + " ".join(sys.argv[1:]),
           **_table(results, a.int8_auto_skip is not None), "results": results}
    print(json.dumps(out))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
