"""`mnntool llm export` against the real MNN-LLM runtime and transformers, per family.

Each family's tiny random checkpoint (fixtures/llm_checkpoints.py) is exported and run in MNN-LLM
(`MNN.llm`, exact mode, a child process); transformers runs the same checkpoint in fp32 greedy
decoding. Tolerances:
- 16-bit weights: every step's logits cosine >= 0.999 and the greedy tokens equal, compared up to the
  first step where the fp32 reference's top-2 margin is below 0.02 (16-bit storage may flip a tie; no
  step of these models is that close, so all steps are compared in practice).
- 4/8-bit: the reference is transformers with every linear weight replaced by the dequantized values of
  mnntool.llm.quantize (the same numbers the bundle stores) and untied embeddings rounded to bf16 as
  the bundle stores them; the same bars.
"""
from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from tests.conftest import ROOT

pytest.importorskip("MNN")
torch = pytest.importorskip("torch")
from fixtures.zoo import _without_torchvision_ops  # noqa: E402

_without_torchvision_ops()     # torchvision 0.28 is a CUDA wheel: its C ops do not load beside torch+cpu

from mnntool.errors import MnnToolError  # noqa: E402
from mnntool.llm import mnn_llm  # noqa: E402
from mnntool.llm.bundle import export  # noqa: E402
from mnntool.llm.quantize import dequantize, quantize  # noqa: E402

CACHE = ROOT / "build" / "llm" / "random"
STEPS = 32
PROMPT = "def main(argv):\n    return 0"


@pytest.fixture(scope="session")
def checkpoint():
    from fixtures.llm_checkpoints import build_random

    def get(family: str):
        return build_random(family, CACHE / family, **OVERRIDES.get(family, {}))
    return get


# MNN's fused Attention has no logit soft-cap (llmexport drops it too): Gemma 2 is compared at its real
# cap of 50, which these logits never reach; test_softcap_reported covers the fixture's binding cap of 5
OVERRIDES = {"gemma2": {"attn_logit_softcapping": 50.0}}


def hf_reference(src, ids, steps: int, bits: int, block: int):
    """(tokens, logits per step) of transformers' greedy decoding, fake-quantized at `bits` < 16."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    with torch.no_grad():
        if bits < 16:
            for mod in model.modules():
                conv1d = type(mod).__name__ == "Conv1D"           # GPT-2 keeps (in, out)
                if isinstance(mod, torch.nn.Linear) or conv1d:
                    w = mod.weight.detach().numpy()
                    w = w.T if conv1d else w
                    d = dequantize(quantize(np.ascontiguousarray(w), bits, block))
                    mod.weight.data = torch.from_numpy(np.ascontiguousarray(d.T if conv1d else d))
            if model.config.tie_word_embeddings:
                model.get_input_embeddings().weight.data = model.lm_head.weight.data
            else:                   # the bundle's untied embeddings are bf16
                e = model.get_input_embeddings().weight
                e.data = e.data.bfloat16().float()
        g = model.generate(torch.tensor([ids]), max_new_tokens=steps + 1, do_sample=False, output_logits=True,
                           return_dict_in_generate=True)
    return g.sequences[0, len(ids):].tolist(), [x[0].numpy() for x in g.logits]


def _cos(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def check_against_transformers(src, bundle, bits: int, block: int = 64):
    from transformers import AutoTokenizer
    ids = AutoTokenizer.from_pretrained(src)(PROMPT)["input_ids"]
    got = mnn_llm.run(bundle, ids, steps=STEPS, exact=True)
    ref_tokens, ref_logits = hf_reference(src, ids, STEPS, bits, block)
    for step, (mine, ref) in enumerate(zip(got["steps"], ref_logits)):
        top2 = np.sort(ref)[-2:]
        c = _cos(mine, ref)
        assert c >= 0.999, f"step {step}: logits cosine {c:.6f}"
        if top2[1] - top2[0] < 0.02:        # a near tie: either token is right, and later steps differ
            break
        assert got["tokens"][step] == ref_tokens[step], f"step {step}: token {got['tokens'][step]} != {ref_tokens[step]}"
    assert len(set(ref_tokens)) >= 3, "the fixture's greedy decoding should wander"


FAMILIES = ["llama", "smollm", "qwen2", "qwen3", "mistral", "gemma2", "gemma3", "phi3", "gpt2"]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("bits", [16, 4])
def test_family_matches_transformers(family, bits, checkpoint, tmp_path):
    src = checkpoint(family)
    report = export(src, tmp_path / "bundle", bits=bits, block=64)
    assert report["family"] and report["layers"] >= 2
    check_against_transformers(src, tmp_path / "bundle", bits)


@pytest.mark.parametrize("family,kw", [("qwen2", dict(bits=8, block=0)), ("llama", dict(bits=4, block=32, symmetric=True)),
                                       ("qwen3", dict(bits=4, block=64, lm_bits=8)),
                                       ("llama", dict(bits=4, block=64, embed_bits=4)),
                                       ("qwen2", dict(bits=4, block=64, embed_bits=8))])
def test_quant_settings(family, kw, checkpoint, tmp_path):
    """Per-channel, symmetric and a head at other bits: the bundle still equals its fake-quantized model."""
    src = checkpoint(family)
    export(src, tmp_path / "b", **kw)
    from transformers import AutoTokenizer
    ids = AutoTokenizer.from_pretrained(src)(PROMPT)["input_ids"]
    got = mnn_llm.run(tmp_path / "b", ids, steps=8, exact=True)
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    raw = model.get_input_embeddings().weight.detach().numpy().copy()
    with torch.no_grad():
        for name, mod in model.named_modules():
            if isinstance(mod, torch.nn.Linear):
                head = name == "lm_head"
                bits = kw.get("lm_bits", kw["bits"]) if head else kw["bits"]
                d = dequantize(quantize(mod.weight.detach().numpy(), bits, kw["block"], kw.get("symmetric", False)))
                mod.weight.data = torch.from_numpy(d)
        e = model.get_input_embeddings()
        if "embed_bits" in kw:              # embeddings of their own bits (a file of their own, tied or not)
            if model.config.tie_word_embeddings:
                e.weight = torch.nn.Parameter(e.weight.data.clone())   # untie: the head keeps its own bits
            e.weight.data = torch.from_numpy(dequantize(quantize(raw, kw["embed_bits"], kw["block"])))
        elif model.config.tie_word_embeddings:
            e.weight.data = model.lm_head.weight.data
        else:
            e.weight.data = e.weight.data.bfloat16().float()
        g = model.generate(torch.tensor([ids]), max_new_tokens=9, do_sample=False, output_logits=True,
                           return_dict_in_generate=True)
    assert got["tokens"] == g.sequences[0, len(ids):].tolist()
    assert min(_cos(a, b[0].numpy()) for a, b in zip(got["steps"], g.logits)) >= 0.999


@pytest.mark.parametrize("bits", [16, 4])
def test_trained_model_matches_transformers(bits, tmp_path):
    """The trained Llama (real weight statistics, untied embeddings): the same bars as the families."""
    from fixtures.llm_checkpoints import build_trained
    src = build_trained(ROOT / "build" / "llm" / "trained-test", "test")
    export(src, tmp_path / "b", bits=bits, block=64)
    check_against_transformers(src, tmp_path / "b", bits)


def test_softcap_reported(tmp_path):
    from fixtures.llm_checkpoints import build_random
    r = export(build_random("gemma2", CACHE / "gemma2-cap5"), tmp_path / "b", bits=16)
    assert any("soft-capping" in n for n in r["notes"])
    assert r["attention_type"] == "mix"


def test_sampler_from_generation_config(checkpoint, tmp_path):
    """generation_config.json's do_sample false -> greedy; its temperature/top-k/top-p otherwise."""
    import shutil
    src = tmp_path / "m"
    shutil.copytree(checkpoint("qwen2"), src)
    export(src, tmp_path / "a")
    assert json.loads((tmp_path / "a" / "config.json").read_text())["sampler_type"] == "greedy"
    (src / "generation_config.json").write_text(json.dumps({"do_sample": True, "temperature": 0.7, "top_k": 20,
                                                            "top_p": 0.8, "repetition_penalty": 1.05}))
    export(src, tmp_path / "b")
    cfg = json.loads((tmp_path / "b" / "config.json").read_text())
    assert (cfg["sampler_type"], cfg["temperature"], cfg["top_k"], cfg["top_p"], cfg["repetition_penalty"]) == \
        ("mixed", 0.7, 20, 0.8, 1.05)


def test_report_and_files(checkpoint, tmp_path):
    r = export(checkpoint("qwen2"), tmp_path / "b", bits=4, block=64)
    names = set(r["files"])
    assert {"config.json", "llm.mnn", "llm.mnn.weight", "llm_config.json", "tokenizer.mtok"} <= names
    cfg = json.loads((tmp_path / "b" / "llm_config.json").read_text())
    assert cfg["tie_embeddings"][3:] == [4, 64]
    for t in r["tensors"]:
        oc, ic = t["shape"]
        bias = 4 * oc if t["name"].split("/")[-1] in ("q_proj", "k_proj", "v_proj") else 0     # Qwen2's q/k/v
        # header (22 bytes), 4-bit values, an fp32 (zero, scale) pair per block, fp32 bias
        assert t["bytes"] == 22 + oc * ic // 2 + 8 * oc * ic // t["block"] + bias, t
        assert t["block"] == (64 if ic % 64 == 0 else 32)      # halved until it divides (160 inputs)
    assert json.loads((tmp_path / "b" / "export.json").read_text())["settings"]["bits"] == 4


# ---- bad input: one line naming the file, exit 2, nothing written ---------------------------------

def _copy(src, dst):
    import shutil
    shutil.copytree(src, dst)
    return dst


def _expect_refused(src, out, *needles):
    with pytest.raises(MnnToolError) as e:
        export(src, out)
    msg = str(e.value)
    assert "\n" not in msg
    for n in needles:
        assert n in msg, msg
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")], "temporary folder left"
    return msg


def test_unsupported_architecture(checkpoint, tmp_path):
    src = _copy(checkpoint("qwen2"), tmp_path / "m")
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(model_type="mamba", architectures=["MambaForCausalLM"])
    (src / "config.json").write_text(json.dumps(cfg))
    msg = _expect_refused(src, tmp_path / "out", "mamba", "supported", "qwen2", "llama")
    assert "MambaForCausalLM" in msg


def test_config_disagrees_with_tensors(checkpoint, tmp_path):
    src = _copy(checkpoint("llama"), tmp_path / "m")
    cfg = json.loads((src / "config.json").read_text())
    cfg["intermediate_size"] += 16
    (src / "config.json").write_text(json.dumps(cfg))
    _expect_refused(src, tmp_path / "out", "mlp.gate_proj.weight", "the config says")


def test_missing_tensor(checkpoint, tmp_path):
    from safetensors.numpy import load_file, save_file
    src = _copy(checkpoint("qwen2"), tmp_path / "m")
    tensors = load_file(src / "model.safetensors")
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    save_file(tensors, src / "model.safetensors")
    _expect_refused(src, tmp_path / "out", "model.layers.1.self_attn.k_proj.weight", "missing")


def test_absurd_sizes(checkpoint, tmp_path):
    src = _copy(checkpoint("qwen2"), tmp_path / "m")
    cfg = json.loads((src / "config.json").read_text())
    cfg["hidden_size"] = 10 ** 12
    (src / "config.json").write_text(json.dumps(cfg))
    _expect_refused(src, tmp_path / "out", "config.json")


@pytest.mark.parametrize("damage", ["missing", "malformed"])
def test_tokenizer_bad(damage, checkpoint, tmp_path):
    src = _copy(checkpoint("qwen2"), tmp_path / "m")
    if damage == "missing":
        (src / "tokenizer.json").unlink()
    else:
        (src / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": ')
    _expect_refused(src, tmp_path / "out", "tokenizer")


def test_pickle_checkpoint_refused(tmp_path):
    src = tmp_path / "m"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (src / "pytorch_model.bin").write_bytes(b"\x80\x04not really")
    _expect_refused(src, tmp_path / "out", "safetensors")


def test_truncated_safetensors(checkpoint, tmp_path):
    src = _copy(checkpoint("qwen2"), tmp_path / "m")
    data = (src / "model.safetensors").read_bytes()
    (src / "model.safetensors").write_bytes(data[: len(data) // 2])
    _expect_refused(src, tmp_path / "out", "model.safetensors")


def test_output_inside_checkpoint_and_existing(checkpoint, tmp_path):
    src = checkpoint("qwen2")
    with pytest.raises(MnnToolError, match="inside the checkpoint"):
        export(src, src / "bundle")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(MnnToolError, match="not empty"):
        export(src, out)
    assert (out / "keep.txt").exists()


def test_cli_export_json_and_error(checkpoint, tmp_path):
    import subprocess
    exe = [sys.executable, "-m", "mnntool"]
    p = subprocess.run(exe + ["llm", "export", str(checkpoint("gpt2")), str(tmp_path / "b"), "--bits", "8", "--json"],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["settings"]["bits"] == 8 and (tmp_path / "b" / "llm.mnn").exists()
    p = subprocess.run(exe + ["llm", "export", str(tmp_path / "nothing"), str(tmp_path / "c")],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 2 and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "c").exists()
