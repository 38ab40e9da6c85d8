"""mnntool.llm.evaluate: the perplexity / KL arithmetic against closed forms and torch, the windows'
coverage, and MNN-LLM's all-position logits (in a child process) against its own last-position prefill
logits and a fake-quantized transformers model."""
from __future__ import annotations

import math

import numpy as np
import pytest

from mnntool.llm import evaluate as ev


# ------------------------------------------------------------------------------------------- windows

@pytest.mark.parametrize("n,ctx,stride", [(1000, 64, 32), (1000, 64, 63), (1000, 64, 7), (65, 64, 32),
                                          (64, 64, 32), (10, 64, 32), (129, 64, 48), (2, 2, 1)])
def test_windows_score_every_token_once(n, ctx, stride):
    ids = list(range(100, 100 + n))
    ws = ev.windows(ids, ctx, stride)
    scored = []
    for w in ws:
        assert 1 <= w.first < len(w.ids) <= ctx
        assert w.ids == ids[w.start:w.start + len(w.ids)]
        scored += range(w.start + w.first, w.start + len(w.ids))
        if w is not ws[0]:
            assert len(w.ids) == ctx and w.first >= ctx - stride      # full window, >= ctx - stride context
    assert scored == list(range(1, n))                              # every token but the first, once, in order


def test_windows_llamacpp_style():
    ws = ev.windows(list(range(300)), 64, style="llamacpp")
    assert [(w.start, len(w.ids), w.first) for w in ws] == [(s, 64, 32) for s in (0, 64, 128, 192)]
    assert ev.windows([1], 8) == [] and ev.windows([], 8) == []
    with pytest.raises(ValueError):
        ev.windows(list(range(10)), 8, stride=8)        # the window's first token would go unscored


# ---------------------------------------------------------------------------------------- statistics

def test_perplexity_of_uniform_is_vocab_size():
    vocab = 37
    ws = ev.windows(np.random.default_rng(0).integers(0, vocab, 500).tolist(), 50)
    logits = [np.full((len(w.ids), vocab), 3.25, np.float32) for w in ws]
    assert ev.perplexity(logits, ws) == pytest.approx(vocab, rel=1e-12)
    scored = [np.zeros((w.scored, vocab), np.float32) for w in ws]          # rows="scored" arrays
    assert ev.perplexity(scored, ws) == pytest.approx(vocab, rel=1e-12)


def test_perplexity_matches_torch_cross_entropy():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 50, 300).tolist()
    ws = ev.windows(ids, 40, 16)
    logits = [rng.normal(0, 3, (len(w.ids), 50)).astype(np.float32) for w in ws]
    ce = torch.cat([torch.nn.functional.cross_entropy(torch.from_numpy(a[w.first - 1:-1]).double(),
                                                      torch.tensor(w.ids[w.first:]), reduction="none")
                    for a, w in zip(logits, ws)])
    assert len(ce) == len(ids) - 1
    assert ev.perplexity(logits, ws) == pytest.approx(math.exp(ce.mean().item()), rel=1e-12)


def test_kl_of_identical_logits_is_zero():
    a = np.random.default_rng(2).normal(0, 5, (300, 1000)).astype(np.float32)
    s = ev.kl_stats(a, a.copy())
    assert s["kl_mean"] == 0 and s["kl_max"] == 0 and s["same_top1"] == 1 and s["positions"] == 300


def test_kl_matches_scipy_and_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    p = rng.normal(0, 2, (2500, 300)).astype(np.float32)                 # > ROWS: crosses a chunk edge
    q = (p + rng.normal(0, 0.5, p.shape)).astype(np.float32)
    q[:100] = p[:100]
    kl, same = ev.kl_rows(p, q)
    lp = torch.log_softmax(torch.from_numpy(p).double(), -1)
    lq = torch.log_softmax(torch.from_numpy(q).double(), -1)
    ref = torch.nn.functional.kl_div(lq, lp, log_target=True, reduction="none").sum(-1).numpy()
    np.testing.assert_allclose(kl, ref, rtol=1e-10, atol=1e-15)
    try:
        from scipy import special
    except ImportError:                                     # not a dependency: torch's kl_div is the check
        special = None
    if special is not None:
        sp = special.rel_entr(special.softmax(p[:50].astype(np.float64), -1),
                              special.softmax(q[:50].astype(np.float64), -1)).sum(-1)
        np.testing.assert_allclose(kl[:50], sp, rtol=1e-9, atol=1e-15)
    assert (same == (p.argmax(1) == q.argmax(1))).all()
    s = ev.kl_stats([p[:1000], p[1000:]], [q[:1000], q[1000:]])
    assert s["kl_mean"] == pytest.approx(ref.mean(), rel=1e-10)
    assert s["kl_max"] == pytest.approx(ref.max(), rel=1e-10)
    assert s["kl_p99"] == pytest.approx(np.percentile(ref, 99), rel=1e-10)
    assert s["same_top1"] == pytest.approx((p.argmax(1) == q.argmax(1)).mean())


def test_kl_stats_uses_scored_rows_only():
    rng = np.random.default_rng(4)
    ws = ev.windows(list(range(100)), 20, 10)
    ref = [rng.normal(size=(20, 30)) for _ in ws]
    got = [r.copy() for r in ref]
    for g, w in zip(got, ws):
        g[:w.first - 1] += rng.normal(size=(w.first - 1, 30))            # unscored rows: differ freely
        g[-1] += 5.0                                                       # last row predicts nothing
    s = ev.kl_stats(ref, got, ws)
    assert s["kl_max"] == 0 and s["positions"] == 99


# ------------------------------------------------------------------------------------------- MNN-LLM

def _tiny_qwen2(out):
    """A tiny random Qwen2 (tied head, q/k/v biases, GQA) saved as a Hugging Face folder, as
    build/llmref/make_tiny.py makes one, with the fixtures' Qwen2-style tokenizer trained on four small
    stdlib files. (A bare ByteLevel pre-tokenizer would not do: transformers 5 loads a qwen2 folder's
    tokenizer as Qwen2Tokenizer, which swaps in Qwen2's split regex, while tokenizer.json has GPT-2's.)"""
    import sysconfig
    from pathlib import Path
    from fixtures.zoo import _without_torchvision_ops
    _without_torchvision_ops()
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from fixtures.llm_checkpoints import tokenizer_files
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [(stdlib / f).read_text(encoding="utf-8") for f in ("abc.py", "bisect.py", "keyword.py", "this.py")]
    tok = tokenizer_files(out, "bytelevel", vocab=512, texts=texts)
    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=128, vocab_size=tok["vocab"], initializer_range=0.1,
                      max_position_embeddings=512, tie_word_embeddings=True, eos_token_id=tok["eos"])
    model = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0.0, 0.1)
    model.save_pretrained(out)
    return Path(out)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny checkpoint and its 8-bit bundle."""
    pytest.importorskip("MNN")
    from mnntool.llm.bundle import export
    root = tmp_path_factory.mktemp("evaluate")
    src = _tiny_qwen2(root / "qwen2")
    export(src, root / "bundle", bits=8, block=64)
    return src, root / "bundle"


def test_mnn_logits_equal_prefill_logits(tiny):
    from mnntool.llm import mnn_llm
    src, bundle = tiny
    ids = np.random.default_rng(5).integers(0, 500, 60).tolist()
    ws = ev.windows(ids, 24, 12)
    info = {}
    got = ev.mnn_logits(bundle, ws, info=info)
    assert len(got) == len(ws) == 4 and info["tokens"] == sum(len(w.ids) for w in ws)
    assert all(a.dtype == np.float32 and a.shape == (len(w.ids), 512) for a, w in zip(got, ws))
    # later windows (after reset) and an inner row against fresh prefills: cache emptied, positions from 0
    for k, j in ((0, 23), (2, 23), (3, 11)):
        last = mnn_llm.run(bundle, ws[k].ids[:j + 1], steps=0)["steps"][0]
        np.testing.assert_allclose(got[k][j], last, rtol=0, atol=1e-4)
    # every row against transformers on the weights as the bundle rounds them (exact mode: float32)
    ref = ev.hf_logits(src, ws, fake_quant=ev.fake_quantizer(8, 64))
    assert max(float(np.abs(a - b).max()) for a, b in zip(ref, got)) < 2e-3
    assert ev.kl_stats(ref, got, ws)["same_top1"] == 1.0
    scored = ev.mnn_logits(bundle, ws[:2], rows="scored")
    np.testing.assert_array_equal(scored[1], got[1][ws[1].first - 1:-1])


def test_tokenizers_agree(tiny):
    src, bundle = tiny
    text = "def f(x):\n    return x * 2  # twice\n\n\nclass A:\n    pass\n\u00e9t\u00e9 \U0001f600 12345\n"
    t = ev.tokenize(text, bundle=bundle, model_dir=src)
    assert t["agree"], (t["mnn"], t["hf"], t["first_diff"])
    assert t["ids"] == t["mnn"] and len(t["ids"]) > 10
