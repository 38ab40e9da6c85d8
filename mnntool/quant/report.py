"""How much did quantization cost? Per-layer cosine vs the fp32 model on held-out samples, and the
mixed-precision search that keeps the fewest layers in float to meet an output target."""
from __future__ import annotations

from ..compare import Sums
from ..ir.graph import Graph
from ..ir.ops import is_convolution
from ..runtime.session import Session


def _sample_sums(samples: list[dict], fp32: Graph, quant: Graph, threads: int = 1) -> list[dict]:
    """For each sample, {tensor: Sums} of every conv output and final output, fp32 against quantized."""
    from .equalize import divisors, original_name
    names = [n.outputs[0] for n in quant.nodes if is_convolution(n.op)] + list(quant.outputs)
    ref_s, q_s = Session(fp32, threads), Session(quant, threads)
    scaled = divisors(quant)        # layers whose output int8 equalization rescaled per channel
    out = []
    for feeds in samples:
        a, b = ref_s.run(feeds, keep_all=True), q_s.run(feeds, keep_all=True)
        for k, d in scaled.items():
            src = original_name(quant, k)       # equalization renamed the tensors it rescaled
            if src in a:
                a[k] = a[src] / d.reshape(1, -1, 1, 1).astype(a[src].dtype)
        out.append({k: Sums.of(a[k], b[k]) for k in names if k in a and k in b})
    return out


def layer_report(fp32: Graph, quant: Graph, samples: list[dict], threads: int = 1, pool=None) -> dict:
    """Cosine of every conv output and of the final outputs, over all held-out samples together: sums
    per sample merged in sample order, so a `pool` of worker processes or Ray tasks (shards.pool) gives
    the same numbers bit for bit (and --auto-skip the same choices)."""
    if pool is not None and len(samples) > 1:
        from .shards import split_map
        per_sample = split_map(pool, _sample_sums, samples, fp32, quant, threads)
    else:
        per_sample = _sample_sums(samples, fp32, quant, threads)

    def total(k):
        parts = [s[k] for s in per_sample if k in s]
        return Sums.total(parts).metrics() if parts else None
    layers = []
    for n in quant.nodes:
        if not is_convolution(n.op) or (m := total(n.outputs[0])) is None:
            continue
        layers.append({"name": n.name, "tensor": n.outputs[0], "op": n.op, "int8": "symmetricQuan" in n.param,
                       "cosine": m["cosine"], "max_abs": m["max_abs"]})
    outputs = [{"name": k, **total(k)} for k in quant.outputs]
    return {"layers": layers, "outputs": outputs, "samples": len(samples)}


def worst_first(report: dict) -> list[dict]:
    return sorted([l for l in report["layers"] if l["int8"]], key=lambda l: l["cosine"])


def auto_skip(fp32: Graph, quantize, held_out: list[dict], target: float, progress=None,
              threads: int = 1, pool=None) -> tuple[Graph, list, dict]:
    """Mixed precision: rank the int8 layers by the error each adds (its output cosine minus its input's),
    then binary-search the fewest of the worst-ranked to keep in float so every output cosine >= target."""
    q = quantize(set())
    rep = layer_report(fp32, q, held_out, threads, pool)
    if min(o["cosine"] for o in rep["outputs"]) >= target:
        return q, [], rep
    by_tensor = {l["tensor"]: l["cosine"] for l in rep["layers"]}
    producers = {n.outputs[0]: n for n in q.nodes}

    def added_error(layer):
        node = producers.get(layer["tensor"])
        upstream = by_tensor.get(node.inputs[0], 1.0) if node is not None else 1.0
        return layer["cosine"] - upstream
    ranked = [l["name"] for l in sorted((l for l in rep["layers"] if l["int8"]), key=added_error)]
    lo, hi = 1, len(ranked)
    import copy
    best = (copy.deepcopy(fp32), ranked, None)     # all in float always meets the target
    while lo <= hi:
        k = (lo + hi) // 2
        cand = quantize(set(ranked[:k]))
        cand_rep = layer_report(fp32, cand, held_out, threads, pool)
        if progress:
            progress(k, cand_rep)
        if min(o["cosine"] for o in cand_rep["outputs"]) >= target:
            best = (cand, ranked[:k], cand_rep)
            hi = k - 1
        else:
            lo = k + 1
    q, skipped, rep = best
    return q, skipped, rep if rep is not None else layer_report(fp32, q, held_out, threads, pool)
