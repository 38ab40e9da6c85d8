"""verify in CI: layer failures fail the run (unless --outputs-only), exit 3 for unrelated models,
JUnit XML and GitHub annotations parsed back, seeded / saved / loaded inputs, golden outputs, full
tensor names in piped output, the inputs named in every report.

The fixtures are two tiny ONNX models built here (a second or two per CLI call). Model A computes
y = conv2(x) + 1e-4 * sigmoid(conv1(x)): negating conv1's weights in the .mnn breaks three inner
layers while the output still matches to cosine 1.0 (the case where checking outputs alone passes).
"""
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from mnntool import api
from mnntool.format import reader, writer
from tests.test_cli import assert_one_line_error

INNER = "/encoder/block.0/branch_inner/conv/Conv_output_0_with_a_name_longer_than_any_terminal_column_xyz"


def _cli(*args, env=None):
    p = subprocess.run([sys.executable, "-m", "mnntool", *map(str, args)], capture_output=True, text=True,
                       env={**os.environ, **(env or {})})
    return p.returncode, p.stdout, p.stderr


def _model(path, inner_op="Sigmoid", names=(INNER, "inner_act", "small", "main")):
    import onnx
    from onnx import TensorProto as TP
    from onnx import helper as h
    from onnx import numpy_helper as nh
    rng = np.random.RandomState(0 if inner_op == "Sigmoid" else 1)
    inner, act, small, main = names
    inits = [nh.from_array(rng.randn(4, 3, 3, 3).astype(np.float32), "w1"),
             nh.from_array(rng.randn(4, 3, 3, 3).astype(np.float32), "w2"),
             nh.from_array(np.array(1e-4, np.float32), "eps")]
    nodes = [h.make_node("Conv", ["x", "w1"], [inner], pads=[1, 1, 1, 1]),
             h.make_node(inner_op, [inner], [act]),
             h.make_node("Mul", [act, "eps"], [small]),
             h.make_node("Conv", ["x", "w2"], [main], pads=[1, 1, 1, 1]),
             h.make_node("Add", [main, small], ["y"])]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, [1, 3, 8, 8])],
                     [h.make_tensor_value_info("y", TP.FLOAT, None)], initializer=inits)
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), path)
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("verify_ci")
    src = _model(d / "a.onnx")
    good = d / "a.mnn"
    api.convert(src, good)
    g = reader.load(good)
    victim = next(n for n in g.nodes if n.op == "Convolution" and n.outputs == [INNER])
    victim.param["weight"] = -np.asarray(victim.param["weight"])
    bad = d / "bad.mnn"
    writer.save(g, bad)
    other = _model(d / "b.onnx", "Tanh", ("t1", "t2", "t3", "t4"))      # same inputs and outputs, other layers
    other_mnn = d / "b.mnn"
    api.convert(other, other_mnn)
    return {"src": src, "good": good, "bad": bad, "other": other, "other_mnn": other_mnn, "dir": d}


def test_layer_failure_fails_the_run_unless_outputs_only(models, tmp_path):
    code, out, err = _cli("verify", models["src"], models["bad"], "--json", "--report", tmp_path / "r.html")
    assert code == 1, err
    r = json.loads(out)
    assert r["outputs_pass"] and r["outputs"][0]["cosine"] > 0.9999       # the output alone would pass
    assert not r["pass"] and not r["layers_pass"] and r["exit_code"] == 1
    assert r["first_failing"] == INNER and r["failing_layers"] == 3
    assert [m["name"] for m in r["layers"] if not m["pass"]] == [INNER, "inner_act", "small"]
    assert r["schema"].startswith("mnntool.verify/") and r["mnntool_version"]
    assert r["inputs"] == {"kind": "random", "distribution": r["inputs"]["distribution"], "seed": 0}
    assert r["match"]["same_model"]
    page = (tmp_path / "r.html").read_text()
    assert 'class="v fail">FAIL<' in page and "seed 0" in page and "mnntool " + r["mnntool_version"] in page
    code, out, err = _cli("verify", models["src"], models["bad"], "--outputs-only")
    assert code == 0, err
    assert "layer(s) below the threshold ignored" in out and "random inputs" in out
    code, out, _ = _cli("verify", models["src"], models["good"])
    assert code == 0 and "PASS" in out


def _check_junit(path):
    """The structure the JUnit schema (the Jenkins/Ant junit.xsd) requires: testsuites > testsuite with
    name, tests, failures, errors (and skipped, time); testcase with name and classname; failure/error
    with message and type; counts that agree with the cases."""
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites"
    suites = root.findall("testsuite")
    assert len(suites) == 1
    suite = suites[0]
    for key in ("name", "tests", "failures", "errors", "skipped", "time", "timestamp", "hostname"):
        assert key in suite.attrib, key
    cases = suite.findall("testcase")
    assert int(suite.get("tests")) == len(cases) == int(root.get("tests"))
    assert {c.tag for c in suite} <= {"properties", "testcase", "system-out", "system-err"}
    for c in cases:
        assert c.get("name") and c.get("classname") and float(c.get("time")) >= 0
        kids = [k.tag for k in c]
        assert len([k for k in kids if k in ("failure", "error", "skipped")]) <= 1
        assert set(kids) <= {"failure", "error", "skipped", "system-out", "system-err"}
        for f in c.findall("failure") + c.findall("error"):
            assert f.get("message") and f.get("type")
    assert int(suite.get("failures")) == sum(len(c.findall("failure")) for c in cases)
    assert int(suite.get("errors")) == sum(len(c.findall("error")) for c in cases)
    assert int(suite.get("skipped")) == sum(len(c.findall("skipped")) for c in cases)
    props = {p.get("name"): p.get("value") for p in suite.find("properties")}
    return suite, cases, props


def test_junit_and_github_outputs(models, tmp_path):
    junit, summary = tmp_path / "v.xml", tmp_path / "summary.md"
    code, out, err = _cli("verify", models["src"], models["bad"], "--junit", junit, "--format", "github",
                          env={"GITHUB_STEP_SUMMARY": str(summary)})
    assert code == 1, err
    suite, cases, props = _check_junit(junit)
    assert int(suite.get("failures")) == 3 and len(cases) == 1 + 3 + 1       # output, 3 layers, same model
    failed = {c.get("name"): c.find("failure") for c in cases if c.find("failure") is not None}
    first = failed[f"layer 0 {INNER}"]
    assert "cosine -1.000000" in first.get("message") and "threshold cosine >= 0.999" in first.get("message")
    assert cases[0].get("name") == "output y" and cases[0].find("failure") is None
    assert props["mnntool_version"] and "seed 0" in props["inputs"] and props["exit_code"] == "1"
    errors = [line for line in out.splitlines() if line.startswith("::error ")]
    assert len(errors) == 3
    for line in errors:
        head, _, message = line[len("::error "):].partition("::")
        props = dict(p.split("=", 1) for p in head.split(","))
        assert props["file"] == str(models["bad"]) and props["title"].startswith("mnntool verify%3A layer ")
        assert "cosine" in message and "\n" not in message
    md = summary.read_text()
    assert "FAIL: 3 of 5 compared layer(s)" in md and "| output |" in md and "| y | 1.000000" in md
    assert "seed 0" in md
    # --outputs-only: the layers are skipped test cases and ::warning lines; the run passes
    code, out, err = _cli("verify", models["src"], models["bad"], "--junit", junit, "--output-format", "github",
                          "--outputs-only")
    assert code == 0, err
    suite, cases, _ = _check_junit(junit)
    assert suite.get("failures") == "0" and suite.get("skipped") == "3"
    assert sum(line.startswith("::warning ") for line in out.splitlines()) == 3 and "::error" not in out


def test_seed_save_and_load_inputs_and_golden_outputs(models, tmp_path):
    from tests.conftest import ort_run
    src, good = models["src"], models["good"]
    runs = {}
    for tag, seed in (("a", 5), ("b", 5), ("c", 6)):
        code, out, err = _cli("verify", src, good, "--seed", seed, "--json", "--save-inputs", tmp_path / tag,
                              *(["--save-outputs", tmp_path / "gold"] if tag == "a" else []))
        assert code == 0, err
        runs[tag] = json.loads(out)
        assert runs[tag]["inputs"]["seed"] == seed
    x = {t: np.load(tmp_path / t / "0000.npz")["x"] for t in "abc"}
    assert np.array_equal(x["a"], x["b"]) and not np.array_equal(x["a"], x["c"])
    assert runs["a"]["outputs"] == runs["b"]["outputs"] and runs["a"]["outputs"] != runs["c"]["outputs"]
    gold = np.load(tmp_path / "gold" / "0000" / "y.npy")      # onnxruntime's (verify runs it unoptimized)
    np.testing.assert_allclose(gold, ort_run(src, {"x": x["a"]})["y"], rtol=1e-5, atol=1e-5)
    code, out, err = _cli("verify", src, good, "--load-inputs", tmp_path / "a", "--json")
    assert code == 0, err
    r = json.loads(out)
    assert r["inputs"]["kind"] == "files" and r["inputs"]["files"] == ["0000.npz"]
    assert r["outputs"] == runs["a"]["outputs"]
    assert_one_line_error(*_cli("verify", src, good, "--load-inputs", tmp_path / "a", "--calib", tmp_path / "a"),
                          "--load-inputs")


def test_full_tensor_names_when_piped(models):
    code, out, _ = _cli("verify", models["src"], models["bad"])      # stdout is a pipe here
    assert code == 1
    assert INNER in out and "…" not in out
    row = next(line for line in out.splitlines() if line.startswith(INNER))
    assert "first failing" in row and "-1.000000" in row


def test_unrelated_models_exit_3(models, tmp_path):
    from mnntool.verifier import verify
    r = verify(models["other"], models["bad"])
    assert r["exit_code"] == 3 and not r["pass"] and not r["match"]["same_model"]
    junit = tmp_path / "v.xml"
    code, out, err = _cli("verify", models["other"], models["good"], "--junit", junit, "--format", "github")
    assert code == 3, err
    assert "NOT THE SAME MODEL" in out and out.count("::error ") >= 2
    suite, cases, _ = _check_junit(junit)
    same = next(c for c in cases if c.get("name") == "same model")
    assert same.find("failure").get("type") == "NotSameModel"
    # an output of the .mnn that the source does not have: one line, exit 3
    import onnx
    m = onnx.load(models["other"])
    m.graph.output[0].name = "z"
    m.graph.node[-1].output[0] = "z"
    renamed = tmp_path / "z.onnx"
    onnx.save(m, renamed)
    code, out, err = _cli("verify", renamed, models["good"], "--junit", junit)
    assert code == 3 and "not the same model" in err and "Traceback" not in err
    assert ET.parse(junit).getroot().find("testsuite").get("errors") == "1"


def test_ci_docs_workflow_and_hook_use_real_options():
    """docs/ci/: the workflow and the pre-commit hook parse as YAML and call verify with options it has."""
    import re
    from pathlib import Path

    import typer.main
    import yaml

    from mnntool.cli import app
    root = Path(__file__).resolve().parents[1] / "docs" / "ci"
    verify_cmd = typer.main.get_command(app).commands["verify"]
    known = {o for p in verify_cmd.params for o in getattr(p, "opts", [])}
    wf = yaml.safe_load((root / "github-workflow.yml").read_text())
    steps = wf["jobs"]["verify"]["steps"]
    run = next(s["run"] for s in steps if "mnntool verify" in s.get("run", ""))
    hook = yaml.safe_load((root / "pre-commit-hook.yaml").read_text())["repos"][0]["hooks"][0]
    args = [o for o in wf["jobs"]["verify"]["strategy"]["matrix"]["include"] for o in o["args"].split()]
    for text in (run, hook["entry"], " ".join(args)):
        for opt in re.findall(r"(?<![\w-])--[a-z][a-z-]*", text):
            assert opt in known, opt
    assert "--junit" in run and "--format github" in run and hook["entry"].startswith("mnntool verify ")


def test_thresholds_per_output_and_per_layer_from_a_file(models, tmp_path):
    from mnntool.errors import MnnToolError
    from mnntool.verifier import load_thresholds
    cfg = tmp_path / "limits.toml"
    cfg.write_text('min_cosine = 0.999\n[outputs.y]\nmin_cosine = 0.99999\n\n'
                   '[[layers]]\nmatch = "/encoder/*"\nmin_cosine = 0.0\n\n'
                   '[[layers]]\nmatch = "*"\nmin_cosine = 0.1\n')
    code, out, err = _cli("verify", models["src"], models["bad"], "--thresholds", cfg, "--json")
    assert code == 1, err             # inner (cosine -1) misses even 0.0; the others meet their relaxed limits
    r = json.loads(out)
    assert [m["name"] for m in r["layers"] if not m["pass"]] == [INNER] and r["outputs_pass"]
    by = {m["name"]: m for m in r["layers"]}
    assert by["inner_act"]["limits"]["min_cosine"] == 0.1 and by["inner_act"]["pass"]
    assert by["y"]["limits"]["min_cosine"] == 0.99999 and r["outputs"][0]["limits"]["min_cosine"] == 0.99999
    bad = tmp_path / "bad.json"
    for text, needle in (('{"outputs": {"nope": {"min_cosine": 0.9}}}', "nope is not an output"),
                         ('{"layers": [{"min_cosine": 0.9}]}', "needs a 'match'"),
                         ('{"min_cosine": 2}', "must be in [0, 1]"), ("{", "not valid JSON")):
        bad.write_text(text)
        try:
            limits = load_thresholds(bad)
            from mnntool.verifier import _finish
            _finish({"output_names": ["y"], "model": "m", "layers": [], "outputs": [], "max_abs": None,
                     "match": {"same_model": True}}, 0.999, False, {}, limits)
        except MnnToolError as e:
            assert needle in str(e), (needle, e)
        else:
            raise AssertionError(needle)
