"""`mnntool llm verify`: per-layer hidden states and logits of a bundle (mnntool's engine, MNN-LLM) against
the float32 checkpoint it came from (mnntool's numpy decoder, or transformers).

Tolerances: a 16-bit bundle of a random checkpoint keeps every hidden state at cosine >= 0.9999 (the
16-bit defaults; measured >= 0.99999); a 4-bit bundle of the trained "test" Llama meets the 4-bit
defaults (cosine >= 0.99 per layer, measured 0.9977; top-1 >= 80%, measured 89%; KL mean <= 0.05,
measured 0.004), and MNN-LLM's logits equal the engine's to cosine >= 0.9999. A bundle whose layer 1
down-projection is negated fails at "layer 1" and not before; bundles of other checkpoints exit 3.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from tests.conftest import ROOT

pytest.importorskip("torch")
from fixtures.zoo import _without_torchvision_ops  # noqa: E402

_without_torchvision_ops()     # torchvision 0.28 is a CUDA wheel: its C ops do not load beside torch+cpu

from mnntool.errors import MnnToolError  # noqa: E402
from mnntool.llm.bundle import export  # noqa: E402
from mnntool.llm.verify import EXIT_FAIL, EXIT_NOT_SAME_MODEL, EXIT_PASS, JSON_SCHEMA, verify  # noqa: E402

CACHE = ROOT / "build" / "llm" / "random"
HAS_MNN = __import__("importlib").util.find_spec("MNN") is not None


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    from fixtures.llm_checkpoints import build_random, build_trained
    root = tmp_path_factory.mktemp("llmverify")
    trained = build_trained(ROOT / "build" / "llm" / "trained-test", "test")
    qwen2 = build_random("qwen2", CACHE / "qwen2")
    out = {"trained": trained, "qwen2": qwen2, "root": root}
    export(qwen2, root / "qwen2-16", bits=16)
    export(trained, root / "trained-4", bits=4, block=64)
    return out


def _cli(*args):
    p = subprocess.run([sys.executable, "-m", "mnntool", "llm", "verify", *map(str, args)], capture_output=True,
                       text=True, cwd=ROOT)
    return p.returncode, p.stdout, p.stderr


def _corrupt_layer(bundle, layer: int) -> None:
    """Negate layer `layer`'s down projection in llm.mnn.weight: its (zero, scale) pairs times -1."""
    from mnntool.llm.engine.files import open_bundle
    from mnntool.llm.engine.graph import read_plan
    files = open_bundle(bundle)
    op = read_plan(files.graph, files.llm_config).layers[layer].down
    off, wlen, alen = op.external[:3]
    data = bytearray(files.weights.read_bytes())
    alpha = np.frombuffer(bytes(data[off + wlen:off + wlen + alen]), np.float32)
    data[off + wlen:off + wlen + alen] = (-alpha).astype(np.float32).tobytes()
    files.weights.write_bytes(bytes(data))


@pytest.mark.parametrize("family", ["qwen2", "gemma3", "gpt2"])
def test_16_bit_bundle_passes_every_layer(family, made, tmp_path):
    from fixtures.llm_checkpoints import build_random
    src = made["qwen2"] if family == "qwen2" else build_random(family, CACHE / family)
    bundle = made["root"] / "qwen2-16" if family == "qwen2" else tmp_path / "b"
    if family != "qwen2":
        export(src, bundle, bits=16)
    r = verify(bundle, src, mnn=False)
    assert r["exit_code"] == EXIT_PASS and r["pass"] and r["first_failing"] is None
    assert r["bits"] == 16 and r["thresholds"]["min_cosine"] == 0.9999
    assert [m["name"] for m in r["layers"]] == ["embed"] + [f"layer {i}" for i in range(len(r["layers"]) - 1)]
    assert min(m["cosine"] for m in r["layers"]) >= 0.99999
    lg = r["logits"][0]
    assert lg["runtime"] == "mnntool" and lg["top1"] >= 0.98 and lg["kl_mean"] < 1e-4     # near-ties may flip
    assert r["inputs"] == {"kind": "random", "seed": 0, "tokens": 64, "range": [0, 1024],
                           "distribution": "uniform token ids in [0, 1024), numpy default_rng(0)"}
    assert r["ids"] == np.random.default_rng(0).integers(0, 1024, 64).tolist()


@pytest.mark.skipif(not HAS_MNN, reason="MNN-LLM (the mnn wheel) is not installed")
def test_4_bit_bundle_passes_its_thresholds_in_both_runtimes(made, tmp_path):
    rc, out, err = _cli(made["root"] / "trained-4", made["trained"], "--json", "--junit", tmp_path / "j.xml",
                        "--report", tmp_path / "r.html")
    assert rc == 0, err[-2000:]
    r = json.loads(out)
    import jsonschema
    jsonschema.validate(r, JSON_SCHEMA)
    assert r["bits"] == 4 and r["thresholds"]["source"] == "defaults for 4-bit weights"
    assert all(0.99 <= m["cosine"] < 0.99999 for m in r["layers"][1:])      # 4-bit rounding shows, within limits
    engine, mnn = r["logits"]
    assert mnn["runtime"] == "mnn" and mnn["mode"] == "exact"
    assert mnn["vs_engine"]["cosine"] >= 0.9999 and mnn["vs_engine"]["top1"] >= 0.98
    assert engine["top1"] >= 0.8 and 0 < engine["kl_mean"] <= 0.05
    suite = ET.parse(tmp_path / "j.xml").getroot()
    assert suite.tag == "testsuites" and suite.get("failures") == "0" and suite.get("tests") == str(len(r["layers"]) + 3)
    names = [c.get("name") for c in suite.iter("testcase")]
    assert names[:2] == ["embed", "layer 0"] and names[-1] == "same checkpoint"
    assert "PASS" in (tmp_path / "r.html").read_text()


def test_corrupted_layer_fails_naming_it(made, tmp_path):
    bundle = tmp_path / "bad"
    shutil.copytree(made["root"] / "trained-4", bundle)
    _corrupt_layer(bundle, 1)
    rc, out, err = _cli(bundle, made["trained"], "--no-mnn", "--junit", tmp_path / "j.xml", "--output-format", "github")
    assert rc == EXIT_FAIL, err[-2000:]
    assert "first failing" in out and "::error" in out and "layer 1" in out
    suite = ET.parse(tmp_path / "j.xml").getroot()
    failed = [c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None]
    assert failed == ["layer 1", "logits (mnntool engine)"]
    msg = next(c for c in suite.iter("testcase") if c.get("name") == "layer 1").find("failure").get("message")
    assert "first failing" in msg and "threshold cosine >= 0.99" in msg
    r = verify(bundle, made["trained"], mnn=False)
    assert r["first_failing"] == "layer 1" and [m["pass"] for m in r["layers"]] == [True, True, False]
    assert r["layers"][2]["cosine"] < 0.95       # measured 0.90


def test_nan_in_a_layer_fails_with_valid_json(made, tmp_path):
    """NaN scales in layer 0: its hidden state and everything after fail; the JSON has nulls, not NaN."""
    from mnntool.llm.engine.files import open_bundle
    from mnntool.llm.engine.graph import read_plan
    bundle = tmp_path / "nan"
    shutil.copytree(made["root"] / "trained-4", bundle)
    files = open_bundle(bundle)
    op = read_plan(files.graph, files.llm_config).layers[0].o
    off, wlen, alen = op.external[:3]
    data = bytearray(files.weights.read_bytes())
    data[off + wlen:off + wlen + alen] = np.full(alen // 4, np.nan, np.float32).tobytes()
    files.weights.write_bytes(bytes(data))
    rc, out, err = _cli(bundle, made["trained"], "--no-mnn", "--json", "--report", tmp_path / "r.html")

    def no_constants(name):
        raise AssertionError(f"{name} in the JSON")
    r = json.loads(out, parse_constant=no_constants)
    import jsonschema
    jsonschema.validate(r, JSON_SCHEMA)
    assert rc == EXIT_FAIL and r["first_failing"] == "layer 0" and r["layers"][1]["cosine"] is None
    assert "FAIL" in (tmp_path / "r.html").read_text()


def test_thresholds_override(made, tmp_path):
    """--min-cosine above what 4 bits keep fails the layers; a thresholds file loosens one pattern."""
    r = verify(made["root"] / "trained-4", made["trained"], mnn=False, min_cosine=0.9999)
    assert r["exit_code"] == EXIT_FAIL and r["first_failing"] == "layer 0"
    from mnntool.llm.verify import load_thresholds
    f = tmp_path / "t.toml"
    f.write_text('min_cosine = 0.9999\n[logits]\nmin_cosine = 0.99\n[[layers]]\nmatch = "layer *"\nmin_cosine = 0.99\n')
    r = verify(made["root"] / "trained-4", made["trained"], mnn=False, thresholds=load_thresholds(f))
    assert r["exit_code"] == EXIT_PASS, [(m["name"], m["cosine"], m["min_cosine"]) for m in r["layers"]]
    assert r["layers"][0]["min_cosine"] == 0.9999 and r["layers"][1]["min_cosine"] == 0.99
    f.write_text('[logits]\nmin_top1 = 2\n')
    with pytest.raises(MnnToolError, match="min_top1"):
        load_thresholds(f)


def test_bundle_of_another_checkpoint_exits_3(made, tmp_path):
    from fixtures.llm_checkpoints import build_random
    # other sizes: the qwen2 bundle against the smollm checkpoint (hidden 96, 6 heads)
    rc, out, err = _cli(made["root"] / "qwen2-16", build_random("smollm", CACHE / "smollm"), "--json",
                        "--junit", tmp_path / "j.xml")
    assert rc == EXIT_NOT_SAME_MODEL, err[-2000:]
    r = json.loads(out)
    import jsonschema
    jsonschema.validate(r, JSON_SCHEMA)
    assert not r["same_model"]["pass"] and {"what": "hidden size", "checkpoint": 96, "bundle": 64,
                                            "pass": False} in r["same_model"]["checks"]
    case = next(c for c in ET.parse(tmp_path / "j.xml").getroot().iter("testcase") if c.get("name") == "same checkpoint")
    assert case.find("failure").get("type") == "NotSameModel"
    # the same sizes, other weights (seed 1): told apart by the embeddings
    other = build_random("qwen2", CACHE / "qwen2-seed1", seed=1)
    r = verify(made["root"] / "qwen2-16", other, mnn=False)
    assert r["exit_code"] == EXIT_NOT_SAME_MODEL and abs(r["same_model"]["embedding_cosine"]) < 0.2
    assert all(c["pass"] for c in r["same_model"]["checks"]) and r["layers"] == []


def test_prompt_and_text_windows(made, tmp_path):
    from mnntool.llm.engine.tokenizer import Tokenizer
    tok = Tokenizer(made["root"] / "trained-4" / "tokenizer.mtok")
    r = verify(made["root"] / "trained-4", made["trained"], mnn=False, prompt="def main(argv):\n    return 0")
    assert r["inputs"]["kind"] == "prompt" and r["ids"] == tok.encode("def main(argv):\n    return 0")
    text = tmp_path / "t.txt"
    text.write_text((made["trained"] / "heldout.txt").read_text(encoding="utf-8")[:4000], encoding="utf-8")
    r = verify(made["root"] / "trained-4", made["trained"], mnn=False, text=text, offset=10, tokens=48)
    assert r["ids"] == tok.encode(text.read_text(encoding="utf-8"))[10:58] and r["pass"]
    assert r["inputs"] == {"kind": "text", "file": str(text), "offset": 10, "tokens": 48}


def test_transformers_reference_agrees(made):
    pytest.importorskip("transformers")
    a = verify(made["root"] / "trained-4", made["trained"], mnn=False, ref="transformers")
    b = verify(made["root"] / "trained-4", made["trained"], mnn=False)
    for x, y in zip(a["layers"], b["layers"]):
        assert x["cosine"] == pytest.approx(y["cosine"], abs=1e-5), x["name"]
    assert a["logits"][0]["top1"] == b["logits"][0]["top1"]


def test_bad_input_exits_2(made, tmp_path):
    b, ck = made["root"] / "trained-4", made["trained"]
    cases = [((b, tmp_path / "none"), {}, "not a checkpoint folder"),
             ((tmp_path, ck), {}, "config.json"),
             ((b, ck), {"prompt": "x", "text": "y"}, "give one"),
             ((b, ck), {"text": tmp_path / "none.txt"}, "no such file"),
             ((b, ck), {"ref": "onnx"}, "--ref onnx"),
             ((b, ck), {"tokens": 1}, "--tokens 1")]
    for args, kw, needle in cases:
        with pytest.raises(MnnToolError, match=needle):
            verify(*args, mnn=False, **kw)
    # the command: one line, exit 2, and a JUnit document saying why
    rc, out, err = _cli(b, tmp_path / "none", "--no-mnn", "--junit", tmp_path / "j.xml")
    assert rc == 2 and "not a checkpoint folder" in err and "Traceback" not in err, err[-500:]
    assert ET.parse(tmp_path / "j.xml").getroot().get("errors") == "1"
    # a report may not replace an input
    rc, out, err = _cli(b, ck, "--no-mnn", "--report", ck / "config.json")
    assert rc == 2 and "refusing" in err and "Traceback" not in err


def test_engine_hook_is_off_after_verify(made):
    """The per-layer hook is set only during verify's own forward pass; the logits are the same without it."""
    from mnntool.llm.engine.model import Model
    from mnntool.llm.verify import engine_run
    m = Model.load(made["root"] / "qwen2-16", context=64)
    assert m.on_layer is None
    ids = list(range(5, 37))
    hs, logits = engine_run(m, ids)
    assert m.on_layer is None and len(hs) == len(m.layers) + 1
    m.reset()
    assert np.array_equal(m.forward(ids, all_logits=True), logits)
