"""The engine: a bundle's decoder run by mnntool's own kernels, with its own KV cache.

    m = Model.load(OUT_DIR, threads=1)
    logits = m.forward(ids)          # continues the cache: prefill many tokens, or one decode step
    m.reset()

One step per layer for many tokens (prefill: GEMMs over the prompt) and for one (decode: GEMVs
streaming the quantized weights once); the KV cache is allocated once for the context length and
written in place. What each layer does comes from the graph (graph.py), the numbers from the weight
file as stored (weights.py).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from ...errors import MnnToolError
from . import kernels as K
from .files import BundleFiles, open_bundle
from .graph import LayerPlan, ModelPlan, read_plan
from .weights import Embeddings, NormWeights, QWeight, WeightFile, read_linear, read_norm

DEFAULT_CONTEXT = 4096


@dataclass
class Layer:
    plan: LayerPlan
    in_norm: NormWeights
    qkv: K.Linears            # q, k, v read the same input: one pass, three outputs
    o: K.Linear
    mlp_in: K.Linears         # gate and up (or the lone fc)
    down: K.Linear
    q_norm: NormWeights | None
    k_norm: NormWeights | None
    post_attn_norm: NormWeights | None
    ff_norm: NormWeights
    post_ff_norm: NormWeights | None
    cos: np.ndarray | None    # (context, rotary_dim / 2) RoPE tables, scaled
    sin: np.ndarray | None
    window: int               # sliding window (0: full attention)
    scale: float              # attention score scale (q's folded scale included)


class Model:
    def __init__(self, files: BundleFiles, plan: ModelPlan, threads: int = 1, context: int | None = None,
                 precision: str = "normal", kv_int8: bool = False):
        t0 = time.perf_counter()
        if precision not in ("normal", "high"):
            raise MnnToolError(f"precision {precision!r}: normal (int16 inputs to the quantized layers) or high (float32)")
        self.precision = precision
        self.files, self.plan = files, plan
        self.threads = max(1, int(threads))
        K.wait_policy(self.threads)
        self.reference = K.REFERENCE
        self.hidden, self.vocab = plan.hidden, plan.vocab
        cfg = files.llm_config
        limit = int(cfg.get("max_position_embeddings") or 0) or DEFAULT_CONTEXT
        self.context = int(context) if context else min(limit, DEFAULT_CONTEXT)
        self.wf = WeightFile(files.weights)
        window = int(cfg.get("sliding_window") or 0)
        # the packed layers' arrays in one buffer, in the order decode reads them (packed.Arena): reserved
        # for the most the layers may take, filled as they are made (no copy, no second peak)
        self.arena = None
        if not self.reference and precision != "high" and K.PACKED:
            from .packed import Arena
            ops = [x for lp in plan.layers for x in (lp.q, lp.k, lp.v, lp.o, lp.gate, lp.up, lp.down)
                   if x is not None] + [plan.head]
            ops = [x for x in ops if int((x.quan or {}).get("type", 0) or 0) == 1]     # 4/8-bit blocks: packed
            try:
                self.arena = Arena(Arena.bound(ops)) if ops else None
            except MemoryError:     # the reservation refused (strict overcommit): each layer allocates its own
                self.arena = None
        self.layers = [self._layer(lp, window) for lp in plan.layers]
        self.final_norm = read_norm(self.wf, plan.final_norm, plan.hidden)
        self.head = K.Linear(read_linear(self.wf, plan.head), self.threads, precision, self.arena)
        self._release(self.head)
        self.softcap = plan.softcap
        self.embed = self._embeddings()
        L = plan.layers[0]
        kv = max(lp.kv_heads for lp in plan.layers)
        dim = max(lp.head_dim for lp in plan.layers)
        # the KV cache: one allocation for the whole context, written in place; float32, or 8-bit codes
        # with a scale and minimum per head and position (kv8.py)
        self.kv8 = None
        if kv_int8:
            from .kv8 import KV8
            self.kv8 = KV8(len(self.layers), kv, self.context, dim)
            self.k_cache = self.v_cache = np.zeros((len(self.layers), 1, 1, 1), np.float32)
        else:
            self.k_cache = np.zeros((len(self.layers), kv, self.context, dim), np.float32)
            self.v_cache = np.zeros((len(self.layers), kv, self.context, dim), np.float32)
        self.pos = 0
        self.tokens: list[int] = []
        self.prof = None          # a profile.StepTimes: each step's time recorded while set
        self.on_layer = None      # on_layer(i, h): each layer's output (T, hidden) seen by `llm verify`; None: off
        self.ws = K.Workspace(self, L)
        self.load_s = time.perf_counter() - t0

    # ------------------------------------------------------------------------------------ loading
    @classmethod
    def load(cls, folder, threads: int = 1, context: int | None = None, precision: str = "normal",
             kv_int8: bool = False) -> Model:
        files = open_bundle(folder)
        plan = read_plan(files.graph, files.llm_config)
        return cls(files, plan, threads, context, precision, kv_int8)

    def _norm(self, op, dim):
        return None if op is None else read_norm(self.wf, op, dim)

    def _layer(self, lp: LayerPlan, window: int) -> Layer:
        wf, t, pr = self.wf, self.threads, self.precision
        q, k, v = (read_linear(wf, x) for x in (lp.q, lp.k, lp.v))
        mlp = [read_linear(wf, x) for x in ((lp.gate, lp.up) if lp.gate is not None else (lp.up,))]
        cos = sin = None
        if lp.rope is not None:
            pos = np.arange(self.context, dtype=np.float32)[:, None]
            f = pos * lp.rope.inv_freq[None, :]         # float32, as the graph's Cast * inv_freq
            cos = (np.cos(f) * np.float32(lp.rope.scaling)).astype(np.float32)
            sin = (np.sin(f) * np.float32(lp.rope.scaling)).astype(np.float32)
        scale = lp.attn_scale if lp.attn_scale else 1.0 / math.sqrt(lp.head_dim)
        a = self.arena
        qkv, o = K.Linears([q, k, v], t, pr, a), K.Linear(read_linear(wf, lp.o), t, pr, a)
        mlp_in, down = K.Linears(mlp, t, pr, a), K.Linear(read_linear(wf, lp.down), t, pr, a)
        for lin in (qkv, o, mlp_in, down):
            self._release(lin)
        return Layer(lp, read_norm(wf, lp.in_norm, lp.q.ic), qkv, o, mlp_in, down,
                     self._norm(lp.q_norm, lp.head_dim), self._norm(lp.k_norm, lp.head_dim),
                     self._norm(lp.post_attn_norm, lp.o.oc), read_norm(wf, lp.ff_norm, lp.o.oc),
                     self._norm(lp.post_ff_norm, lp.o.oc), cos, sin, window if lp.sliding else 0,
                     float(scale * lp.q_scale))

    def _release(self, lin) -> None:
        """Layers repacked at load (packed.py) read their copy: the file's pages under them are let go,
        and the unpacked scales and offsets."""
        if lin.packed is not None:
            for w in lin.ws:
                self.wf.release(w.codes)
                w.scale = w.offset = w.zero = None

    def _embeddings(self) -> Embeddings:
        f, p = self.files, self.plan
        tie = f.tie
        if f.embeddings is not None and f.embeddings.name.endswith("bf16.bin") and not (
                f.config.get("embedding_file") and tie):
            return Embeddings.bf16(f.embeddings, p.vocab, p.hidden)
        if tie is None:
            raise MnnToolError(f"{f.root}: no embeddings (no embeddings_bf16.bin and no tie_embeddings)")
        wf = WeightFile(f.embeddings) if f.embeddings is not None else self.wf
        return Embeddings.quantized(wf, tie, p.vocab, p.hidden)

    # ------------------------------------------------------------------------------------ running
    def reset(self) -> None:
        self.pos = 0
        self.tokens = []

    def embed_rows(self, ids: np.ndarray) -> np.ndarray:
        h = self.embed.rows(ids)
        if self.plan.embed_scale != 1.0:
            h *= np.float32(self.plan.embed_scale)
        if self.plan.positions is not None:
            pos = np.arange(self.pos, self.pos + len(ids))
            if pos[-1] >= self.plan.positions.shape[0]:
                raise MnnToolError(f"position {pos[-1]} is past the model's {self.plan.positions.shape[0]} positions")
            h += self.plan.positions[pos]
        return np.ascontiguousarray(h, np.float32)

    def forward(self, ids, all_logits: bool = False) -> np.ndarray:
        """Run `ids` after what the cache holds; the logits of the last position (vocab,), or of every
        new position (n, vocab) with `all_logits`."""
        ids = np.asarray(ids, np.int64).reshape(-1)
        n = ids.size
        if n == 0:
            raise MnnToolError("forward: no tokens")
        if self.pos + n > self.context:
            raise MnnToolError(f"context full: {self.pos} + {n} tokens > {self.context} (load with a larger context)")
        prof = self.prof
        t = time.perf_counter() if prof is not None else 0.0
        h = self.embed_rows(ids)
        if prof is not None:
            t = prof.lap("embed", t)
        with K.threads(self.threads):
            for layer, i in zip(self.layers, range(len(self.layers))):
                h = K.layer_step(self, i, layer, h, self.pos)
                if self.on_layer is not None:
                    self.on_layer(i, h)
            self.pos += n
            self.tokens.extend(int(t) for t in ids)
            if prof is not None:
                t = time.perf_counter()
            rows = np.ascontiguousarray(h if all_logits else h[-1:])
            if self.reference:
                x = K.norm(rows, self.final_norm)
            else:                   # the Numba norm: numpy's took ~80 us a token (0.5B shape)
                x = np.empty_like(rows)
                self.ws.norm_rows(rows, *self.ws.norm_args(self.final_norm), x)
            if prof is not None:
                t = prof.lap("final norm", t)
            logits = self.head.apply(x)
            if prof is not None:
                t = prof.lap("lm_head", t, self.head.regions(x.shape[0]))
        if self.softcap:
            c = np.float32(self.softcap)
            logits = np.tanh(logits / c) * c
        return logits if all_logits else logits[0]

    # ------------------------------------------------------------------------------------ facts
    def kv_bytes(self) -> int:
        """The KV cache's bytes for the whole context."""
        return self.kv8.nbytes if self.kv8 is not None else self.k_cache.nbytes + self.v_cache.nbytes

    def kv_bytes_per_token(self, pos: int) -> int:
        """Bytes of K and V a decode step at position `pos` reads (every layer's heads up to pos)."""
        n = 0
        for L in self.plan.layers:
            row = L.head_dim + 8 if self.kv8 is not None else 4 * L.head_dim
            n += 2 * L.kv_heads * row * (pos + 1)
        return n

    def weight_bytes(self) -> int:
        n = self.head.nbytes
        for L in self.layers:
            n += L.qkv.nbytes + L.o.nbytes + L.mlp_in.nbytes + L.down.nbytes
        return n

    def describe(self) -> dict:
        p, L = self.plan, self.plan.layers[0]
        return {"layers": len(p.layers), "hidden": p.hidden, "vocab": p.vocab, "heads": L.heads,
                "kv_heads": L.kv_heads, "head_dim": L.head_dim, "intermediate": L.down.ic,
                "bits": self.layers[0].qkv.ws[0].bits, "head_bits": self.head.w.bits,
                "block": self.layers[0].qkv.ws[0].block, "context": self.context, "threads": self.threads,
                "writer": p.writer, "weight_bytes": self.weight_bytes(), "embeddings": self.embed.kind,
                "precision": self.precision, "kv_int8": self.kv8 is not None, "kv_bytes": self.kv_bytes()}
