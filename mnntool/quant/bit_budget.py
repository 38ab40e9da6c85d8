"""`quant --target-bits B`: weight-only widths chosen layer by layer so the model's weights average at
most B bits, the extra bits going where they buy the most accuracy (NNCF's `ratio` of int4 to int8
layers; llama.cpp's per-tensor types in its Q4_K_M-style mixes).

Each layer's sensitivity is measured (quant.sensitivity: the outputs with only that layer at the low
width, on calibration or seeded random inputs). Starting from every layer at the low width, layers take
the high width so that the measured error they remove is largest within the budget (knapsack: the 0/1
knapsack over the layers, since the errors of layers add to first order).

Bits per weight count what the file stores for the weights, as `info --quant` reads it back
(describe.SCALE_BITS): the codes plus each float32 scale (and minimum, when asymmetric), as llama.cpp's
bpw counts each block's scale, over every layer that holds weights (layers kept float at 32 bits).
"""
from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

import numpy as np

from ..errors import MnnToolError
from ..ir.graph import Graph
from .compression_params import LayerPlan, conv_layers
from .describe import layer as describe_layer
from .sensitivity import measure_one, reference, with_node
from .weight_only import compress_weights

WIDTHS = (4, 8)     # what a layer can take (MNN's weight-only int4 and int8)
STEPS = 4096        # the knapsack's resolution: the extra-bit room in this many steps


def quantized_node(n, lp: LayerPlan, hqq: bool = False):
    """A copy of convolution `n` with its weights stored as `lp` says (the original is left as it is)."""
    copy = replace(n, param=dict(n.param))
    compress_weights(Graph(nodes=[copy]), 8, plan={n.name: lp}, hqq=hqq)     # (the plan sets the bits)
    return copy


def stored_bits(node) -> int:
    """Bits the file spends on this layer's weights (describe: codes + float32 scales)."""
    return int(describe_layer(node)["stored_bits"])


def _fixed(g: Graph, planned: set) -> tuple[int, int]:
    """(stored bits, weights) of the layers with weights the plan does not choose for: as they are."""
    bits = weights = 0
    for n in g.nodes:
        if id(n) in planned:
            continue
        x = describe_layer(n)
        if x is not None and x["weights"]:
            bits, weights = bits + x["stored_bits"], weights + x["weights"]
    return bits, weights


def knapsack(gain: dict, cost: dict, room: int) -> list[str]:
    """The layers whose summed gain is largest within `room` (here: raised to 8 bits, the most measured
    error removed within the extra bits; skip_budget: kept float within the float budget): the 0/1
    knapsack by dynamic programming over the room in STEPS steps (each cost rounded up, so the room is
    never passed), then any layer that still fits, by gain per unit. Greedy by gain per bit alone can
    leave out a large layer that would have removed more than the small ones it took."""
    if room <= 0:
        return []
    names = sorted(gain)
    unit = -(-room // STEPS)
    cap = room // unit
    steps = [-(-cost[k] // unit) for k in names]
    best = np.zeros(cap + 1)
    take = np.zeros((len(names), cap + 1), bool)
    for i, (k, w) in enumerate(zip(names, steps)):
        if w > cap:
            continue
        cand = best[:cap + 1 - w] + gain[k]          # from the row before this layer
        better = cand > best[w:]
        take[i, w:] = better
        best[w:] = np.where(better, cand, best[w:])
    chosen, c = [], cap
    for i in reversed(range(len(names))):
        if take[i, c]:
            chosen.append(names[i])
            c -= steps[i]
    used = sum(cost[k] for k in chosen)
    for k in sorted(set(names) - set(chosen), key=lambda k: (-gain[k] / max(cost[k], 1), k)):
        if used + cost[k] <= room:
            chosen.append(k)
            used += cost[k]
    return chosen


def plan_target_bits(g: Graph, target: float, feeds: list[dict], block: int | None = None,
                     asymmetric: bool = False, hqq: bool = False, skip=frozenset(),
                     pinned: dict | None = None, threads: int = 1, progress=None) -> tuple[dict, dict]:
    """({layer: LayerPlan} for every weighted convolution, the report): the layers in `skip` float,
    those in `pinned` ({name: bits}) at their bits, the others at 4 or 8 bits for an average <= target."""
    low, high = WIDTHS
    layers = conv_layers(g)
    pinned = pinned or {}
    plan: dict[str, LayerPlan] = {}
    free, base_bits, extra, weights, sens = [], 0, {}, {}, {}
    fixed_bits, fixed_weights = _fixed(g, {id(n) for n in layers if n.name not in skip and
                                           n.outputs[0] not in skip})
    ref = reference(g, feeds, threads)
    for n in layers:
        if n.name in skip or n.outputs[0] in skip:
            plan[n.name] = LayerPlan(0)
            continue
        weights[n.name] = int(describe_layer(n)["weights"])
        if n.name in pinned:
            plan[n.name] = LayerPlan(pinned[n.name], block, asymmetric)
            base_bits += stored_bits(quantized_node(n, plan[n.name], hqq))
            continue
        lo_node = quantized_node(n, LayerPlan(low, block, asymmetric), hqq)
        lo = stored_bits(lo_node)
        extra[n.name] = stored_bits(quantized_node(n, LayerPlan(high, block, asymmetric), hqq)) - lo
        base_bits += lo
        sens[n.name] = measure_one(with_node(g, n, lo_node), feeds, ref, list(g.outputs), threads)
        free.append(n.name)
        plan[n.name] = LayerPlan(low, block, asymmetric)
        if progress:
            progress(1)
    total_weights = fixed_weights + sum(weights.values())
    if not free:
        raise MnnToolError("--target-bits: the model has no float convolution weights to give 4 or 8 bits")
    budget = Fraction(target) * total_weights          # exact: the average never passes the target
    spent = fixed_bits + base_bits
    if spent > budget:
        raise MnnToolError(f"--target-bits {target:g}: the fewest bits this model's weights can take is "
                           f"{spent / total_weights:.4f} per weight (every layer at {low} bits"
                           f"{', the output layers at their --head-bits' if pinned else ''}, scales counted"
                           f"{', float layers at 32' if fixed_weights else ''}); give at least that")
    for name in knapsack({name: sens[name].error for name in free}, extra, int(budget - spent)):
        plan[name] = LayerPlan(high, block, asymmetric)
        spent += extra[name]
    rows = [{"name": n.name, "weights": weights.get(n.name, 0), "bits": plan[n.name].bits,
             "chosen": n.name in sens, "error_at_low": sens[n.name].error if n.name in sens else None,
             "cosine_at_low": sens[n.name].cosine if n.name in sens else None} for n in layers]
    report = {"target_bits": target, "achieved_bits_per_weight": spent / total_weights, "widths": list(WIDTHS),
              "weights": total_weights, "stored_bits": int(spent), "plan": rows}
    return plan, report
