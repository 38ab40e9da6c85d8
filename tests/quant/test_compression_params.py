"""MNN's per-layer compression JSON (MNNConvert --compressionParamsFile) carried both ways: a file MNN's
converter writes steers `quant`, and a file `quant` writes steers MNN's converter, checked on the
weights each side stores and on outputs against onnxruntime.

Tolerances: outputs vs onnxruntime cosine >= 0.999 (a 32-channel conv at int4 blocks of 16, one at int8,
a float FC); the two tools' stored weights dequantize equal within 1e-6 (the same min/max rounding)."""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from onnx import TensorProto as TP, helper as h, numpy_helper as nh

from mnntool import api
from mnntool.format import reader
from mnntool.format.idst import dequantize
from mnntool.mnn_tools import mnnconvert
from mnntool.runtime.mnn_backend import MnnSession
from mnntool.runtime.session import Session
from tests.conftest import ort_run, save_onnx
from tests.test_cli import assert_one_line_error, run

MIN_COS = 0.999


def _cos(a, b):
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """conv 1x1 (32->32) + relu, conv 3x3 + relu, global pool, FC: what MNN's converter makes of it
    (float), and the JSON it writes when its --compressionParamsFile does not exist yet."""
    d = tmp_path_factory.mktemp("cp")
    r = np.random.default_rng(0)
    w1 = nh.from_array((r.standard_normal((32, 32, 1, 1)) * 0.2).astype(np.float32), "w1")
    w2 = nh.from_array((r.standard_normal((32, 32, 3, 3)) * 0.07).astype(np.float32), "w2")
    w3 = nh.from_array((r.standard_normal((32, 10)) * 0.2).astype(np.float32), "w3")
    nodes = [h.make_node("Conv", ["x", "w1"], ["a"]), h.make_node("Relu", ["a"], ["b"]),
             h.make_node("Conv", ["b", "w2"], ["c"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["c"], ["d"]),
             h.make_node("GlobalAveragePool", ["d"], ["e"]), h.make_node("Flatten", ["e"], ["f"]),
             h.make_node("MatMul", ["f", "w3"], ["y"])]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, [1, 32, 8, 8])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [1, 10])], [w1, w2, w3])
    save_onnx(g, d / "m.onnx")
    mnnconvert("-f", "ONNX", "--modelFile", d / "m.onnx", "--MNNModel", d / "f.mnn", "--bizCode", "t",
               "--compressionParamsFile", d / "mnn.json")
    x = r.standard_normal((1, 32, 8, 8)).astype(np.float32)
    return d, {"x": x}, ort_run(d / "m.onnx", {"x": x})["y"]


def _layers(path):
    doc = json.loads(path.read_text())
    return {lay["opName"]: lay["weight"][0] for lay in doc["algo"][0]["quantParams"]["layer"]}


def _stored(path):
    """{conv name: (bits or None for float, dequantized or float weight)}"""
    out = {}
    for n in reader.load(path).nodes:
        if n.op == "Convolution":
            qp, rows = n.param.get("quanParameter"), n.param["common"]["outputCount"]
            out[n.name] = ((qp["aMaxOrBits"], dequantize(qp, rows)) if qp is not None
                           else (None, np.asarray(n.param["weight"]).reshape(rows, -1)))
    return out


def _runs_in_both(path, feeds, ref):
    g = api.load_graph(path)
    ours = Session(g).run(feeds)["y"]
    theirs = MnnSession(str(path), g.inputs, g.outputs).run(feeds)["y"]
    assert _cos(ours, ref) >= MIN_COS and _cos(theirs, ref) >= MIN_COS, (_cos(ours, ref), _cos(theirs, ref))


def test_mnn_written_plan_steers_quant(model, tmp_path):
    d, feeds, ref = model
    layers = _layers(d / "mnn.json")        # MNN lists every convolution, bits 0 (float) without --weightQuantBits
    assert len(layers) == 3 and {w["bits"] for w in layers.values()} == {0}
    doc = json.loads((d / "mnn.json").read_text())
    first, second, fc = doc["algo"][0]["quantParams"]["layer"]
    first["weight"][0].update(bits=4, blockSize=16)     # the edit a user makes
    second["weight"][0].update(bits=8, asymmetric=False)
    (tmp_path / "plan.json").write_text(json.dumps(doc))
    code, out, err = run("quant", d / "f.mnn", tmp_path / "q.mnn", "--compression-params", tmp_path / "plan.json",
                         "--json")
    assert code == 0, err
    rep = json.loads(out)
    assert rep["mode"] == "weight-only per layer"
    assert rep["layer_bits"] == {first["opName"]: 4, second["opName"]: 8, fc["opName"]: 0}
    stored = _stored(tmp_path / "q.mnn")
    assert stored[first["opName"]][0] == 4 and stored[second["opName"]][0] == 8 and stored[fc["opName"]][0] is None
    qp = next(n for n in reader.load(tmp_path / "q.mnn").nodes if n.name == first["opName"]).param["quanParameter"]
    assert len(qp["alpha"]) == 32 * 2 * 2          # 2 blocks of 16 input channels, (min, scale) pairs
    _runs_in_both(tmp_path / "q.mnn", feeds, ref)


def test_quant_written_plan_accepted_by_mnn_converter(model, tmp_path):
    d, feeds, ref = model
    names = list(_layers(d / "mnn.json"))
    code, out, err = run("quant", d / "f.mnn", tmp_path / "q.mnn", "--weight-bits", 4, "--block-size", 16,
                         "--asymmetric", "--skip", names[1], "--write-compression-params", tmp_path / "plan.json")
    assert code == 0, err
    written = _layers(tmp_path / "plan.json")
    assert {n: w["bits"] for n, w in written.items()} == {names[0]: 4, names[1]: 0, names[2]: 8}   # head at 8
    digest = hashlib.sha256((tmp_path / "plan.json").read_bytes()).hexdigest()
    mnnconvert("-f", "ONNX", "--modelFile", d / "m.onnx", "--MNNModel", tmp_path / "back.mnn", "--bizCode", "t",
               "--compressionParamsFile", tmp_path / "plan.json")
    assert hashlib.sha256((tmp_path / "plan.json").read_bytes()).hexdigest() == digest    # read, not rewritten
    ours, theirs = _stored(tmp_path / "q.mnn"), _stored(tmp_path / "back.mnn")
    assert set(ours) == set(theirs)
    for name in ours:      # MNN's converter followed the plan layer by layer, to the same weights
        assert ours[name][0] == theirs[name][0], name
        np.testing.assert_allclose(ours[name][1], theirs[name][1], atol=1e-6, err_msg=name)
    g = api.load_graph(tmp_path / "back.mnn")
    got = MnnSession(str(tmp_path / "back.mnn"), g.inputs, g.outputs).run(feeds)["y"]
    assert _cos(got, ref) >= MIN_COS
    _runs_in_both(tmp_path / "q.mnn", feeds, ref)


def test_bad_plans_one_line_errors(model, tmp_path):
    d, _, _ = model
    q = tmp_path / "q.mnn"
    code, out, err = run("quant", d / "f.mnn", q, "--compression-params", d / "mnn.json", "--fp16")
    assert_one_line_error(code, out, err, "--compression-params", "--fp16")
    code, out, err = run("quant", d / "f.mnn", q, "--compression-params", d / "m.onnx")
    assert_one_line_error(code, out, err, "m.onnx", "not a JSON compression-parameter file")
    doc = json.loads((d / "mnn.json").read_text())
    doc["algo"][0]["quantParams"]["layer"][0]["opName"] = "nosuch"
    (tmp_path / "p.json").write_text(json.dumps(doc))
    code, out, err = run("quant", d / "f.mnn", q, "--compression-params", tmp_path / "p.json")
    assert_one_line_error(code, out, err, "--compression-params", "nosuch")
    doc = json.loads((d / "mnn.json").read_text())
    del doc["forGuide"]
    doc["algo"][0]["quantParams"]["layer"][0]["input"] = [{"name": "x", "scales": [0.1]}]
    (tmp_path / "p.json").write_text(json.dumps(doc))
    code, out, err = run("quant", d / "f.mnn", q, "--compression-params", tmp_path / "p.json")
    assert_one_line_error(code, out, err, "activation scales")
    doc = json.loads((d / "mnn.json").read_text())
    doc["algo"][0]["quantParams"]["layer"][0]["weight"][0]["bits"] = 3
    (tmp_path / "p.json").write_text(json.dumps(doc))
    code, out, err = run("quant", d / "f.mnn", q, "--compression-params", tmp_path / "p.json")
    assert_one_line_error(code, out, err, "3-bit")
    code, out, err = run("quant", d / "f.mnn", q, "--weight-bits", 8, "--write-compression-params", d / "f.mnn")
    assert_one_line_error(code, out, err, "refusing to overwrite")
    assert not q.exists()
