"""fixtures/llm_checkpoints.py: each family's tiny random checkpoint loads with transformers from its folder
alone (no trust_remote_code), in the family's real layout; its tokenizer round-trips text; greedy decoding
wanders instead of repeating a token; the settings meant to matter (sliding window, soft-capping, rope
scaling) change the logits. The streamed writer (the 0.5b/1.5b path) equals save_pretrained's output.

The families are built once into build/llm/random and reused across runs (recipe.json). The trained
"test" model is built into build/llm/trained-test (tens of seconds, once) and reused.
"""
from __future__ import annotations

import json

import pytest

from tests.conftest import ROOT

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from fixtures import llm_checkpoints as L  # noqa: E402

CACHE = ROOT / "build" / "llm" / "random"     # shared with the export tests (gemma2 there has its cap at 50)
TEXT = "def f(x):\n    return x ** 2  # Grüße, 東京 ✓\n\n\tclass A: pass"
PROMPT = "def main():\n    "


@pytest.fixture(scope="session")
def checkpoint():
    built = {}

    def get(family: str):
        if family not in built:
            built[family] = L.build_random(family, CACHE / (family + ("-cap5" if family == "gemma2" else "")))
        return built[family]
    return get


def _load(folder, **config):
    t = L._transformers()
    cfg = t.AutoConfig.from_pretrained(str(folder))
    for k, v in config.items():
        setattr(cfg, k, v)
    return t.AutoModelForCausalLM.from_pretrained(str(folder), config=cfg, dtype=torch.float32).eval()


def _logits(folder, text: str = TEXT, **config) -> torch.Tensor:
    tok = L._transformers().AutoTokenizer.from_pretrained(str(folder))
    with torch.no_grad():
        return _load(folder, **config)(tok(text, return_tensors="pt")["input_ids"]).logits[0]


def _tensors(folder) -> dict:
    from safetensors.torch import load_file
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


@pytest.mark.parametrize("family", sorted(L.FAMILIES))
def test_family_loads_tokenizes_and_decodes(checkpoint, family):
    folder = checkpoint(family)
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json"} <= names
    assert not any(n.endswith((".bin", ".pt", ".py")) for n in names)
    t = L._transformers()
    tok = t.AutoTokenizer.from_pretrained(str(folder))
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == [L.FAMILIES[family].model]
    assert config["vocab_size"] == len(tok)
    assert config["eos_token_id"] == tok.eos_token_id
    ids = tok(TEXT)["input_ids"]
    assert tok.decode(ids, skip_special_tokens=True) == TEXT
    assert len(ids) < len(TEXT.encode()) // 1.5           # merges were learned
    toks = L.greedy(folder, PROMPT, 32)
    assert len(toks) == 32 and max(toks) < len(tok)
    assert len(set(toks)) >= 8, toks


def test_family_layouts(checkpoint):
    """The tensors each family's exporter must map, and the config fields that set them apart."""
    keys = {f: set(_tensors(checkpoint(f))) for f in ("qwen2", "qwen3", "phi3", "gpt2", "llama", "smollm")}
    q2 = _tensors(checkpoint("qwen2"))
    assert q2["model.layers.0.self_attn.q_proj.bias"].abs().min() > 0          # biases present and non-zero
    assert "lm_head.weight" not in keys["qwen2"] and "lm_head.weight" not in keys["smollm"]    # tied
    assert "lm_head.weight" in keys["llama"]
    assert "model.layers.0.self_attn.q_norm.weight" in keys["qwen3"]
    assert {"model.layers.0.self_attn.qkv_proj.weight", "model.layers.0.mlp.gate_up_proj.weight"} <= keys["phi3"]
    assert tuple(_tensors(checkpoint("phi3"))["model.layers.0.self_attn.qkv_proj.weight"].shape) == (64 + 2 * 32, 64)
    assert tuple(_tensors(checkpoint("gpt2"))["transformer.h.0.attn.c_attn.weight"].shape) == (64, 192)   # Conv1D
    q3 = json.loads((checkpoint("qwen3") / "config.json").read_text())
    assert q3["head_dim"] * q3["num_attention_heads"] != q3["hidden_size"]
    g2 = json.loads((checkpoint("gemma2") / "config.json").read_text())
    assert g2["sliding_window"] == 8 and g2["final_logit_softcapping"] and g2["attn_logit_softcapping"]
    assert json.loads((checkpoint("llama") / "config.json").read_text())["rope_parameters"]["rope_type"] == "llama3"
    sp = json.loads((checkpoint("llama") / "tokenizer.json").read_text())
    assert sp["pre_tokenizer"]["type"] == "Metaspace" and sp["model"]["byte_fallback"]
    assert sp["model"]["vocab"]["<0x00>"] == 3 and sp["model"]["vocab"]["<s>"] == 1
    bl = json.loads((checkpoint("qwen2") / "tokenizer.json").read_text())
    assert bl["decoder"]["type"] == "ByteLevel"
    assert [a["id"] for a in bl["added_tokens"]] == [1021, 1022, 1023]        # specials after the BPE vocab


def test_settings_that_should_matter_do(checkpoint):
    """A prompt longer than the 8-token window: ignoring the window, the soft-caps or llama3 rope scaling
    changes the logits by whole units."""
    text = TEXT * 2
    for family in ("gemma2", "gemma3"):
        base = _logits(checkpoint(family), text)
        assert (base - _logits(checkpoint(family), text, sliding_window=4096)).abs().max() > 0.5, family
    g2 = checkpoint("gemma2")
    uncapped = _logits(g2, text, attn_logit_softcapping=None, final_logit_softcapping=None)
    assert (_logits(g2, text) - uncapped).abs().max() > 0.5
    llama = checkpoint("llama")
    plain = {"rope_type": "default", "rope_theta": 500000.0}
    assert (_logits(llama, text) - _logits(llama, text, rope_parameters=plain)).abs().max() > 0.5


def test_streamed_writer_equals_save_pretrained(tmp_path):
    """The meta-device path of the 0.5b/1.5b sizes, on the tiny qwen2: same tensors, shards and index."""
    kw = dict(dtype="bfloat16", shard_size="100KB")
    a = L.build_random("qwen2", tmp_path / "a", **kw)
    b = L.build_random("qwen2", tmp_path / "b", stream=True, **kw)
    ta, tb = _tensors(a), _tensors(b)
    assert sorted(ta) == sorted(tb) and all(torch.equal(ta[k], tb[k]) for k in ta)
    assert {v.dtype for v in tb.values()} == {torch.bfloat16}
    assert sorted(p.name for p in a.glob("*.safetensors")) == sorted(p.name for p in b.glob("*.safetensors"))
    assert len(list(b.glob("*.safetensors"))) > 1
    index = "model.safetensors.index.json"
    assert json.loads((a / index).read_text()) == json.loads((b / index).read_text())
    assert torch.equal(_logits(a), _logits(b))


def test_deterministic_and_cached(tmp_path):
    a = L.build_random("mistral", tmp_path / "a", seed=3)
    b = L.build_random("mistral", tmp_path / "b", seed=3)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()
    stamp = (a / "model.safetensors").stat().st_mtime_ns
    L.build_random("mistral", a, seed=3)
    assert (a / "model.safetensors").stat().st_mtime_ns == stamp                 # reused
    c = L.build_random("mistral", tmp_path / "c", seed=4)
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_hf4_config_style_loads_the_same(tmp_path, checkpoint, family):
    """config.json as transformers 4.x wrote it (rope_theta/rope_scaling, as most Hub checkpoints are)."""
    old = L.build_random(family, tmp_path / family, config_style="hf4")
    d = json.loads((old / "config.json").read_text())
    assert "rope_parameters" not in d and "rope_theta" in d and "torch_dtype" in d
    assert torch.equal(_logits(old), _logits(checkpoint(family)))


def test_trained_test_model():
    folder = L.build_trained(ROOT / "build" / "llm" / "trained-test", "test")     # ~20 s once, then cached
    rec = json.loads((folder / "recipe.json").read_text())
    assert not set(rec["train_files"]) & set(rec["heldout_files"])
    held = (folder / "heldout.txt").read_text(encoding="utf-8")
    assert len(held) > 10_000
    t = L._transformers()
    tok = t.AutoTokenizer.from_pretrained(str(folder))
    model = _load(folder)
    ppl = L.perplexity(model, tok(held)["input_ids"], seq=rec["params"]["seq"], max_tokens=2048)
    assert ppl == pytest.approx(rec["heldout_ppl_2k"], rel=1e-3)          # the folder is the model trained
    assert max(ppl, rec["heldout_ppl"]) < rec["uniform_ppl"] / 8          # clearly learned (uniform: vocab size)
    assert len(set(L.greedy(folder, PROMPT, 32))) >= 4
