"""The decoder graph MNN-LLM runs, built from a Spec and the checkpoint's tensors.

The graph's contract is MNN-LLM's (its engine feeds these and reads these, see llm.cpp):
    inputs   input_ids       float [S, 1, hidden] the token embeddings (the runtime looks them up)
             attention_mask  float: a scalar 0 on CPU for causal full attention ("full"), or
                             [2, 1, 1, S, kv] full and sliding masks ("mix": Gemma 2/3, Mistral)
             position_ids    int32 [1, S]
             logits_index    int32 [1]: logits are computed for positions logits_index.. only
    outputs  logits [1, n, vocab], hidden_states [1, n, hidden] (after the final norm)
Per layer one `Attention` op with `kv_cache` keeps K and V itself; q and k arrive rotated,
[1, S, heads, head_dim] and [1, S, kv_heads, head_dim]. Linear layers are 1x1 convolutions on
NC4HW4 reading `llm.mnn.weight`; an MLP stays in NC4HW4 between its convolutions.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import MnnToolError
from .families import Spec
from .netbuild import NetBuilder
from .weightfile import WeightFile


@dataclass
class QuantPlan:
    bits: int = 4               # 4 | 8 | 16 for the blocks' linear layers
    block: int = 64             # 0: one block per output channel
    symmetric: bool = False
    hqq: bool = False
    lm_bits: int | None = None  # the head (None: as bits)
    lm_block: int | None = None

    @property
    def head_bits(self) -> int:
        return self.lm_bits or self.bits


class Decoder:
    def __init__(self, spec: Spec, ckpt, weights: WeightFile, plan: QuantPlan, progress=None, calib=None):
        self.s, self.ck, self.wf, self.plan = spec, ckpt, weights, plan
        self.calib = calib          # awq.Calibrator: scales each layer's weights before they are written
        self.b = NetBuilder()
        self.progress = progress or (lambda: None)
        self.head = None            # (external, Quantized) of the LM head, for tied embeddings

    # checkpoint access with the config's shapes checked first
    def tensor(self, name: str, shape: tuple) -> np.ndarray:
        if not self.ck.has(name):
            raise MnnToolError(f"{self.ck.dir}: tensor {name} is missing (model_type {self.s.model_type})")
        self.ck.expect_shape(name, shape)
        return self.ck.get(name)

    def maybe(self, name: str, shape: tuple):
        return self.tensor(name, shape) if self.ck.has(name) else None

    def weight(self, base: str, oc: int, ic: int) -> np.ndarray:
        if self.s.transposed:           # GPT-2's Conv1D keeps (in, out)
            return np.ascontiguousarray(self.tensor(base + ".weight", (ic, oc)).T)
        return self.tensor(base + ".weight", (oc, ic))

    # pieces
    def to_c4(self, x: str, ic: int, name: str) -> str:
        r = self.b.reshape(x, [-1, ic, 1, 1], name + "/pre_reshape")
        return self.b.convert(r, "NCHW", "NC4HW4", name + "/pre_convert")

    def from_c4(self, y: str, oc: int, out: str) -> str:
        c = self.b.convert(y, "NC4HW4", "NCHW", out + "/post_convert")
        return self.b.reshape(c, [1, -1, oc], out)

    def conv(self, c4: str, name: str, w: np.ndarray, bias, head: bool = False) -> str:
        p = self.plan
        bits = p.head_bits if head else p.bits
        block = (p.lm_block if p.lm_block is not None else p.block) if head else p.block
        main, q = self.wf.linear(name, w, bias, bits, block, p.symmetric, p.hqq)
        if head:
            self.head = (main["external"], q)
        return self.b.op("Convolution", [c4], name, "Convolution2D", main)

    def norm(self, x: str, base: str, dim: int, out: str, divide=None) -> str:
        s = self.s
        gamma = self.tensor(base, (dim,)) + np.float32(s.norm_offset)
        beta = None
        if s.norm == "layer":
            beta = self.tensor(base.rsplit(".", 1)[0] + ".bias", (dim,))
        if divide is not None:
            gamma = gamma / divide
            beta = beta / divide if beta is not None else None
        ext = self.wf.norm(gamma, beta)
        return self.b.op("LayerNorm", [x], out, "LayerNorm",
                         {"axis": [-1], "epsilon": s.eps, "group": 1, "external": ext,
                          "useRMSNorm": s.norm == "rms"})

    def rope_tables(self, pos: str) -> dict:
        """cos and sin [1, S, 1, rotary_dim] per RoPE kind, computed in the graph from position_ids
        as transformers does: float(pos) * inv_freq, duplicated halves, times the attention factor."""
        b, out = self.b, {}
        posf = b.reshape(b.op("Cast", [pos], "rope/pos_float", "CastParam", {"srcT": "DT_INT32", "dstT": "DT_FLOAT"}),
                         [-1, 1], "rope/pos")
        for kind, r in self.s.ropes.items():
            f = b.binary("MUL", posf, b.const(r.inv_freq, np.float32), f"rope/{kind}/freqs")
            emb = b.concat([f, f], -1, f"rope/{kind}/emb")
            tabs = []
            for fn in ("COS", "SIN"):
                t = b.unary(fn, emb, f"rope/{kind}/{fn.lower()}")
                if r.scaling != 1.0:
                    t = b.scale(t, r.scaling, f"rope/{kind}/{fn.lower()}_scaled")
                tabs.append(b.reshape(t, [1, -1, 1, r.rotary_dim], f"rope/{kind}/{fn.lower()}4"))
            out[kind] = (tabs[0], tabs[1], r.rotary_dim)
        return out

    def rotate(self, x: str, table, head_dim: int, name: str) -> str:
        """x * cos + rotate_half(x) * sin on the first rotary_dim channels."""
        b = self.b
        cos, sin, rd = table
        xr = x if rd == head_dim else b.slice_last(x, 0, rd, 3, name + "/rot_in")
        half = rd // 2
        x1 = b.slice_last(xr, 0, half, 3, name + "/x1")
        x2 = b.slice_last(xr, half, rd, 3, name + "/x2")
        rot = b.concat([b.unary("NEG", x2, name + "/neg_x2"), x1], -1, name + "/rot_half")
        y = b.binary("ADD", b.binary("MUL", xr, cos, name + "/xcos"), b.binary("MUL", rot, sin, name + "/rsin"),
                     name + "/rope")
        if rd == head_dim:
            return y
        rest = b.slice_last(x, rd, head_dim, 3, name + "/pass")
        return b.concat([y, rest], -1, name + "/rope_full")

    def layer_weights(self, i: int) -> dict:
        """This layer's linear weights by role, (w (oc, ic) float32, bias or None), fused tensors split:
        q k v o, and gate up down (no gate in a plain MLP)."""
        s, L = self.s, self.s.names
        H, KV, D, hid, inter = s.heads, s.kv_heads, s.head_dim, s.hidden, s.intermediate
        out = {}
        if s.fused_qkv:
            base = s.fused_qkv.format(i=i)
            w = self.weight(base, (H + 2 * KV) * D, hid)
            bias = self.maybe(base + ".bias", ((H + 2 * KV) * D,)) if s.qkv_bias else None
            cut = [0, H * D, (H + KV) * D, (H + 2 * KV) * D]
            for j, k in enumerate("qkv"):
                out[k] = (w[cut[j]:cut[j + 1]], None if bias is None else bias[cut[j]:cut[j + 1]])
        else:
            for k, oc in (("q", H * D), ("k", KV * D), ("v", KV * D)):
                base = L[k].format(i=i)
                out[k] = (self.weight(base, oc, hid), self.maybe(base + ".bias", (oc,)) if s.qkv_bias else None)
        base = L["o"].format(i=i)
        out["o"] = (self.weight(base, hid, H * D), self.maybe(base + ".bias", (hid,)) if s.o_bias else None)

        def bias(base, n):
            return self.maybe(base + ".bias", (n,)) if s.mlp_bias else None
        if s.fused_gate_up:
            w = self.weight(L["gate_up"].format(i=i), 2 * inter, hid)
            out["gate"], out["up"] = (w[:inter], None), (w[inter:], None)
        else:
            roles = ("gate", "up") if s.gated else ("up",)
            for k in roles:
                base = L[k].format(i=i)
                out[k] = (self.weight(base, inter, hid), bias(base, inter))
        base = L["down"].format(i=i)
        out["down"] = (self.weight(base, hid, inter), bias(base, hid))
        return out

    def attention(self, i: int, h: str, tables, mask, w: dict) -> str:
        s, b = self.s, self.b
        L = s.names
        H, KV, D, hid = s.heads, s.kv_heads, s.head_dim, s.hidden
        pre = f"layers.{i}.self_attn"
        c4 = self.to_c4(h, hid, pre + "/in")
        heads = {"q": H, "k": KV, "v": KV}
        out = {}
        for k in "qkv":
            y = self.from_c4(self.conv(c4, f"{pre}/{k}_proj", *w[k]), heads[k] * D, f"{pre}/{k}")
            out[k] = b.reshape(y, [1, -1, heads[k], D], f"{pre}/{k}4")
        q, k, v = out["q"], out["k"], out["v"]
        if s.qk_norm:
            q = self.norm(q, L["q_norm"].format(i=i), D, f"{pre}/q_norm")
            k = self.norm(k, L["k_norm"].format(i=i), D, f"{pre}/k_norm")
        kind = s.layer_rope[i]
        if kind is not None:
            q = self.rotate(q, tables[kind], D, f"{pre}/q")
            k = self.rotate(k, tables[kind], D, f"{pre}/k")
        if s.attn_scale is not None and abs(s.attn_scale * np.sqrt(D) - 1) > 1e-7:
            # MNN's Attention scales by 1/sqrt(head_dim): fold the model's own scale into q
            q = b.scale(q, s.attn_scale * np.sqrt(D), f"{pre}/q_scaled")
        layer_mask = mask
        if isinstance(mask, tuple):        # "mix": [full, sliding]
            layer_mask = mask[1] if s.sliding[i] else mask[0]
        a = b.op("Attention", [q, k, v, layer_mask], f"{pre}/attn", "AttentionParam",
                 {"kv_cache": True, "layer_index": i})
        o = self.conv(self.to_c4(a, H * D, pre + "/o_in"), f"{pre}/o_proj", *w["o"])
        return self.from_c4(o, hid, f"{pre}/out")

    def mlp(self, i: int, h: str, w: dict) -> str:
        s, b = self.s, self.b
        pre = f"layers.{i}.mlp"
        c4 = self.to_c4(h, s.hidden, pre + "/in")
        up = self.conv(c4, pre + "/up_proj", *w["up"])
        gate = self.conv(c4, pre + "/gate_proj", *w["gate"]) if "gate" in w else None
        if gate is not None and s.act == "silu":
            act = b.binary("MUL_SILU", up, gate, pre + "/act")
        elif gate is not None:
            act = b.binary("MUL", b.unary(_GELU[s.act], gate, pre + "/gate_act"), up, pre + "/act")
        else:
            act = b.unary(_GELU.get(s.act, "SILU"), up, pre + "/act")
        down = self.conv(act, pre + "/down_proj", *w["down"])
        return self.from_c4(down, s.hidden, f"{pre}/out")

    def layer(self, i: int, h: str, tables, mask) -> str:
        s, b, L = self.s, self.b, self.s.names
        w = self.layer_weights(i)
        div = {}                            # AWQ: a norm's gamma divided by its readers' input scales
        if self.calib is not None:
            w, div = self.calib.layer(i, w)
        ff_norm = "pre_ff_norm" if s.sandwich else "post_norm"
        x = self.norm(h, L["in_norm"].format(i=i), s.hidden, f"layers.{i}/in_norm", div.get("qkv"))
        a = self.attention(i, x, tables, mask, w)
        if s.sandwich:
            a = self.norm(a, L["post_norm"].format(i=i), s.hidden, f"layers.{i}/post_attn_norm")
        h = b.binary("ADD", h, a, f"layers.{i}/attn_residual")
        x = self.norm(h, L[ff_norm].format(i=i), s.hidden, f"layers.{i}/{ff_norm}", div.get("gate_up"))
        m = self.mlp(i, x, w)
        if s.sandwich:
            m = self.norm(m, L["post_ff_norm"].format(i=i), s.hidden, f"layers.{i}/post_ff_norm")
        self.progress()
        return b.binary("ADD", h, m, f"layers.{i}/out")

    def build(self) -> NetBuilder:
        s, b = self.s, self.b
        emb = b.input("input_ids", [1, 1, s.hidden])
        mask_in = b.input("attention_mask", [1, 1, -1, -1])
        pos = b.input("position_ids", [1, -1], "DT_INT32")
        logits_index = b.input("logits_index", [1], "DT_INT32")
        h = b.reshape(emb, [1, -1, s.hidden], "embeds")
        if s.embed_scale != 1.0:
            h = b.scale(h, s.embed_scale, "embeds_scaled")
        if s.learned_positions:
            table = self.tensor(s.names["positions"], (s.max_positions, s.hidden))
            wpe = b.const(table, np.float32, "wpe")
            p = b.op("GatherV2", [wpe, pos], "positions", "GatherV2", {})
            h = b.binary("ADD", h, p, "embeds_positions")
        mask = mask_in
        if self.mixed:
            mask = tuple(b.op("GatherV2", [mask_in, b.const(np.int32(j)), b.const(np.int32(0))],
                              f"attention_mask/{kind}", "GatherV2", {}) for j, kind in enumerate(("full", "sliding")))
        tables = self.rope_tables(pos) if s.ropes else {}
        for i in range(s.layers):
            h = self.layer(i, h, tables, mask)
        last = b.slice_from(h, logits_index, 1, "last")
        hs = self.norm(last, s.names["final_norm"], s.hidden, "hidden_states")
        head_name = s.names["head"] if (self.ck.has(s.names["head"]) and not s.tied) else s.names["embed"]
        if not self.ck.has(head_name):
            raise MnnToolError(f"{self.ck.dir}: tensor {head_name} is missing (the LM head)")
        w = self.tensor(head_name, (s.vocab, s.hidden))
        y = self.conv(self.to_c4(hs, s.hidden, "lm_head/in"), "lm_head", w, None, head=True)
        del w
        logits_name = "logits_raw" if s.final_softcap else "logits"
        logits = self.from_c4(y, s.vocab, logits_name)
        if s.final_softcap:
            c = float(s.final_softcap)
            t = b.unary("TANH", b.scale(logits, 1.0 / c, "logits/capped_in"), "logits/tanh")
            logits = b.scale(t, c, "logits")
        return b

    @property
    def mixed(self) -> bool:
        """Any layer with a sliding window: MNN-LLM then passes [full, sliding] masks ("mix")."""
        return any(self.s.sliding)


_GELU = {"gelu_tanh": "GELU", "gelu": "GELU_STANDARD"}
