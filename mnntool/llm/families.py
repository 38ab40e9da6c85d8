"""The decoder families `llm export` builds, read from a checkpoint's config.json alone.

One `Spec` says everything the graph builder needs: sizes, which norms sit where, the activation, the
RoPE frequencies per layer, biases, soft-capping, sliding windows, and where each tensor lives in the
checkpoint (`names`). A family is a function from config to Spec; nothing is imported from the
checkpoint's folder and no code in it is run.

Config keys are read in both spellings transformers has used: `rope_theta`/`rope_scaling` (v4) and
`rope_parameters` (v5, per layer type for Gemma 3).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import MnnToolError


@dataclass
class Rope:
    inv_freq: np.ndarray            # (rotary_dim / 2,) float32
    scaling: float = 1.0            # multiplies cos and sin (YaRN's and LongRoPE's attention factor)
    rotary_dim: int = 0             # < head_dim: partial rotary (the rest passes through)


@dataclass
class Spec:
    family: str
    model_type: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    eps: float
    norm: str = "rms"               # "rms" | "layer" (with bias)
    norm_offset: float = 0.0        # Gemma stores gamma - 1
    act: str = "silu"               # "silu" | "gelu_tanh" | "gelu"
    gated: bool = True              # gate * act(up) MLP, else act(fc)
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    sandwich: bool = False          # Gemma 2/3: norms after attention and after the MLP too
    embed_scale: float = 1.0
    final_softcap: float | None = None
    attn_softcap: float | None = None   # not expressible in MNN's fused Attention: reported
    attn_scale: float | None = None     # q·k scale when not 1/sqrt(head_dim)
    sliding: list = field(default_factory=list)     # per layer: window or 0
    ropes: dict = field(default_factory=dict)       # layer kind -> Rope; "full" always
    layer_rope: list = field(default_factory=list)  # per layer: key into ropes (None: no RoPE)
    learned_positions: bool = False     # GPT-2: wpe added to the embeddings
    tied: bool = False
    max_positions: int = 0
    names: dict = field(default_factory=dict)       # role -> checkpoint tensor name (per layer: format with i)
    fused_qkv: str | None = None    # Phi-3 qkv_proj / GPT-2 c_attn: one tensor split three ways
    fused_gate_up: bool = False     # Phi-3 gate_up_proj
    transposed: bool = False        # GPT-2's Conv1D stores (in, out)
    notes: list = field(default_factory=list)

    @property
    def sliding_window(self) -> int:
        return max(self.sliding) if self.sliding else 0


def _get(cfg: dict, *keys, default=None):
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return default


def _rope_params(cfg: dict, kind: str | None = None) -> dict:
    """{rope_type, rope_theta, factor, ...} from either spelling."""
    rp = cfg.get("rope_parameters")
    if isinstance(rp, dict) and kind and isinstance(rp.get(kind), dict):
        rp = rp[kind]
    if isinstance(rp, dict) and ("rope_theta" in rp or "rope_type" in rp):
        out = dict(rp)
    else:
        out = dict(cfg.get("rope_scaling") or {})
        out.setdefault("rope_theta", cfg.get("rope_theta", 10000.0))
    out["rope_type"] = out.get("rope_type", out.get("type", "default")) or "default"
    if "partial_rotary_factor" not in out and cfg.get("partial_rotary_factor") is not None:
        out["partial_rotary_factor"] = cfg["partial_rotary_factor"]
    return out


def rope(cfg: dict, head_dim: int, max_pos: int, kind: str | None = None) -> Rope:
    """inv_freq as transformers computes it (float32 from an int64 arange), for the RoPE types on-device
    configs use: default, linear, dynamic (its value below the trained length), llama3, yarn, longrope."""
    p = _rope_params(cfg, kind)
    dim = int(head_dim * float(p.get("partial_rotary_factor", 1.0)))
    base = float(p["rope_theta"])
    inv = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim))
    kind_ = p["rope_type"]
    scale = 1.0
    if kind_ in ("default", "dynamic"):
        pass
    elif kind_ == "linear":
        inv = inv / float(p["factor"])
    elif kind_ == "llama3":
        factor, lo, hi = float(p["factor"]), float(p["low_freq_factor"]), float(p["high_freq_factor"])
        old = float(p["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        smooth = (old / wavelen - lo) / (hi - lo)
        scaled = np.where(wavelen > old / lo, inv / factor, inv)
        mid = (1 - smooth) * scaled / factor + smooth * scaled
        inv = np.where((wavelen >= old / hi) & (wavelen <= old / lo), mid, scaled).astype(np.float32)
    elif kind_ == "yarn":
        inv, scale = _yarn(p, dim, base, max_pos)
    elif kind_ in ("longrope", "su"):
        old = float(p.get("original_max_position_embeddings") or cfg.get("original_max_position_embeddings")
                    or max_pos)
        ext = np.asarray(p["short_factor"], np.float32)     # MNN-LLM runs one table: the short one
        inv = (1.0 / (ext * base ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim)))
        factor = max_pos / old
        scale = float(p.get("attention_factor") or
                      (1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(old))))
    else:
        raise MnnToolError(f"config.json: rope type {kind_!r} is not supported (default, linear, dynamic, "
                           "llama3, yarn, longrope)")
    return Rope(np.asarray(inv, np.float32), scale, dim)


def _yarn(p: dict, dim: int, base: float, max_pos: int):
    factor = float(p["factor"])
    old = float(p.get("original_max_position_embeddings") or max_pos)
    mscale = p.get("mscale")
    mscale_all = p.get("mscale_all_dim")

    def get_mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0
    att = p.get("attention_factor")
    if att is None:
        att = get_mscale(factor, mscale) / get_mscale(factor, mscale_all) if mscale and mscale_all \
            else get_mscale(factor)
    beta_fast, beta_slow = float(p.get("beta_fast") or 32), float(p.get("beta_slow") or 1)

    def corr(rot):
        return (dim * math.log(old / (rot * 2 * math.pi))) / (2 * math.log(base))
    low, high = corr(beta_fast), corr(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim)
    extra, inter = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    extra_factor = 1 - ramp
    inv = inter * (1 - extra_factor) + extra * extra_factor
    return inv.astype(np.float32), float(att)


def _llama_names(prefix: str = "model.") -> dict:
    L = prefix + "layers.{i}."
    return {"embed": prefix + "embed_tokens.weight", "final_norm": prefix + "norm.weight", "head": "lm_head.weight",
            "in_norm": L + "input_layernorm.weight", "post_norm": L + "post_attention_layernorm.weight",
            "q": L + "self_attn.q_proj", "k": L + "self_attn.k_proj", "v": L + "self_attn.v_proj",
            "o": L + "self_attn.o_proj", "gate": L + "mlp.gate_proj", "up": L + "mlp.up_proj",
            "down": L + "mlp.down_proj", "q_norm": L + "self_attn.q_norm.weight",
            "k_norm": L + "self_attn.k_norm.weight", "pre_ff_norm": L + "pre_feedforward_layernorm.weight",
            "post_ff_norm": L + "post_feedforward_layernorm.weight"}


def _sliding(cfg: dict, layers: int) -> list:
    window = cfg.get("sliding_window") or 0
    types = cfg.get("layer_types")
    if types and len(types) == layers:
        return [window if t == "sliding_attention" else 0 for t in types]
    if cfg.get("model_type") == "gemma2":
        return [window if i % 2 == 0 else 0 for i in range(layers)]
    if cfg.get("model_type") in ("qwen2", "qwen3"):
        if not cfg.get("use_sliding_window"):
            return [0] * layers
        first = cfg.get("max_window_layers", layers)
        return [window if i >= first else 0 for i in range(layers)]
    return [window] * layers


def _base(cfg: dict, family: str) -> Spec:
    try:
        hidden = int(cfg["hidden_size"])
        layers = int(cfg["num_hidden_layers"])
        heads = int(cfg["num_attention_heads"])
        vocab = int(cfg["vocab_size"])
        intermediate = int(cfg["intermediate_size"])
    except (KeyError, TypeError, ValueError) as e:
        raise MnnToolError(f"config.json: {e} is missing or not a number") from None
    kv = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    if min(hidden, layers, heads, vocab, intermediate, kv, head_dim) <= 0 or heads % kv:
        raise MnnToolError(f"config.json: sizes do not fit together (hidden {hidden}, heads {heads}, "
                           f"kv heads {kv}, head_dim {head_dim}, layers {layers})")
    if max(hidden, intermediate, vocab) > 1 << 24 or layers > 1024 or heads * head_dim > 1 << 20:
        raise MnnToolError(f"config.json: absurd sizes (hidden {hidden}, intermediate {intermediate}, "
                           f"vocab {vocab}, layers {layers})")
    max_pos = int(cfg.get("max_position_embeddings") or 4096)
    s = Spec(family=family, model_type=cfg.get("model_type", family), hidden=hidden, layers=layers,
             heads=heads, kv_heads=kv, head_dim=head_dim, intermediate=intermediate, vocab=vocab,
             eps=float(_get(cfg, "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", default=1e-6)),
             tied=bool(cfg.get("tie_word_embeddings", False)), max_positions=max_pos, names=_llama_names())
    act = cfg.get("hidden_act") or cfg.get("hidden_activation") or "silu"
    s.act = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh",
             "gelu": "gelu", "gelu_fast": "gelu_tanh"}.get(act)
    if s.act is None:
        raise MnnToolError(f"config.json: activation {act!r} is not supported (silu, gelu, gelu_pytorch_tanh)")
    s.ropes = {"full": rope(cfg, head_dim, max_pos)}
    s.layer_rope = ["full"] * layers
    s.sliding = _sliding(cfg, layers)
    return s


def llama(cfg: dict) -> Spec:
    s = _base(cfg, "llama")
    s.qkv_bias = s.o_bias = bool(cfg.get("attention_bias", False))
    s.mlp_bias = bool(cfg.get("mlp_bias", False))
    return s


def qwen2(cfg: dict) -> Spec:
    s = _base(cfg, "qwen2")
    s.qkv_bias = True
    return s


def qwen3(cfg: dict) -> Spec:
    s = _base(cfg, "qwen3")
    s.qkv_bias = s.o_bias = bool(cfg.get("attention_bias", False))
    s.qk_norm = True
    return s


def gemma(cfg: dict, version: int) -> Spec:
    s = _base(cfg, f"gemma{version}" if version > 1 else "gemma")
    s.norm_offset = 1.0
    s.embed_scale = math.sqrt(s.hidden)
    s.qkv_bias = s.o_bias = bool(cfg.get("attention_bias", False))
    scalar = cfg.get("query_pre_attn_scalar")
    if scalar:
        s.attn_scale = float(scalar) ** -0.5
    if version >= 2:
        s.sandwich = True
        s.final_softcap = cfg.get("final_logit_softcapping")
        s.attn_softcap = cfg.get("attn_logit_softcapping")
        if s.attn_softcap:
            s.notes.append(f"attention logit soft-capping ({s.attn_softcap}) is not applied: MNN's fused "
                           "Attention has no soft-cap; logits differ where q·k nears the cap")
    if version == 3:
        s.qk_norm = True
        rp = cfg.get("rope_parameters") or {}
        if "sliding_attention" in rp:
            s.ropes = {"full": rope(cfg, s.head_dim, s.max_positions, "full_attention"),
                       "local": rope(cfg, s.head_dim, s.max_positions, "sliding_attention")}
        else:
            local = dict(cfg, rope_scaling=None, rope_theta=cfg.get("rope_local_base_freq", 10000.0))
            s.ropes["local"] = rope(local, s.head_dim, s.max_positions)
        s.layer_rope = ["local" if w else "full" for w in s.sliding]
    return s


def phi3(cfg: dict) -> Spec:
    s = _base(cfg, "phi3")
    s.fused_qkv = "model.layers.{i}.self_attn.qkv_proj"
    s.fused_gate_up = True
    s.names.update(gate_up="model.layers.{i}.mlp.gate_up_proj")
    return s


def mistral(cfg: dict) -> Spec:
    return _base(cfg, "mistral")


def gpt2(cfg: dict) -> Spec:
    cfg = dict(cfg, hidden_size=cfg.get("n_embd"), num_hidden_layers=cfg.get("n_layer"),
               num_attention_heads=cfg.get("n_head"),
               intermediate_size=cfg.get("n_inner") or 4 * int(cfg.get("n_embd") or 0),
               max_position_embeddings=cfg.get("n_positions"), hidden_act=cfg.get("activation_function"),
               tie_word_embeddings=cfg.get("tie_word_embeddings", True))
    s = _base(cfg, "gpt2")
    s.norm, s.gated, s.qkv_bias, s.o_bias, s.mlp_bias = "layer", False, True, True, True
    s.learned_positions, s.transposed = True, True
    s.ropes, s.layer_rope = {}, [None] * s.layers
    s.sliding = [0] * s.layers
    p = "transformer.h.{i}."
    s.names = {"embed": "transformer.wte.weight", "positions": "transformer.wpe.weight",
               "final_norm": "transformer.ln_f.weight", "head": "lm_head.weight",
               "in_norm": p + "ln_1.weight", "post_norm": p + "ln_2.weight", "o": p + "attn.c_proj",
               "up": p + "mlp.c_fc", "down": p + "mlp.c_proj"}
    s.fused_qkv = p + "attn.c_attn"
    return s


FAMILIES = {
    "llama": llama, "qwen2": qwen2, "qwen3": qwen3, "mistral": mistral, "phi3": phi3, "gpt2": gpt2,
    "gemma": lambda c: gemma(c, 1), "gemma2": lambda c: gemma(c, 2), "gemma3_text": lambda c: gemma(c, 3),
    "gemma3": lambda c: gemma(c, 3),
}


def spec(cfg: dict) -> Spec:
    """The Spec of a checkpoint's config, or one line naming the architecture and the supported list."""
    model_type = cfg.get("model_type")
    if model_type == "gemma3" and isinstance(cfg.get("text_config"), dict):
        cfg = dict(cfg["text_config"], model_type="gemma3_text")
    build = FAMILIES.get(model_type)
    if build is None:
        arch = ", ".join(cfg.get("architectures") or []) or "?"
        raise MnnToolError(f"config.json: model_type {model_type!r} ({arch}) is not supported; "
                           f"supported: {', '.join(sorted(FAMILIES))}")
    return build(cfg)
