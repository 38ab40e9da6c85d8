"""`mnntool llm eval`: perplexity through MNN-LLM's logits against transformers' own, on the trained model."""
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
    out = tmp_path_factory.mktemp("eval")
    export(src, out / "b16", bits=16)
    export(src, out / "b4", bits=4, block=64)
    text = out / "text.txt"
    text.write_text((src / "heldout.txt").read_text(encoding="utf-8")[:6000], encoding="utf-8")
    return src, out, text


def _eval(*args):
    p = subprocess.run([sys.executable, "-m", "mnntool", "llm", "eval", *map(str, args), "--json"],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout)


def test_16_bit_perplexity_is_transformers(trained):
    """At 16 bits the bundle's perplexity equals fp32 transformers' on the same windows within 0.1%."""
    src, out, text = trained
    r = _eval(out / "b16", "--text", text, "--ref", src, "--ctx", 128)
    assert r["tokens"] > 500 and "note" not in r
    assert abs(r["ppl"] / r["ref_ppl"] - 1) < 1e-3, (r["ppl"], r["ref_ppl"])
    assert r["kl_mean"] < 1e-4 and r["same_top1"] > 0.99


def test_4_bit_costs_little_and_kl_is_consistent(trained):
    src, out, text = trained
    r = _eval(out / "b4", "--text", text, "--ref", src, "--ctx", 128)
    assert 0 < r["ppl"] / r["ref_ppl"] - 1 < 0.05
    assert 0 < r["kl_mean"] <= r["kl_p99"] <= r["kl_max"]
    # against another bundle: the 16-bit one is the reference, the same windows
    r2 = _eval(out / "b4", "--text", text, "--ref", out / "b16", "--ctx", 128)
    assert r2["ppl"] == pytest.approx(r["ppl"], rel=1e-9)
    assert r2["kl_mean"] == pytest.approx(r["kl_mean"], rel=0.05)


def test_bad_inputs(trained, tmp_path):
    src, out, text = trained
    for args, needle in ((["--text", tmp_path / "none.txt"], "no such file"),):
        p = subprocess.run([sys.executable, "-m", "mnntool", "llm", "eval", str(out / "b4"), *map(str, args)],
                           capture_output=True, text=True, cwd=ROOT)
        assert p.returncode == 2 and needle in p.stderr and "Traceback" not in p.stderr
    p = subprocess.run([sys.executable, "-m", "mnntool", "llm", "eval", str(tmp_path), "--text", str(text)],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 2 and "not an MNN-LLM bundle" in p.stderr
