"""`quant --skip-budget P` (with or without `--auto-skip X`, and weight-only `--auto-skip X`): layers
kept float, chosen by measured sensitivity. With X, the fewest that bring every output to cosine X; with
P, never more than P% of the model's convolution weights (or multiply-adds); with both, the fewest
within the budget that reach X, or the best the budget allows when it does not reach X (the report's
`target_met: false`).

Each candidate's sensitivity is measured (quant.sensitivity), only when the model with every layer
quantized misses X: in weight-only quantization, the output error with only that layer quantized
("isolated"); in int8, the error the full int8 model loses when only that layer is kept float
("leave-one-out", see int8_gains). Layers are tried most sensitive first; with a budget, only the set
that removes the most measured error within it (bit_budget.knapsack). The search is a binary search over
that list's prefixes.

In int8, `--auto-skip X` alone keeps report.auto_skip's cheaper ranking (the error each layer adds in
the full int8 model, one quantization per search step); the measured one costs a quantization per layer
(calibration statistics shared, the grid search and the equalization passes not) and is worth it: on the
ResNet-18 fixture at X = 0.9995 the cheaper ranking kept 10 layers (41.8% of the weights) float, the
measured one (`--skip-budget 100 --auto-skip X`) 1 layer (0.3%), both reaching X
(benchmarks/mixed_precision.py --int8-auto-skip).

Candidates: in int8 the layers auto-skip may keep float (ptq.targets: not those int8 keeps float by rule
or --skip names; those are not counted against the budget either); in weight-only every weighted
convolution not in --skip (kept float: fp32 weights).
"""
from __future__ import annotations

import copy
from fractions import Fraction

import numpy as np

from ..ir.graph import Graph
from . import ptq
from .bit_budget import knapsack, quantized_node
from .compression_params import LayerPlan, conv_layers
from .report import layer_report
from .sensitivity import Sensitivity, macs, measure, measure_one, reference, with_node
from .weight_only import compress_weights, head_layers


def ranked(sens: dict, size: dict, limit: int | None) -> list[str]:
    """The layers to keep float, in the order the search adds them (most measured error first); with a
    `limit` (total size), only those of the set that removes the most error within it (knapsack)."""
    by_error = sorted(sens, key=lambda name: (-sens[name].error, name))
    if limit is None:
        return by_error
    chosen = set(knapsack({name: s.error for name, s in sens.items()}, size, limit))
    return [name for name in by_error if name in chosen]


def _worst(rep: dict) -> float:
    return min((o["cosine"] for o in rep["outputs"]), default=1.0)


def search(fp32: Graph, quantize, held: list[dict], order: list[str], target: float | None, threads: int = 1,
           pool=None, none=None) -> tuple[Graph, list, dict]:
    """The fewest of `order` (a prefix) kept float for every output cosine >= target, by binary search;
    with no prefix reaching it, the best prefix tried. No target: all of `order`. `none`: the model with
    no layer kept float and its report, when already made."""
    if target is None:
        q = quantize(set(order))
        return q, list(order), layer_report(fp32, q, held, threads, pool)
    q, rep = none or _evaluated(fp32, quantize, held, threads, pool)
    if _worst(rep) >= target or not order:
        return q, [], rep
    best, best_met = (q, [], rep), False
    lo, hi = 1, len(order)
    while lo <= hi:
        k = (lo + hi) // 2
        cand = quantize(set(order[:k]))
        cand_rep = layer_report(fp32, cand, held, threads, pool)
        if _worst(cand_rep) >= target:
            best, best_met = (cand, order[:k], cand_rep), True
            hi = k - 1
        else:
            if not best_met and _worst(cand_rep) > _worst(best[2]):
                best = (cand, order[:k], cand_rep)
            lo = k + 1
    return best


def _evaluated(fp32: Graph, quantize, held, threads, pool) -> tuple[Graph, dict]:
    q = quantize(set())
    return q, layer_report(fp32, q, held, threads, pool)


def int8_gains(g: Graph, q8, candidates: list[str], held: list[dict], threads: int = 1, progress=None) -> dict:
    """{layer: Sensitivity}: each candidate's measured gain, leave one out: the full int8 model's output
    error minus that of the model with only this layer float. A layer alone in int8 among float ones
    measures something else: its input and output are quantized on their own, not on grids its int8
    neighbours share (on the test model: 6e-4 error for each layer alone, 1.7e-4 for all together)."""
    ref = reference(g, held, threads)
    full = measure_one(q8(()), held, ref, list(g.outputs), threads)
    gains = {}
    for name in candidates:
        s = measure_one(q8({name}), held, ref, list(g.outputs), threads)
        gains[name] = Sensitivity(full.error - s.error, s.cosine)
        if progress:
            progress(1)
    return gains


def choose_int8(g: Graph, quantize, calib_set, held: list[dict], cfg, skip: set, pool=None, progress=None):
    """choose() for int8. `quantize(extra_skip, stats)` is quantize_file's int8 quantizer; the
    calibration statistics are collected once for every quantization here (ptq.calibrate's `stats`)."""
    nodes = ptq.targets(g, skip)
    names = sorted({n.inputs[0] for n in nodes} | {n.outputs[0] for n in nodes})
    stats = ptq.collect(g, calib_set, names, [(n.name, n.inputs[0]) for n in nodes], cfg.threads)

    def q8(extra):
        return quantize(set(extra), stats)
    return choose(g, q8, lambda: int8_gains(g, q8, [n.name for n in nodes], held, cfg.threads, progress), held,
                  cfg.auto_skip, cfg.skip_budget, cfg.skip_budget_by, cfg.threads, pool, "leave-one-out")


def choose_weight_only(g: Graph, cfg, skip: set, head_bits: int | None, samples: list[dict], progress=None):
    """(layers to keep float, the report's record) for weight-only --auto-skip / --skip-budget."""
    heads = head_layers(g) if head_bits else set()
    nodes = {n.name: n for n in conv_layers(g) if n.name not in skip and n.outputs[0] not in skip}

    def only(name):
        lp = LayerPlan(head_bits if name in heads else cfg.weight_bits, cfg.block_size, cfg.asymmetric or cfg.hqq)
        return with_node(g, nodes[name], quantized_node(nodes[name], lp, cfg.hqq))

    def quantize(extra):
        q = copy.deepcopy(g)
        compress_weights(q, cfg.weight_bits, False, cfg.asymmetric, skip | set(extra), cfg.block_size, cfg.hqq,
                         head_bits)
        return q
    _, chosen, _, info = choose(g, quantize, lambda: measure(g, list(nodes), only, samples, cfg.threads, progress),
                                samples, cfg.auto_skip, cfg.skip_budget, cfg.skip_budget_by, cfg.threads, None,
                                "isolated")
    return chosen, info


def sizes(g: Graph, by: str, feeds: dict, threads: int = 1, candidates=()) -> dict[str, int]:
    """Every weighted convolution's (and candidate's) weights or multiply-adds (on one sample): the
    budget is a share of the whole model's, whichever layers are candidates."""
    layers = conv_layers(g)
    known = {n.name for n in layers}
    layers += [n for n in g.nodes if n.name in set(candidates) - known]
    if by == "weights":
        return {n.name: int(np.asarray(n.param["weight"]).size) for n in layers}
    return macs(g, layers, feeds, threads)


def choose(g: Graph, quantize, gains, held: list[dict], target: float | None, budget: float | None,
           by: str = "weights", threads: int = 1, pool=None, ranking: str = "isolated"):
    """(quantized model, layers kept float, its layer report, what was chosen and why for the report).
    `gains()`: {candidate: Sensitivity}, the output error keeping each float removes (measured), asked
    only when the model with every layer quantized misses the target (or there is no target)."""
    none = None
    if target is not None:
        none = _evaluated(g, quantize, held, threads, pool)
        if _worst(none[1]) >= target:
            return none[0], [], none[1], {"ranking": ranking, "by": by, "budget_percent": budget, "used": 0,
                                          "used_percent": 0.0, "target": target, "target_met": True}
    gains = gains()
    size = sizes(g, by, held[0], threads, list(gains))
    total = sum(size.values())
    limit = None if budget is None else int(Fraction(budget) / 100 * total)
    order = ranked(gains, size, limit)
    q, skipped, rep = search(g, quantize, held, order, target, threads, pool, none)
    used = sum(size[name] for name in skipped)
    info = {"ranking": ranking, "by": by, "budget_percent": budget, "limit": limit, "total": total,
            "used": used, "used_percent": 100.0 * used / total if total else 0.0, "target": target,
            "target_met": None if target is None else _worst(rep) >= target,
            "sensitivity": {name: {"error_removed": s.error, "cosine": s.cosine, by: size[name]}
                            for name, s in gains.items()}}
    return q, skipped, rep, info
