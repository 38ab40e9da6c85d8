"""How much each layer's quantization costs the outputs, measured: the model run with only that layer
quantized (every other layer float) against the float model, on the same inputs.

Why measured and not estimated from the weights: a layer's weight rounding error says nothing of how
much of it survives to the outputs (a layer before a normalization or a residual sum loses most of it,
a classifier head passes all of it on). The errors of layers quantized together add up to first order,
so the per-layer errors rank layers for mixed precision (`--target-bits`) and for keeping layers float
(`--skip-budget`), as HAWQ and NNCF's mixed-precision search rank them.

The error is the outputs' relative squared error ||y - y_q||^2 / ||y||^2, summed over the outputs,
each output's sums merged over the samples (compare.Sums); 1 - cosine is half of it for small errors
without bias, and it adds over layers where the cosine does not.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..compare import Sums
from ..ir.graph import Graph
from ..runtime.session import Session


@dataclass(frozen=True)
class Sensitivity:
    """One layer's measured cost: the outputs' summed relative squared error and their worst cosine."""
    error: float
    cosine: float


def with_node(g: Graph, old, new) -> Graph:
    """The graph with node `old` replaced by `new`, sharing every other node and constant: what a
    one-layer measurement runs, at the cost of that layer's weights only."""
    return replace(g, nodes=[new if n is old else n for n in g.nodes])


def reference(g: Graph, feeds: list[dict], threads: int = 1) -> list[dict]:
    """The float model's outputs on each sample."""
    sess = Session(g, threads)
    return [sess.run(f) for f in feeds]


def measure_one(q: Graph, feeds: list[dict], ref: list[dict], outputs: list[str], threads: int = 1) -> Sensitivity:
    """The outputs of `q` against the reference outputs, over all samples."""
    sess = Session(q, threads)
    sums = [[] for _ in outputs]
    for f, r in zip(feeds, ref):
        got = sess.run(f)
        for i, name in enumerate(outputs):
            sums[i].append(Sums.of(r[name], got[name]))
    error, cosine = 0.0, 1.0
    for parts in sums:
        t = Sums.total(parts)
        m = t.metrics()
        error += t.ee / t.aa if t.aa else t.ee
        cosine = min(cosine, m["cosine"])
    return Sensitivity(error, cosine)


def measure(g: Graph, layers: list[str], only, feeds: list[dict], threads: int = 1, progress=None,
            ref: list[dict] | None = None) -> dict[str, Sensitivity]:
    """{layer: its Sensitivity}; `only(name)` gives the graph with only that layer quantized."""
    ref = ref if ref is not None else reference(g, feeds, threads)
    out = {}
    for name in layers:
        out[name] = measure_one(only(name), feeds, ref, list(g.outputs), threads)
        if progress:
            progress(1)
    return out


def macs(g: Graph, layers: list, feeds: dict, threads: int = 1) -> dict[str, int]:
    """Multiply-adds of each weighted layer on one sample: its weights times the outputs each weight is
    used for (a convolution's output pixels, a linear layer's rows)."""
    every = Session(g, threads).run(feeds, keep_all=True)
    out = {}
    for n in layers:
        w = int(np.asarray(n.param["weight"]).size)
        y = every.get(n.outputs[0])
        rows = int(n.param["common"]["outputCount"])
        out[n.name] = w * (int(np.asarray(y).size) // rows if y is not None and rows else 1)
    return out
