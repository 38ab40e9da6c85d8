"""RoPE frequencies (families.rope) against transformers' own ROPE_INIT_FUNCTIONS, for every scaling type
the supported families' configs use; relative error <= 1e-6 (both float32)."""
from __future__ import annotations


import numpy as np
import pytest

pytest.importorskip("torch")
from fixtures.zoo import _without_torchvision_ops  # noqa: E402

_without_torchvision_ops()     # torchvision 0.28 is a CUDA wheel: its C ops do not load beside torch+cpu

from mnntool.errors import MnnToolError  # noqa: E402
from mnntool.llm.families import rope  # noqa: E402

BASE = dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=4096,
            vocab_size=100, intermediate_size=64, num_hidden_layers=1)
CASES = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    "llama3": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 1024},
    "yarn": {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0, "original_max_position_embeddings": 1024},
    "longrope": {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 1024,
                 "short_factor": list(np.linspace(1.0, 1.5, 32)), "long_factor": list(np.linspace(1.0, 8.0, 32))},
    "partial": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
}


@pytest.mark.parametrize("name", list(CASES))
def test_inv_freq_matches_transformers(name):
    from transformers import LlamaConfig, Phi3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    params = dict(CASES[name])
    cls = Phi3Config if name in ("longrope", "partial") else LlamaConfig
    cfg = cls(**BASE, rope_parameters=params)
    kind = params["rope_type"]
    if kind == "default":
        dim = int(64 * params.get("partial_rotary_factor", 1.0))
        ref = 1.0 / (params["rope_theta"] ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim))
        ref_scale = 1.0
    else:
        t, ref_scale = ROPE_INIT_FUNCTIONS[kind](cfg, "cpu")
        ref = t.numpy()
    mine = rope(cfg.to_dict(), 64, 4096)
    assert mine.inv_freq.shape == ref.shape
    assert np.allclose(mine.inv_freq, ref, rtol=1e-6, atol=0), np.abs(mine.inv_freq / ref - 1).max()
    assert abs(mine.scaling - ref_scale) <= 1e-6


def test_v4_spelling():
    """Older config.json files: rope_theta + rope_scaling {"type": ...}."""
    cfg = dict(BASE, rope_theta=10000.0, rope_scaling={"type": "linear", "factor": 2.0})
    r = rope(cfg, 64, 4096)
    assert np.allclose(r.inv_freq, 1.0 / (10000.0 ** (np.arange(0, 64, 2) / 64)) / 2.0, rtol=1e-6)


def test_unknown_rope_type():
    with pytest.raises(MnnToolError, match="rope type"):
        rope(dict(BASE, rope_parameters={"rope_type": "wavy", "rope_theta": 1.0}), 64, 4096)
