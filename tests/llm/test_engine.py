"""mnntool's own runtime for MNN-LLM bundles (mnntool/llm/engine) against MNN-LLM itself.

Each family's tiny random checkpoint (fixtures/llm_checkpoints.py) is exported at 16, 8 and 4 bits and
run in both runtimes on the same prompt: MNN-LLM (`MNN.llm`, exact mode: precision/memory high, a
child process) decodes greedily; mnntool follows MNN-LLM's tokens step by step, and every step's
logits must agree (cosine >= 0.9999) and give the same greedy token, for 32 steps after the prompt.
llmexport's bundles in build/llmref/out (when present) are run the same way: the engine matches the
graph's structure, not its names. The kernels are checked against numpy's dequantize-then-matmul.
"""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import ROOT

pytest.importorskip("MNN")
pytest.importorskip("torch")
from fixtures.zoo import _without_torchvision_ops  # noqa: E402

_without_torchvision_ops()     # torchvision 0.28 is a CUDA wheel: its C ops do not load beside torch+cpu

from mnntool.llm import mnn_llm  # noqa: E402
from mnntool.llm.bundle import export  # noqa: E402

CACHE = ROOT / "build" / "llm" / "random"
OVERRIDES = {"gemma2": {"attn_logit_softcapping": 50.0}}     # MNN's Attention has no soft-cap (test_export.py)
STEPS = 32
PROMPT = "def main(argv):\n    return 0"
LLMREF = ROOT / "build" / "llmref" / "out"

FAMILIES = ["llama", "smollm", "qwen2", "qwen3", "mistral", "gemma2", "gemma3", "phi3", "gpt2"]
CASES = [(f, 4) for f in FAMILIES] + [(f, 16) for f in FAMILIES] + [(f, 8) for f in ("qwen2", "llama", "gemma3", "gpt2")]


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    from fixtures.llm_checkpoints import build_random
    root = tmp_path_factory.mktemp("engine")
    made = {}

    def get(family: str, bits: int, **kw):
        key = (family, bits, tuple(sorted(kw.items())))
        if key not in made:
            src = build_random(family, CACHE / family, **OVERRIDES.get(family, {}))
            out = root / f"{family}-q{bits}-{len(made)}"
            export(src, out, bits=bits, block=64, **kw)
            made[key] = out
        return made[key]
    return get


def _cos(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def check_against_mnn(bundle, steps: int = STEPS, prompt: str = PROMPT, threads: int = 1, precision: str = "normal",
                      min_cos: float = 0.9999):
    """MNN-LLM's greedy decoding vs the engine's, step by step; returns the tokens."""
    from mnntool.llm import load
    llm = load(bundle, threads=threads, precision=precision)
    ids = llm.encode(prompt)
    ref = mnn_llm.run(bundle, ids, steps=steps, exact=True)
    llm.model.reset()
    logits = llm.model.forward(ids)
    for step in range(steps + 1):
        theirs = np.asarray(ref["steps"][step], np.float32)
        c = _cos(logits, theirs)
        assert c >= min_cos, f"{bundle} step {step}: logits cosine {c:.7f}"
        assert int(np.argmax(logits)) == ref["tokens"][step], f"{bundle} step {step}: token differs"
        if step < steps:
            logits = llm.model.forward([ref["tokens"][step]])
    # and generate() itself gives the same greedy tokens
    g = llm.generate(ids, max_new_tokens=steps + 1, stop=False)
    assert g.ids == ref["tokens"]
    return ref["tokens"]


@pytest.mark.parametrize("family,bits", CASES)
def test_family_matches_mnn_llm(family, bits, bundles):
    tokens = check_against_mnn(bundles(family, bits))
    assert len(set(tokens)) >= 3, "the fixture's greedy decoding should wander"


@pytest.mark.parametrize("kw", [dict(symmetric=True), dict(lm_bits=8), dict(block=0)])
def test_quant_settings(kw, bundles):
    """Symmetric blocks (scales only), an 8-bit head under 4-bit blocks, one block per channel."""
    kw = dict(kw)
    block = kw.pop("block", None)
    if block is not None:
        from fixtures.llm_checkpoints import build_random
        import tempfile
        from pathlib import Path
        out = Path(tempfile.mkdtemp()) / "b"
        export(build_random("qwen2", CACHE / "qwen2"), out, bits=4, block=block)
        check_against_mnn(out, steps=8)
        return
    check_against_mnn(bundles("qwen2", 4, **kw), steps=8)


def _llmref():
    return sorted(p for p in LLMREF.glob("*") if (p / "llm.mnn").is_file()) if LLMREF.is_dir() else []


@pytest.mark.skipif(not _llmref(), reason="no llmexport bundles in build/llmref/out")
@pytest.mark.parametrize("bundle", _llmref(), ids=lambda p: p.name)
def test_llmexport_bundle(bundle):
    check_against_mnn(bundle)


@pytest.mark.parametrize("family,bits", [("qwen2", 4), ("gemma3", 8), ("llama", 16)])
def test_precision_high(family, bits, bundles):
    """Float32 inputs to the quantized layers (the file's layout read in place): MNN-LLM's exact mode
    to float32 rounding."""
    check_against_mnn(bundles(family, bits), steps=16, precision="high", min_cos=0.999999)


def test_two_threads(bundles):
    check_against_mnn(bundles("qwen2", 4), steps=8, threads=2)


def test_reference_path_agrees(bundles):
    """The Numba path and the numpy reference give the same logits over a prompt and decode steps."""
    from mnntool.llm.engine import kernels
    from mnntool.llm.engine.model import Model
    for family in ("gemma2", "gpt2"):
        b = bundles(family, 4)
        fast = Model.load(b)
        kernels.REFERENCE = True
        try:
            ref = Model.load(b)
        finally:
            kernels.REFERENCE = False
        ids = [5, 9, 200, 31, 7, 64, 3, 12, 99, 100, 11]
        a, r = fast.forward(ids, all_logits=True), ref.forward(ids, all_logits=True)
        # the int16 input rounding (packed.py), amplified by the random 4-bit model: 1e-4..1.1e-3 of the
        # largest logit seen with either the vpmaddwd or the VNNI tiles (the latter's |x| <= 32639)
        assert np.abs(a - r).max() < 2e-3 * np.abs(r).max()
        for t in (4, 8):
            assert np.abs(fast.forward([t]) - ref.forward([t])).max() < 2e-3 * np.abs(r).max()


# ---- kernels against numpy ----------------------------------------------------------------------

def _qweight(bits, oc, ic, block, symmetric, seed=0, bias=True):
    from mnntool.llm.engine.weights import QWeight
    from mnntool.llm.quantize import dequantize, quantize
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((oc, ic)).astype(np.float32)
    b = rng.standard_normal(oc).astype(np.float32) if bias else None
    if bits == 16:
        return QWeight("w", oc, ic, 16, 0, w.astype(np.float16), None, None, b), w.astype(np.float16).astype(np.float32)
    q = quantize(w, bits, block, symmetric)
    nb = ic // q.block
    half = np.float32(1 << (bits - 1))
    if symmetric:
        scale, zero = q.alpha.reshape(oc, nb), None
        offset = -half * scale
    else:
        a = q.alpha.reshape(oc, nb, 2)
        zero, scale = np.ascontiguousarray(a[:, :, 0]), np.ascontiguousarray(a[:, :, 1])
        offset = zero - half * scale
    codes = q.stored.reshape(oc, ic * bits // 8)
    qw = QWeight("w", oc, ic, bits, q.block, codes, scale, offset.astype(np.float32), b, symmetric, zero)
    return qw, dequantize(q)


@pytest.mark.parametrize("bits,block,sym", [(4, 64, False), (4, 32, True), (4, 128, False), (8, 64, False),
                                            (8, 16, True), (16, 0, True)])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("layout", ["file", "packed"])
def test_kernel_matches_numpy(bits, block, sym, threads, layout):
    from mnntool.llm.engine.kernels import threads as use_threads
    from mnntool.llm.engine.packed import PackedLinear
    from mnntool.llm.engine.qkernels import HAS_I16, QLinear
    oc, ic = 203, 256                   # rows not a multiple of the kernel's row group
    qw, dense = _qweight(bits, oc, ic, block, sym)
    # the engine's own dequantization is the reference's
    assert np.allclose(qw.dequantize(), dense, rtol=1e-6, atol=1e-6)
    if layout == "packed":
        if bits == 16 or not HAS_I16:
            pytest.skip("16-bit layers (or hosts without AVX512-BW) are read in place")
        lin = PackedLinear.of([qw, qw], threads)      # two layers stacked in one: both outputs checked
    else:
        lin = QLinear.of(qw, threads)
    assert lin is not None
    rng = np.random.default_rng(1)
    with use_threads(threads):
        for T in (1, 2, 7):
            x = rng.standard_normal((T, ic)).astype(np.float32)
            ref = x.astype(np.float64) @ dense.T.astype(np.float64) + qw.bias
            outs = lin.apply(x) if layout == "packed" else [lin.apply(x)]
            err = max(np.abs(got - ref).max() / np.abs(ref).max() for got in outs)
            # the packed layers' int16 inputs (packed.py): the input's rounding, ~1e-5 of a block's largest
            assert err < (3e-4 if layout == "packed" else 2e-6), (T, err)


def test_weights_are_the_files_bytes(bundles):
    """The stored values are read in place from the memory map, not unpacked or copied."""
    from mnntool.llm.engine.model import Model
    m = Model.load(bundles("qwen2", 4))
    w = m.layers[0].qkv.ws[0]
    assert w.bits == 4 and w.codes.dtype == np.uint8 and w.codes.shape == (w.oc, w.ic // 2)
    assert w.codes.base is not None and not w.codes.flags.owndata
    assert m.embed.kind == "quant"      # tied: the rows come from the quantized head


# ---- tokenizer, API, CLI -----------------------------------------------------------------------

TEXTS = ["def main(argv):\n    return 0", "Hello world!  Two  spaces\tand tab\n\n", "héllo wörld 日本語 🙂",
         "<|im_start|>user\nhi<|im_end|>\n", "x = 12345 + 3.14159", "  leading", "<s>bos</s>", "don't I'M"]


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_tokenizer_matches_mnn_llm(family, bundles):
    from mnntool.llm.engine.tokenizer import Tokenizer
    b = bundles(family, 4)
    tok = Tokenizer(b / "tokenizer.mtok")
    ref = mnn_llm.run(b, [1], steps=0, encode=TEXTS)["encoded"]
    assert [tok.encode(t) for t in TEXTS] == ref
    assert tok.decode(tok.encode(TEXTS[0])) == TEXTS[0]
    assert "日本語 🙂" in tok.decode(tok.encode(TEXTS[2]))


def test_stream_decoder_waits_for_whole_characters(bundles):
    from mnntool.llm.engine.tokenizer import StreamDecoder, Tokenizer
    tok = Tokenizer(bundles("qwen2", 4) / "tokenizer.mtok")
    ids = tok.encode("日本語 🙂 ok")
    s = StreamDecoder(tok)
    pieces = [s.add(i) for i in ids] + [s.flush()]
    assert "".join(pieces) == "日本語 🙂 ok"
    assert all("\ufffd" not in p for p in pieces)


def test_sampling_is_seeded(bundles):
    from mnntool.llm import load
    llm = load(bundles("llama", 4))
    a = llm.generate(PROMPT, max_new_tokens=12, temperature=0.9, top_k=50, top_p=0.95, seed=7, stop=False)
    b = llm.generate(PROMPT, max_new_tokens=12, temperature=0.9, top_k=50, top_p=0.95, seed=7, stop=False)
    c = llm.generate(PROMPT, max_new_tokens=12, temperature=0.9, top_k=50, top_p=0.95, seed=8, stop=False)
    assert a.ids == b.ids and a.ids != c.ids
    assert llm.forward(a.prompt_ids, all_logits=True).shape == (len(a.prompt_ids), llm.vocab)


def test_cli_run_and_bench(bundles):
    b = str(bundles("qwen2", 4))
    exe = [sys.executable, "-m", "mnntool", "llm"]
    p = subprocess.run(exe + ["run", b, "--prompt", PROMPT, "-n", "8", "--json"], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["generated_tokens"] == 8 or r["stopped"] == "stop"
    p = subprocess.run(exe + ["run", b, "--prompt", PROMPT, "-n", "8"], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0 and p.stdout.startswith(PROMPT), p.stderr
    p = subprocess.run(exe + ["bench", b, "-p", "16", "-n", "8", "-r", "2", "--json"], capture_output=True, text=True,
                       cwd=ROOT)
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    assert [r["test"] for r in rows] == ["pp16", "tg8"]
    assert all(r["avg_ts"] > 0 and r["peak_rss"] > 0 and len(r["samples_ts"]) == 2 for r in rows)
    tg = rows[1]        # the decode row against the host's measured bandwidth (engine/membw.py)
    assert tg["bandwidth_read_GBps"] > 0 and tg["bytes_per_token"] >= tg["model_size"] > 0
    rate = tg["n_gen"] / (tg["avg_ns"] * 1e-9)          # tokens over the mean time (not the mean of the rates)
    assert abs(tg["bandwidth_fraction"] * tg["bandwidth_limit_ts"] - rate) < 1e-3 * rate
    p = subprocess.run(exe + ["run", b, "--prompt", PROMPT, "-n", "8", "--kv-int8", "--json"], capture_output=True,
                       text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["generated_tokens"] >= 1
    p = subprocess.run(exe + ["run", str(ROOT / "nothing"), "--prompt", "x"], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 2 and "Traceback" not in p.stderr
