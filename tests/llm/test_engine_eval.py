"""`mnntool llm eval --runtime mnntool` and `--kv-int8`: perplexity through the engine's logits
(engine/score.py), on the trained test model's held-out text at 16 bits, windows of 128.

- the engine with its float32 KV cache gives MNN-LLM's perplexity (exact mode, the same windows) within
  1e-4 and fp32 transformers' within 0.1% (the bound test_eval_cli.py holds MNN-LLM to), KL to
  transformers < 1e-4;
- with the int8 KV cache: the perplexity within 0.1% of the float cache's (measured +0.003%,
  benchmarks/llm_kv_int8.py), same top-1 as transformers >= 99%;
- a bad --runtime is one line and exit 2.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytest.importorskip("MNN")
pytest.importorskip("torch")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from fixtures.llm_checkpoints import build_trained
    from mnntool.llm.bundle import export
    src = build_trained(ROOT / "build" / "llm" / "trained-test", "test")
    out = tmp_path_factory.mktemp("engine_eval")
    export(src, out / "b16", bits=16)
    text = out / "text.txt"
    text.write_text((src / "heldout.txt").read_text(encoding="utf-8")[:6000], encoding="utf-8")
    return src, out / "b16", text


def _eval(*args, code: int = 0):
    p = subprocess.run([sys.executable, "-m", "mnntool", "llm", "eval", *map(str, args), "--json"],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == code, p.stderr[-2000:]
    return json.loads(p.stdout) if code == 0 else p.stderr


def test_engine_perplexity_float_and_int8_cache(trained):
    src, b16, text = trained
    mnn = _eval(b16, "--text", text, "--ctx", 128)
    eng = _eval(b16, "--text", text, "--ctx", 128, "--runtime", "mnntool", "--ref", src)
    kv8 = _eval(b16, "--text", text, "--ctx", 128, "--kv-int8", "--ref", src)
    assert eng["runtime"] == kv8["runtime"] == "mnntool" and kv8["mode"] == "int8 KV cache"
    assert eng["tokens"] == mnn["tokens"] > 500
    assert abs(eng["ppl"] / mnn["ppl"] - 1) < 1e-4, (eng["ppl"], mnn["ppl"])
    assert abs(eng["ppl"] / eng["ref_ppl"] - 1) < 1e-3 and eng["kl_mean"] < 1e-4
    assert eng["ppl"] != kv8["ppl"]                      # the int8 cache is used
    assert abs(kv8["ppl"] / eng["ppl"] - 1) < 1e-3, (kv8["ppl"], eng["ppl"])
    assert kv8["same_top1"] >= 0.99


def test_bad_runtime(trained):
    src, b16, text = trained
    err = _eval(b16, "--text", text, "--runtime", "onnx", code=2)
    assert "--runtime onnx" in err and "Traceback" not in err
