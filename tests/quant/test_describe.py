"""`mnntool info --quant` reads a file's quantization back: checked on files whose settings are known —
mnntool's own quant outputs (against what was asked and the quant report) and MNN's converter's weight-only
files (`--weightQuantBits 4 --weightQuantBlock 32`, an independent writer)."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from mnntool import api
from mnntool.format import reader
from mnntool.quant import QuantConfig, quantize_file
from mnntool.quant.describe import describe


def _model(path):
    """conv 3x3 3->64, conv 1x1 64->64, conv 3x3 64->16 (the output layer)."""
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for k, (cin, cout, ks) in enumerate([(3, 64, 3), (64, 64, 1), (64, 16, 3)]):
        w = (rng.standard_normal((cout, cin, ks, ks)) * 0.1).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{k}"))
        nodes.append(helper.make_node("Conv", [x, f"w{k}"], [f"c{k}"], pads=[ks // 2] * 4, name=f"conv{k}"))
        nodes.append(helper.make_node("Relu", [f"c{k}"], [f"r{k}"]))
        x = f"r{k}"
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 16, 16, 16])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


@pytest.fixture(scope="module")
def float_mnn(tmp_path_factory):
    d = tmp_path_factory.mktemp("describe")
    api.convert(str(_model(d / "m.onnx")), str(d / "m.mnn"))
    return d


def test_weight_only_blocks(float_mnn, tmp_path):
    r = quantize_file(float_mnn / "m.mnn", tmp_path / "w4.mnn", QuantConfig(weight_bits=4, block_size=32))
    d = describe(reader.load(tmp_path / "w4.mnn"))
    by = {x["name"]: x for x in d["layers"]}
    assert [x["kind"] for x in d["layers"]] == ["weight-only"] * 3 and d["mode"] == "weight-only int4/8"
    assert [x["bits"] for x in d["layers"]] == [4, 4, 8]          # the output layer at --head-bits 8
    blocked = [x for x in d["layers"] if x["block"] == 32]
    assert len(blocked) == r["block_layers"] >= 1 and blocked[0]["scales"]["count"] == 64 * 64 // 32
    assert [x["weights"] for x in d["layers"]] == [3 * 64 * 9, 64 * 64, 64 * 16 * 9]
    assert all(x["symmetric"] for x in by.values())
    assert d["bits_per_weight"] == pytest.approx((4 * (1728 + 4096) + 8 * 9216) / (1728 + 4096 + 9216))


def test_int8_fp16_asymmetric_float(float_mnn, tmp_path):
    calib = tmp_path / "calib"
    calib.mkdir()
    rng = np.random.default_rng(1)
    for k in range(4):
        np.save(calib / f"{k}.npy", rng.standard_normal((1, 3, 16, 16)).astype(np.float32))
    r = quantize_file(float_mnn / "m.mnn", tmp_path / "q8.mnn", QuantConfig(int8=True, calib=str(calib)))
    d = describe(reader.load(tmp_path / "q8.mnn"))
    assert d["mode"] == "int8" and d["kinds"].get("int8") == r["int8_layers"]
    assert d["int8_tensors"] and all(t["scale"] > 0 for t in d["int8_tensors"])
    int8 = [x for x in d["layers"] if x["kind"] == "int8"]
    assert all(x["int8"]["input_scale"] > 0 and x["bits"] == 8 for x in int8)
    quantize_file(float_mnn / "m.mnn", tmp_path / "f16.mnn", QuantConfig(fp16=True))
    assert describe(reader.load(tmp_path / "f16.mnn"))["bits"] == {"16": 3}
    quantize_file(float_mnn / "m.mnn", tmp_path / "a8.mnn", QuantConfig(weight_bits=8, asymmetric=True))
    a8 = describe(reader.load(tmp_path / "a8.mnn"))
    assert all(x["symmetric"] is False and x["block"] == "channel" for x in a8["layers"])
    assert describe(reader.load(float_mnn / "m.mnn"))["mode"] == "float"


def test_mnn_converter_weight_quant(float_mnn, tmp_path):
    """MNN's own converter writes 4-bit blocks of 32: read back as such (4 bits, asymmetric, its default; blocks of 32
    where the 64 input channels split, one scale per channel for the 3-channel layer), and that reading
    reconstructs the ONNX weights to within half a step of each block's scale."""
    pytest.importorskip("MNN")
    from mnntool.format import idst
    from mnntool.mnn_tools import mnnconvert
    mnnconvert("-f", "ONNX", "--modelFile", float_mnn / "m.onnx", "--MNNModel", tmp_path / "mnn4.mnn",
               "--bizCode", "t", "--weightQuantBits", "4", "--weightQuantBlock", "32")
    g = reader.load(tmp_path / "mnn4.mnn")
    d = describe(g)
    assert [(x["kind"], x["bits"], x["symmetric"], x["block"]) for x in d["layers"]] == \
        [("weight-only", 4, False, "channel"), ("weight-only", 4, False, 32), ("weight-only", 4, False, 32)], d["layers"]
    ref = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(float_mnn / "m.onnx")).graph.initializer}
    convs = [n for n in g.nodes if n.op == "Convolution"]
    for k, (n, x) in enumerate(zip(convs, d["layers"])):
        rows = ref[f"w{k}"].shape[0]
        w = ref[f"w{k}"].reshape(rows, -1)
        got = idst.dequantize(n.param["quanParameter"], rows)
        assert np.abs(got - w).max() <= x["scales"]["max"] / 2 * 1.001, n.name


def test_cli_json_and_refusal(float_mnn):
    p = subprocess.run([sys.executable, "-m", "mnntool", "info", str(float_mnn / "m.mnn"), "--quant", "--json"],
                       capture_output=True, text=True)
    assert p.returncode == 0 and json.loads(p.stdout)["mode"] == "float"
    p = subprocess.run([sys.executable, "-m", "mnntool", "info", str(float_mnn / "m.onnx"), "--quant"],
                       capture_output=True, text=True)
    assert p.returncode == 2 and "--quant reads a .mnn" in p.stderr
