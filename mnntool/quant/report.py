"""How much did quantization cost? Per-layer cosine vs the fp32 model on held-out samples, and the
mixed-precision search that keeps the fewest layers in float to meet an output target."""
from __future__ import annotations

import numpy as np

from ..compare import metrics
from ..ir.graph import Graph
from ..runtime.session import Session


def layer_report(fp32: Graph, quant: Graph, samples: list[dict], threads: int = 1) -> dict:
    """Cosine of every conv output and of the final outputs, over all held-out samples together."""
    convs = [n for n in quant.nodes if n.op in ("Convolution", "ConvolutionDepthwise")]
    names = [n.outputs[0] for n in convs] + list(quant.outputs)
    ref_s, q_s = Session(fp32, threads), Session(quant, threads)
    ref, got = {k: [] for k in names}, {k: [] for k in names}
    for feeds in samples:
        a, b = ref_s.run(feeds, keep_all=True), q_s.run(feeds, keep_all=True)
        for k in names:
            if k in a and k in b:
                ref[k].append(np.asarray(a[k]).ravel())
                got[k].append(np.asarray(b[k]).ravel())
    layers = []
    for n in convs:
        k = n.outputs[0]
        if not ref[k]:
            continue
        m = metrics(np.concatenate(ref[k]), np.concatenate(got[k]))
        layers.append({"name": n.name, "tensor": k, "op": n.op, "int8": "symmetricQuan" in n.param,
                       "cosine": m["cosine"], "max_abs": m["max_abs"]})
    outputs = []
    for k in quant.outputs:
        m = metrics(np.concatenate(ref[k]), np.concatenate(got[k]))
        outputs.append({"name": k, **m})
    return {"layers": layers, "outputs": outputs, "samples": len(samples)}


def worst_first(report: dict) -> list[dict]:
    return sorted([l for l in report["layers"] if l["int8"]], key=lambda l: l["cosine"])


def auto_skip(fp32: Graph, quantize, held_out: list[dict], target: float, progress=None,
              threads: int = 1) -> tuple[Graph, list, dict]:
    """Mixed precision: rank the int8 layers by the error each adds (its output cosine minus its input's),
    then binary-search the fewest of the worst-ranked to keep in float so every output cosine >= target."""
    q = quantize(set())
    rep = layer_report(fp32, q, held_out, threads)
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
        cand_rep = layer_report(fp32, cand, held_out, threads)
        if progress:
            progress(k, cand_rep)
        if min(o["cosine"] for o in cand_rep["outputs"]) >= target:
            best = (cand, ranked[:k], cand_rep)
            hi = k - 1
        else:
            lo = k + 1
    q, skipped, rep = best
    return q, skipped, rep if rep is not None else layer_report(fp32, q, held_out, threads)
