"""Activation-aware weight quantization (AWQ, Lin et al. 2023) as a per-channel scale search, folded
into the model so the bundle stays MNN-LLM's plain format.

Input channels that carry large activations matter more than their weights' size says. For each group
of linear layers that read one input x, a scale s per input channel is searched:
    s = mean|x|^alpha (normalised), alpha on a grid in [0, 1]
    error(alpha) = || x W^T  -  x (Q(W diag(s)) diag(1/s))^T ||^2   on calibration tokens
The best s multiplies W's columns before quantization; 1/s goes into the op before it, which is exact
in float: the norm's gamma (and beta) for q/k/v and gate/up, up_proj's rows for down_proj (its input is
act(gate) * up), v_proj's rows for o_proj (one scale per v channel, shared by the query heads that
read it). alpha = 0 is plain quantization, so on the calibration tokens the search is never worse.

Calibration runs layer by layer with the float model (reference.py) just before each layer is written,
on the hidden states the float model gives at that layer's input.
"""
from __future__ import annotations

import numpy as np

from .families import Spec
from .quantize import dequantize, quantize
from .reference import LayerwiseModel

GRID = 20


class Calibrator:
    def __init__(self, spec: Spec, model: LayerwiseModel, sequences: list[np.ndarray], bits: int, block: int,
                 symmetric: bool, max_tokens: int = 512, grid: int = GRID):
        self.s, self.model = spec, model
        self.bits, self.block, self.symmetric = bits, block, symmetric
        self.max_tokens, self.grid = max_tokens, grid
        self.hidden = [model.embed(np.asarray(ids)) for ids in sequences]
        self.report: list[dict] = []

    def layer(self, i: int, w: dict) -> tuple[dict, dict]:
        """(scaled weights, {group: divisor for the norm before it}); advances the hidden states."""
        seen: dict[str, list] = {}

        def capture(group, x):
            seen.setdefault(group, []).append(x)
        self.hidden = [self.model.layer(i, h, w, capture) for h in self.hidden]
        xs = {g: self._sample(np.concatenate(v)) for g, v in seen.items()}
        w = dict(w)
        div = {}
        row = {"layer": i}
        s_qkv, row["qkv"] = self.search(xs["qkv"], [w["q"][0], w["k"][0], w["v"][0]])
        for k in "qkv":
            w[k] = (w[k][0] * s_qkv, w[k][1])
        div["qkv"] = s_qkv
        readers = ["gate", "up"] if "gate" in w else ["up"]
        s_ff, row["gate_up"] = self.search(xs["gate_up"], [w[k][0] for k in readers])
        for k in readers:
            w[k] = (w[k][0] * s_ff, w[k][1])
        div["gate_up"] = s_ff
        if "gate" in w:                 # down reads act(gate) * up: 1/s folds into up's rows
            s_d, row["down"] = self.search(xs["down"], [w["down"][0]])
            w["down"] = (w["down"][0] * s_d, w["down"][1])
            ub = w["up"][1]
            w["up"] = (w["up"][0] / s_d[:, None], None if ub is None else ub / s_d)
        s_o, row["o"] = self._search_o(xs["o"], w["o"][0])
        if s_o is not None:
            H, KV, D = self.s.heads, self.s.kv_heads, self.s.head_dim
            s_v = s_o.reshape(KV, H // KV, D)[:, 0].reshape(-1)
            w["o"] = (w["o"][0] * s_o, w["o"][1])
            vb = w["v"][1]
            w["v"] = (w["v"][0] / s_v[:, None], None if vb is None else vb / s_v)
        self.report.append(row)
        return w, div

    def _sample(self, x: np.ndarray) -> np.ndarray:
        if len(x) <= self.max_tokens:
            return x
        idx = np.linspace(0, len(x) - 1, self.max_tokens).astype(np.int64)
        return x[idx]

    def _search_o(self, x, w):
        """o_proj's scales constrained to one per v channel (GQA: the query heads of a group share v)."""
        H, KV, D = self.s.heads, self.s.kv_heads, self.s.head_dim
        mean = np.abs(x).mean(0).reshape(KV, H // KV, D).mean(1)
        mean = np.repeat(mean[:, None], H // KV, 1).reshape(-1)
        s, alpha = self.search(x, [w], mean)
        return (None, alpha) if alpha == 0 else (s, alpha)

    def search(self, x: np.ndarray, ws: list[np.ndarray], mean: np.ndarray | None = None):
        """(scale per input channel, the alpha chosen) for weights `ws` reading `x` (n, ic)."""
        w = np.concatenate(ws, 0)
        ref = x @ w.T
        mean = np.abs(x).mean(0) if mean is None else mean
        mean = np.maximum(mean, 1e-8).astype(np.float32)
        best, best_s, best_a = None, np.ones(w.shape[1], np.float32), 0.0
        for alpha in np.linspace(0, 1, self.grid, endpoint=False):
            s = mean ** alpha
            s = (s / np.sqrt(s.max() * s.min())).astype(np.float32)
            wq = dequantize(quantize(w * s, self.bits, self.block, self.symmetric)) / s
            err = float(np.mean((x @ wq.T - ref) ** 2))
            if best is None or err < best:
                best, best_s, best_a = err, s, float(alpha)
        return best_s, best_a
