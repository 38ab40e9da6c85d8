"""The numpy layer-at-a-time decoder (AWQ's calibration model) against transformers, and AWQ's folding:
scaled weights with divided norms compute the same float function (tolerances stated per test)."""
from __future__ import annotations


import numpy as np
import pytest

from tests.conftest import ROOT

torch = pytest.importorskip("torch")
from fixtures.zoo import _without_torchvision_ops  # noqa: E402

_without_torchvision_ops()     # torchvision 0.28 is a CUDA wheel: its C ops do not load beside torch+cpu

from mnntool.errors import MnnToolError  # noqa: E402
from mnntool.llm import families  # noqa: E402
from mnntool.llm.awq import Calibrator  # noqa: E402
from mnntool.llm.checkpoint import Checkpoint  # noqa: E402
from mnntool.llm.decoder import Decoder, QuantPlan  # noqa: E402
from mnntool.llm.reference import LayerwiseModel, _rms  # noqa: E402

CACHE = ROOT / "build" / "llm" / "random"
FAMILIES = ["llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3", "phi3", "gpt2"]


def _model(ck):
    spec = families.spec(ck.config)
    dec = Decoder(spec, ck, None, QuantPlan())
    return spec, dec, LayerwiseModel(spec, dec.tensor, dec.maybe)


def _logits(spec, dec, model, ids):
    h = model.embed(np.asarray(ids))
    for i in range(spec.layers):
        h = model.layer(i, h, dec.layer_weights(i))
    h = model.norm(h, spec.names["final_norm"], spec.hidden)
    name = spec.names["embed"] if spec.tied or not dec.ck.has(spec.names["head"]) else spec.names["head"]
    y = h @ dec.tensor(name, (spec.vocab, spec.hidden)).T
    if spec.final_softcap:
        y = np.tanh(y / spec.final_softcap) * spec.final_softcap
    return y


@pytest.mark.parametrize("family", FAMILIES)
def test_reference_matches_transformers(family):
    """All positions' logits of a 40-token sequence: max abs error <= 2e-4 x the logits' scale."""
    from fixtures.llm_checkpoints import build_random
    from transformers import AutoModelForCausalLM
    src = build_random(family, CACHE / family, **({"attn_logit_softcapping": 50.0} if family == "gemma2" else {}))
    ids = list(np.random.default_rng(0).integers(3, 500, 40))
    with Checkpoint.open(src) as ck:
        got = _logits(*_model(ck), ids)
    m = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = m(torch.tensor([ids])).logits[0].numpy()
    assert np.abs(got - ref).max() <= 2e-4 * np.abs(ref).max(), np.abs(got - ref).max()


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3", "phi3"])
def test_awq_folding_is_exact_in_float(family):
    """Layer 0 with AWQ's scales in the weights and 1/s in the norms and v/up rows: the same output."""
    from fixtures.llm_checkpoints import build_random
    src = build_random(family, CACHE / family)
    with Checkpoint.open(src) as ck:
        spec, dec, model = _model(ck)
        seqs = [np.random.default_rng(k).integers(3, 500, 48) for k in range(3)]
        cal = Calibrator(spec, model, seqs, bits=4, block=32, symmetric=False, grid=6)
        h = [x.copy() for x in cal.hidden]
        w = dec.layer_weights(0)
        ref = [model.layer(0, x, w) for x in h]
        w2, div = cal.layer(0, w)
        assert any(not np.allclose(w2[k][0], w[k][0]) for k in w), "the search kept every scale at 1"
        names = {spec.names["in_norm"].format(i=0): div["qkv"],
                 spec.names["pre_ff_norm" if spec.sandwich else "post_norm"].format(i=0): div["gate_up"]}

        def tensor(name, shape):
            t = dec.tensor(name, shape)
            if name in names:     # the Decoder divides gamma + offset; the model adds the offset itself
                return (t + np.float32(spec.norm_offset)) / names[name] - np.float32(spec.norm_offset)
            return t
        folded = LayerwiseModel(spec, tensor, dec.maybe)
        for x, r in zip(h, ref):
            y = folded.layer(0, x, w2)
            assert np.abs(y - r).max() <= 1e-4 * np.abs(r).max()


def test_awq_never_worse_on_its_tokens():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((256, 64)).astype(np.float32) * np.exp(rng.standard_normal(64)).astype(np.float32)
    w = rng.standard_normal((96, 64)).astype(np.float32)
    spec = families.Spec("llama", "llama", 64, 1, 4, 4, 16, 96, 100, 1e-6)
    cal = Calibrator.__new__(Calibrator)
    cal.s, cal.bits, cal.block, cal.symmetric, cal.grid = spec, 4, 32, False, 10
    s, alpha = cal.search(x, [w])
    from mnntool.llm.quantize import dequantize, quantize
    plain = np.mean((x @ dequantize(quantize(w, 4, 32)).T - x @ w.T) ** 2)
    scaled = np.mean((x @ (dequantize(quantize(w * s, 4, 32)) / s).T - x @ w.T) ** 2)
    assert scaled <= plain and alpha > 0      # outlier channels: a non-trivial scale wins


def test_rms_helper():
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    y = torch.nn.functional.rms_norm(torch.from_numpy(x), (8,), eps=1e-6).numpy()
    assert np.allclose(_rms(x, np.ones(8, np.float32), 1e-6), y, atol=1e-6)


def test_calib_text_refused_at_16_bits(tmp_path):
    from fixtures.llm_checkpoints import build_random
    from mnntool.llm.bundle import export
    text = tmp_path / "t.txt"
    text.write_text("def f(x):\n    return x\n" * 50)
    with pytest.raises(MnnToolError, match="16"):
        export(build_random("llama", CACHE / "llama"), tmp_path / "o", bits=16, calib_text=text)
    with pytest.raises(MnnToolError, match="no such file"):
        export(build_random("llama", CACHE / "llama"), tmp_path / "o", bits=4, calib_text=tmp_path / "none.txt")
    assert not (tmp_path / "o").exists()
