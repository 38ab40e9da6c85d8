"""`mnntool debug reduce`: a 20-node model with one failing node reduces to a model of that node (a few at
most) that still fails and is a valid ONNX model onnxruntime runs. The failures: a wrong-on-purpose
conversion injected through a test hook (monkeypatch: Sin converted as Cos), an op the converter is made
to refuse, and, through the real CLI, a --check command (mnntool's own convert) on an op it does not
convert."""
from __future__ import annotations

import json
import shlex
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from mnntool.errors import MnnToolError
from mnntool.reduce import reduce

MNNTOOL = [sys.executable, "-m", "mnntool"]


def _chain(path, odd: str = "Sin"):
    """x[2,8] -> 19 nodes (22 with Det): MatMul/Add/Relu blocks, a residual Add, and `odd` halfway (its input a
    MatMul's output, so cutting in front of it needs a fed input)."""
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for k in range(6):
        w = numpy_helper.from_array((rng.standard_normal((8, 8)) * 0.4).astype(np.float32), f"w{k}")
        b = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32) * 0.1, f"b{k}")
        inits += [w, b]
        nodes += [helper.make_node("MatMul", [x, f"w{k}"], [f"m{k}"], name=f"mm{k}"),
                  helper.make_node("Add", [f"m{k}", f"b{k}"], [f"a{k}"], name=f"add{k}")]
        if k == 3:
            if odd == "Det":       # (2, 8) as four 2x2 matrices; their determinants' sum added back
                inits.append(numpy_helper.from_array(np.array([4, 2, 2], np.int64), "shape"))
                nodes += [helper.make_node("Reshape", [f"a{k}", "shape"], ["rs"], name="reshape"),
                          helper.make_node("Det", ["rs"], ["det"], name="odd"),
                          helper.make_node("ReduceSum", ["det"], ["dsum"], name="dsum"),
                          helper.make_node("Add", [f"a{k}", "dsum"], [f"r{k}"], name="odd_join")]
            else:
                nodes.append(helper.make_node(odd, [f"a{k}"], [f"r{k}"], name="odd"))
        else:
            nodes.append(helper.make_node("Relu", [f"a{k}"], [f"r{k}"], name=f"relu{k}"))
        if k == 4:
            nodes.append(helper.make_node("Add", [f"r{k}", "r1"], [f"s{k}"], name="residual"))
            x = f"s{k}"
        else:
            x = f"r{k}"
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, [2, 8])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, str(path))
    return path


def _ort(path, feeds):
    import onnxruntime as ort
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds)))


def _ours(path, tmp_path, feeds):
    from mnntool import api
    from mnntool.runners import backend_runner
    api.convert(str(path), str(tmp_path / "check.mnn"))
    return backend_runner(tmp_path / "check.mnn", "numba", 1).run(feeds)


@pytest.mark.parametrize("backend", ["numba", "mnn"])
def test_mismatch_reduces_to_the_wrong_op(tmp_path, monkeypatch, backend):
    """Sin converted as Cos (the injected fault): 19 nodes -> the Sin alone (judged in mnntool's runtime or
    MNN's), whose saved inputs reproduce the mismatch in mnntool's runtime and agree in onnxruntime;
    without the fault the repro matches."""
    if backend == "mnn":
        pytest.importorskip("MNN")
    from mnntool.frontends.onnx import math as onnx_math
    src = _chain(tmp_path / "chain.onnx")
    monkeypatch.setitem(onnx_math.UNARY, "Sin", "COS")
    r = reduce(src, tmp_path / "repro.onnx", "mismatch", backend=backend, save_inputs=True)
    assert r["nodes_before"] == 19 and r["nodes_after"] <= 3, r
    assert "Sin" in r["op_types"] and r["outputs"] == ["r3"], r
    repro = onnx.load(str(tmp_path / "repro.onnx"))
    onnx.checker.check_model(repro)
    feeds = dict(np.load(tmp_path / "repro.inputs.npz"))
    ref = _ort(tmp_path / "repro.onnx", feeds)["r3"]
    from mnntool.compare import metrics
    assert metrics(ref, _ours(tmp_path / "repro.onnx", tmp_path, feeds)["r3"])["cosine"] < 0.999
    monkeypatch.setitem(onnx_math.UNARY, "Sin", "SIN")
    assert metrics(ref, _ours(tmp_path / "repro.onnx", tmp_path, feeds)["r3"])["cosine"] > 0.99999


def test_refused_op_reduces_to_it(tmp_path, monkeypatch):
    """An op the converter refuses (removed from its table for the test): the repro is that node."""
    from mnntool.frontends.onnx.registry import CONVERTERS
    src = _chain(tmp_path / "chain.onnx", odd="Sin")
    monkeypatch.delitem(CONVERTERS, "Sin")
    r = reduce(src, tmp_path / "repro.onnx", "convert")
    assert r["nodes_after"] == 1 and r["op_types"] == {"Sin": 1}, r
    with pytest.raises(MnnToolError, match="unsupported ONNX ops: Sin"):
        from mnntool import api
        api.convert(str(tmp_path / "repro.onnx"), str(tmp_path / "x.mnn"))


def test_cli_check_command(tmp_path):
    """The real CLI with --check running mnntool's converter on each candidate: a Det (not converted)
    inside the chain reduces to the Det alone; --json gives the report."""
    from mnntool.frontends.onnx import supported_ops
    if "Det" in supported_ops():
        pytest.skip("Det converts now: pick another op mnntool refuses")
    src = _chain(tmp_path / "chain.onnx", odd="Det")
    check = " ".join(map(shlex.quote, MNNTOOL)) + " convert {} {}.mnn"
    p = subprocess.run(MNNTOOL + ["debug", "reduce", str(src), str(tmp_path / "repro.onnx"), "--check", check,
                                  "--json"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["op_types"] == {"Det": 1} and r["nodes_before"] == 22, r
    m = onnx.load(str(tmp_path / "repro.onnx"))
    assert [n.op_type for n in m.graph.node] == ["Det"] and [i.name for i in m.graph.input] == ["rs"]
    again = subprocess.run(MNNTOOL + ["convert", str(tmp_path / "repro.onnx"), str(tmp_path / "r.mnn")],
                           capture_output=True, text=True)
    assert again.returncode == 2 and "Det" in again.stderr
    text = subprocess.run(MNNTOOL + ["debug", "reduce", str(src), str(tmp_path / "repro2.onnx"), "--fails",
                                     "convert"], capture_output=True, text=True, timeout=300)
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith("reduced ") and "to 1 node(s) [Det]" in text.stdout, text.stdout


def test_a_model_that_does_not_fail(tmp_path):
    """Nothing to reduce: one line, exit 2, no file."""
    src = _chain(tmp_path / "chain.onnx")
    p = subprocess.run(MNNTOOL + ["debug", "reduce", str(src), str(tmp_path / "r.onnx")], capture_output=True,
                       text=True, timeout=300)
    # (a fresh install's first kernel compile announces itself once on stderr: not the command's output)
    lines = [ln for ln in p.stderr.strip().splitlines()
             if ln.strip() and not ln.startswith("mnntool: first run of this install")]
    assert p.returncode == 2 and "does not fail" in p.stderr and len(lines) == 1, p.stderr
    assert not (tmp_path / "r.onnx").exists()


def test_mobilenetv2_wrong_add(tmp_path, monkeypatch, fixture_model):
    """A real model: MobileNetV2 (170 nodes) with Add converted as Sub reduces to one residual Add, fed
    from the source's own tensors."""
    from mnntool.frontends.onnx import math as onnx_math
    src = fixture_model("mobilenetv2")
    monkeypatch.setitem(onnx_math.BINARY, "Add", "SUB")
    r = reduce(src, tmp_path / "repro.onnx", "mismatch")
    assert r["nodes_before"] == len(onnx.load(str(src)).graph.node) and r["nodes_after"] == 1, r
    assert r["op_types"] == {"Add": 1} and len(r["inputs"]) == 2, r


def test_cli_input_files_feed_the_cut(tmp_path):
    """--input x=FILE runs the source on that data: the repro's saved inputs are the source's own tensor
    for it (onnxruntime on the whole model, the tensor exposed)."""
    from mnntool.frontends.onnx import supported_ops
    if "Det" in supported_ops():
        pytest.skip("Det converts now: pick another op mnntool refuses")
    src = _chain(tmp_path / "chain.onnx", odd="Det")
    x = np.random.default_rng(7).standard_normal((2, 8)).astype(np.float32) * 3
    np.save(tmp_path / "x.npy", x)
    p = subprocess.run(MNNTOOL + ["debug", "reduce", str(src), str(tmp_path / "r.onnx"), "--fails", "convert",
                                  "--input", f"x={tmp_path / 'x.npy'}", "--save-inputs", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["fed"]["given"] == ["x"] and r["fed"]["random"] == [] and r["inputs"] == ["rs"]
    m = onnx.load(str(src))
    m.graph.output.append(onnx.ValueInfoProto(name="rs"))
    import onnxruntime as ort
    rs = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(["rs"], {"x": x})[0]
    np.testing.assert_array_equal(np.load(tmp_path / "r.inputs.npz")["rs"], rs)
