"""The decoder in float32 numpy, one layer at a time, straight from the checkpoint: the activations
data-aware quantization (AWQ) calibrates on, without torch or transformers.

Layer-at-a-time because export streams: layer i's calibration runs just before layer i is written,
on the hidden states the float model gives at its input, and only that layer's weights are in memory.
Each linear group's input is handed to `capture(group, x)`:
    "qkv"      the attention's normed input            (q, k, v read it)
    "o"        the attention output, before o_proj
    "gate_up"  the MLP's normed input                  (gate, up or fc read it)
    "down"     the MLP's activation, before down_proj
"""
from __future__ import annotations

import numpy as np

from .families import Spec


def _rms(x, g, eps):
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * g


def _ln(x, g, b, eps):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * g + b


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def _gelu(x):
    from math import erf, sqrt
    return 0.5 * x * (1 + np.vectorize(erf)(x / sqrt(2)).astype(np.float32))


def _silu(x):
    return x / (1 + np.exp(-x))


ACT = {"silu": _silu, "gelu_tanh": _gelu_tanh, "gelu": _gelu}


class LayerwiseModel:
    """`tensor(name, shape)` reads a checked float32 tensor (the Decoder's accessor)."""

    def __init__(self, spec: Spec, tensor, maybe):
        self.s, self.tensor, self.maybe = spec, tensor, maybe

    def norm(self, x, base, dim):
        s = self.s
        g = self.tensor(base, (dim,)) + np.float32(s.norm_offset)
        if s.norm == "layer":
            return _ln(x, g, self.tensor(base.rsplit(".", 1)[0] + ".bias", (dim,)), s.eps)
        return _rms(x, g, s.eps)

    def linear(self, x, w, b):
        y = x @ w.T
        return y + b if b is not None else y

    def embed(self, ids: np.ndarray) -> np.ndarray:
        s = self.s
        x = self.tensor(s.names["embed"], (s.vocab, s.hidden))[ids] * np.float32(s.embed_scale)
        if s.learned_positions:
            x = x + self.tensor(s.names["positions"], (s.max_positions, s.hidden))[np.arange(len(ids))]
        return x.astype(np.float32)

    def rope(self, x, kind, pos):
        """x (T, heads, D) rotated as transformers' rotate_half does."""
        if kind is None:
            return x
        r = self.s.ropes[kind]
        f = pos[:, None].astype(np.float32) * r.inv_freq[None]
        emb = np.concatenate([f, f], -1)
        cos, sin = (np.cos(emb) * r.scaling)[:, None], (np.sin(emb) * r.scaling)[:, None]
        rd = r.rotary_dim
        xr, rest = x[..., :rd], x[..., rd:]
        x1, x2 = xr[..., :rd // 2], xr[..., rd // 2:]
        y = xr * cos + np.concatenate([-x2, x1], -1) * sin
        return np.concatenate([y, rest], -1) if rest.shape[-1] else y

    def layer(self, i: int, h: np.ndarray, weights: dict, capture=None) -> np.ndarray:
        """One decoder layer on one sequence h (T, hidden). `weights` holds this layer's float linear
        weights by role (q, k, v, o, gate, up, down; (w, b) pairs) as the exporter read them."""
        s = self.s
        L, H, KV, D = s.names, s.heads, s.kv_heads, s.head_dim
        cap = capture or (lambda g, x: None)
        T = h.shape[0]
        x = self.norm(h, L["in_norm"].format(i=i), s.hidden)
        cap("qkv", x)
        q = self.linear(x, *weights["q"]).reshape(T, H, D)
        k = self.linear(x, *weights["k"]).reshape(T, KV, D)
        v = self.linear(x, *weights["v"]).reshape(T, KV, D)
        if s.qk_norm:
            q = self.norm(q, L["q_norm"].format(i=i), D)
            k = self.norm(k, L["k_norm"].format(i=i), D)
        pos = np.arange(T)
        q, k = self.rope(q, s.layer_rope[i], pos), self.rope(k, s.layer_rope[i], pos)
        scale = s.attn_scale if s.attn_scale is not None else D ** -0.5
        rep = H // KV
        kk, vv = np.repeat(k, rep, 1), np.repeat(v, rep, 1)
        att = (q.transpose(1, 0, 2) @ kk.transpose(1, 2, 0)) * np.float32(scale)      # (heads, T, T)
        if s.attn_softcap:
            att = np.tanh(att / s.attn_softcap) * s.attn_softcap
        allowed = pos[None, :] <= pos[:, None]
        if s.sliding[i]:
            allowed &= pos[None, :] > pos[:, None] - s.sliding[i]
        att = np.where(allowed[None], att, -np.inf)
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        o_in = (att.astype(np.float32) @ vv.transpose(1, 0, 2)).transpose(1, 0, 2).reshape(T, H * D)
        cap("o", o_in)
        a = self.linear(o_in, *weights["o"])
        if s.sandwich:
            a = self.norm(a, L["post_norm"].format(i=i), s.hidden)
            h = h + a
            x = self.norm(h, L["pre_ff_norm"].format(i=i), s.hidden)
        else:
            h = h + a
            x = self.norm(h, L["post_norm"].format(i=i), s.hidden)
        cap("gate_up", x)
        act = ACT[s.act]
        up = self.linear(x, *weights["up"])
        m = act(self.linear(x, *weights["gate"])) * up if "gate" in weights else act(up)
        cap("down", m)
        d = self.linear(m, *weights["down"])
        if s.sandwich:
            d = self.norm(d, L["post_ff_norm"].format(i=i), s.hidden)
        return (h + d).astype(np.float32)
