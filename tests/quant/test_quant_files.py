"""Quantized files: MNN's weight codec facts, weight-only/fp16/int8 files that the real MNN runtime loads
and that match mnntool's runtime, and bad calibration input.

Tolerances: MNN vs mnntool on the same quantized file cosine >= 0.9999 (weight-only, fp16) and >= 0.999
(int8, where rounding of activations may differ); quantized vs fp32 as stated per test.
"""
import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP, helper as h, numpy_helper as nh

import mnntool
from mnntool import api
from mnntool.compare import metrics
from mnntool.format import reader
from mnntool.quant import QuantConfig, quantize_file
from mnntool.format.idst import dequantize
from mnntool.quant.weights import quantize_weight
from tests.conftest import mnn_run
from tests.test_cli import assert_one_line_error, run


@pytest.fixture(scope="module")
def resnet_mnn(fixture_model, tmp_path_factory):
    d = tmp_path_factory.mktemp("q")
    dst = d / "r.mnn"
    api.convert(fixture_model("resnet18"), dst)
    calib = d / "calib"
    calib.mkdir()
    for k in range(6):
        np.save(calib / f"{k}.npy", np.random.default_rng(k).standard_normal((1, 3, 224, 224)).astype(np.float32))
    return dst, calib


def _mnn_weight_quant(tmp_path, extra):
    from mnntool.mnn_tools import mnnconvert
    w = np.random.RandomState(0).randn(8, 4, 3, 3).astype(np.float32)
    g = h.make_graph([h.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "g",
                     [h.make_tensor_value_info("x", TP.FLOAT, [1, 4, 6, 6])], [h.make_empty_tensor_value_info("y")],
                     initializer=[nh.from_array(w, "w")])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), tmp_path / "m.onnx")
    mnnconvert("-f", "ONNX", "--modelFile", tmp_path / "m.onnx", "--MNNModel", tmp_path / "m.mnn", "--bizCode", "t",
               *extra)
    return w, reader.load(tmp_path / "m.mnn")


@pytest.mark.parametrize("extra,bits", [(["--weightQuantBits", "8"], 8), (["--weightQuantBits", "4"], 4),
                                        (["--weightQuantBits", "8", "--weightQuantAsymmetric"], 8)])
def test_codec_reads_mnn_made_weights_and_writes_the_same_precision(tmp_path, extra, bits):
    w, g = _mnn_weight_quant(tmp_path, extra)
    qp = g.nodes[[n.op for n in g.nodes].index("Convolution")].param["quanParameter"]
    theirs = dequantize(qp, 8)
    asym = np.asarray(qp["alpha"]).size == 16
    ours = dequantize(quantize_weight(w, bits, asym), 8)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)          # same grid, same rounding
    step = np.abs(w).reshape(8, -1).max(1).max() / (2 ** (bits - 1) - 1)
    assert np.abs(theirs - w.reshape(8, -1)).max() <= step


@pytest.mark.parametrize("args", [{"weight_bits": 8}, {"weight_bits": 4}, {"weight_bits": 4, "asymmetric": True},
                                  {"fp16": True}])
def test_weight_only_files_run_in_mnn(resnet_mnn, tmp_path, args):
    src, _ = resnet_mnn
    dst = tmp_path / "w.mnn"
    r = quantize_file(src, dst, QuantConfig(**args))
    assert r["size_after"] < r["size_before"] / (1.9 if args.get("fp16") else 3.5)
    g = reader.load(dst)
    x = {"input": np.random.default_rng(9).standard_normal((1, 3, 224, 224)).astype(np.float32)}
    theirs = mnn_run(dst, g.inputs, g.outputs, x)["output"]
    ours = mnntool.load(dst).run(x)["output"]
    assert metrics(theirs, ours)["cosine"] >= 0.9999
    fp32 = mnntool.load(src).run(x)["output"]
    # 4 bits per output channel on a ResNet-18 whose every layer carries its input (fixtures/trained_stats.py):
    # 0.982 measured (sym and asym); 8 bits and fp16 >= 0.9995
    assert metrics(fp32, ours)["cosine"] >= (0.97 if args.get("weight_bits") == 4 else 0.9995)


@pytest.mark.parametrize("method", ["mse", "kl", "percentile", "minmax"])
def test_int8_file_runs_in_mnn(resnet_mnn, tmp_path, method):
    src, calib = resnet_mnn
    dst = tmp_path / "q.mnn"
    r = quantize_file(src, dst, QuantConfig(int8=True, calib=calib, method=method))
    assert r["size_after"] < r["size_before"] / 3.5 and r["int8_layers"] >= 20
    g = reader.load(dst)
    assert sum(1 for n in g.nodes if "symmetricQuan" in n.param) == r["int8_layers"]
    assert any(t.quant for t in g.tensors.values())
    x = {"input": np.random.default_rng(11).standard_normal((1, 3, 224, 224)).astype(np.float32)}
    theirs = mnn_run(dst, g.inputs, g.outputs, x)["output"]
    ours = mnntool.load(dst).run(x)["output"]
    fp32 = mnntool.load(src).run(x)["output"]
    assert metrics(theirs, ours)["cosine"] >= 0.9995
    assert metrics(fp32, theirs)["cosine"] >= 0.999     # measured 0.99931 (minmax) to 0.99950 (kl), 6 samples


def test_skip_and_auto_skip(resnet_mnn, tmp_path):
    src, calib = resnet_mnn
    first = reader.load(src).nodes[1].name
    r = quantize_file(src, tmp_path / "s.mnn", QuantConfig(int8=True, calib=calib, skip=[first]))
    assert first not in [l["name"] for l in r["layers"] if l["int8"]]
    r = quantize_file(src, tmp_path / "a.mnn", QuantConfig(int8=True, calib=calib, method="kl", auto_skip=0.9999))
    assert min(o["cosine"] for o in r["outputs"]) >= 0.9999
    assert r["int8_layers"] > 0 or r["auto_skipped"]
    assert not any("--auto-skip" in note for note in r.get("notes", []))


def test_a_low_output_cosine_points_at_auto_skip(resnet_mnn, tmp_path, monkeypatch):
    """Below quant.SUGGEST_BELOW (raised here past every cosine) the report's notes name --auto-skip;
    with --auto-skip given they do not."""
    import mnntool.quant as quant
    src, calib = resnet_mnn
    monkeypatch.setattr(quant, "SUGGEST_BELOW", 1.5)
    r = quantize_file(src, tmp_path / "q.mnn", QuantConfig(int8=True, calib=calib))
    assert [n for n in r["notes"] if "--auto-skip 1.5" in n]
    r = quantize_file(src, tmp_path / "a.mnn", QuantConfig(int8=True, calib=calib, auto_skip=0.99))
    assert not any("--auto-skip" in note for note in r.get("notes", []))


def test_bad_calibration_input(resnet_mnn, tmp_path):
    src, _ = resnet_mnn
    out = tmp_path / "o.mnn"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_one_line_error(*run("quant", src, out, "--int8", "--calib", empty), "no samples in the folder")
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    np.save(wrong / "a.npy", np.zeros((1, 3, 32, 32), np.float32))
    assert_one_line_error(*run("quant", src, out, "--int8", "--calib", wrong), "shape")
    nan = tmp_path / "nan"
    nan.mkdir()
    np.save(nan / "a.npy", np.full((1, 3, 224, 224), np.nan, np.float32))
    assert_one_line_error(*run("quant", src, out, "--int8", "--calib", nan), "NaN")
    assert_one_line_error(*run("quant", src, out, "--int8"), "--calib")
    assert_one_line_error(*run("quant", src, out, "--weight-bits", "3"), "8 and 4")
    assert_one_line_error(*run("quant", src, out, "--int8", "--fp16"), "exactly one")
    assert not out.exists()


def test_cli_json_and_image_calibration(resnet_mnn, tmp_path):
    from PIL import Image
    src, _ = resnet_mnn
    imgs = tmp_path / "imgs"
    imgs.mkdir()
    for k in range(4):
        Image.fromarray(np.random.default_rng(k).integers(0, 255, (240, 260, 3), dtype=np.uint8)).save(imgs / f"{k}.png")
    code, out, err = run("quant", src, tmp_path / "q.mnn", "--int8", "--calib", imgs, "--mean", "127.5",
                         "--std", "64", "--format", "BGR", "--json")
    assert code == 0, err
    r = json.loads(out)
    assert r["mode"] == "int8" and r["calibration_samples"] == 3 and r["held_out_samples"] == 1
    code, out, err = run("verify", tmp_path.parent / "nope.onnx", tmp_path / "q.mnn")
    assert code == 2


def _block_model(tmp_path):
    """A 1x1 convolution over 128 channels and a 3x3 over 64: whole 32-channel blocks in both."""
    r = np.random.default_rng(4)
    w1 = r.standard_normal((16, 128, 1, 1)).astype(np.float32)
    w1[:, :32] *= 20                            # one block of channels much larger: per-channel scales suffer
    w2 = r.standard_normal((8, 16, 3, 3)).astype(np.float32)
    w3 = r.standard_normal((8, 64, 3, 3)).astype(np.float32)
    nodes = [h.make_node("Conv", ["x", "w1"], ["a"]), h.make_node("Conv", ["a", "w2"], ["b"], pads=[1] * 4),
             h.make_node("Conv", ["x2", "w3"], ["c"], pads=[1] * 4)]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, [1, 128, 6, 6]),
                                  h.make_tensor_value_info("x2", TP.FLOAT, [1, 64, 6, 6])],
                     [h.make_empty_tensor_value_info("b"), h.make_empty_tensor_value_info("c")],
                     initializer=[nh.from_array(w1, "w1"), nh.from_array(w2, "w2"), nh.from_array(w3, "w3")])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), tmp_path / "b.onnx")
    x = r.standard_normal((1, 128, 6, 6)).astype(np.float32)
    x[:, :32] = 0            # the output then depends on the small weights, whose per-channel grid is coarse
    feeds = {"x": x, "x2": r.standard_normal((1, 64, 6, 6)).astype(np.float32)}
    return tmp_path / "b.onnx", feeds


def test_mnn_made_block_weights_read_back(tmp_path):
    """MNN's converter with --weightQuantBlock 32: mnntool decodes its per-block scales to the weights
    MNN itself runs (outputs within cosine 0.99999 of MNN on MNN's own file)."""
    from mnntool.mnn_tools import mnnconvert
    src, feeds = _block_model(tmp_path)
    dst = tmp_path / "mnn_block.mnn"
    mnnconvert("-f", "ONNX", "--modelFile", src, "--MNNModel", dst, "--bizCode", "t",
               "--weightQuantBits", "4", "--weightQuantBlock", "32")
    g = reader.load(dst)
    qps = [n.param["quanParameter"] for n in g.nodes if n.param.get("quanParameter")]
    assert any(np.asarray(q["alpha"]).size > 2 * 16 for q in qps)        # really block-wise
    theirs = mnn_run(dst, g.inputs, g.outputs, feeds)
    ours = mnntool.load(dst).run(feeds)
    for name in g.outputs:
        assert metrics(theirs[name], ours[name])["cosine"] >= 0.99999


@pytest.mark.parametrize("asymmetric", [False, True])
def test_block_size_files_run_in_mnn_and_beat_per_channel(tmp_path, asymmetric):
    src, feeds = _block_model(tmp_path)
    fp32 = tmp_path / "f.mnn"
    api.convert(src, fp32)
    ref = mnntool.load(fp32).run(feeds)
    errors = {}
    for block in (None, 32):
        dst = tmp_path / f"w{block}.mnn"
        r = quantize_file(fp32, dst, QuantConfig(weight_bits=4, asymmetric=asymmetric, block_size=block))
        assert r["block_layers"] == (2 if block else 0)        # the 16-channel conv keeps per-channel scales
        g = reader.load(dst)
        theirs, ours = mnn_run(dst, g.inputs, g.outputs, feeds), mnntool.load(dst).run(feeds)
        for name in g.outputs:
            assert metrics(theirs[name], ours[name])["cosine"] >= 0.99999
        errors[block] = float(np.abs(ours["b"] - ref["b"]).mean())
    assert errors[32] < errors[None] / 2


def test_block_size_needs_weight_bits(resnet_mnn, tmp_path):
    src, _ = resnet_mnn
    assert_one_line_error(*run("quant", src, tmp_path / "x.mnn", "--fp16", "--block-size", "32"), "--block-size")
    assert not (tmp_path / "x.mnn").exists()


def _small_convnet(path, rng):
    def conv(name, cin, cout, k, stride=1):
        return nh.from_array((rng.standard_normal((cout, cin, k, k)) / np.sqrt(cin * k * k)).astype(np.float32), name)
    # 3x3 convolutions with stride 2 and 1x1 ones: MNN's EMA quantizer turns stride-1 3x3 ones into its
    # int8 Winograd (winogradAttr), whose rounding in the transformed domain mnntool does not reproduce
    nodes = [h.make_node("Conv", ["x", "w1"], ["c1"], pads=[1] * 4, strides=[2, 2]), h.make_node("Relu", ["c1"], ["r1"]),
             h.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1] * 4, strides=[2, 2]), h.make_node("Relu", ["c2"], ["r2"]),
             h.make_node("Conv", ["r2", "w3"], ["c3"]),
             h.make_node("Conv", ["c3", "w4"], ["c4"]), h.make_node("Relu", ["c4"], ["y"])]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, [1, 3, 32, 32])],
                     [h.make_empty_tensor_value_info("y")],
                     initializer=[conv("w1", 3, 16, 3), conv("w2", 16, 16, 3), conv("w3", 16, 8, 1), conv("w4", 8, 16, 1)])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), path)


@pytest.mark.parametrize("method", ["EMA", "KL"])
def test_mnn_quantizer_files_run_the_same_in_mnntool(tmp_path, method):
    """Files from MNN's own quantizer: EMA writes zero points (-127 after a ReLU), KL symmetric grids."""
    from PIL import Image

    from mnntool.mnn_tools import mnnconvert, mnnquant
    rng = np.random.default_rng(5)
    _small_convnet(tmp_path / "m.onnx", rng)
    mnnconvert("-f", "ONNX", "--modelFile", tmp_path / "m.onnx", "--MNNModel", tmp_path / "m.mnn", "--bizCode", "t")
    imgs = tmp_path / "imgs"
    imgs.mkdir()
    for k in range(4):
        Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(imgs / f"{k}.png")
    cfg = {"format": "RGB", "mean": [127.5] * 3, "normal": [1 / 64] * 3, "width": 32, "height": 32,
           "path": str(imgs) + "/", "used_image_num": 4, "feature_quantize_method": method}
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    mnnquant(tmp_path / "m.mnn", tmp_path / "q.mnn", tmp_path / "cfg.json")
    q = reader.load(tmp_path / "q.mnn")
    zeros = {n.param["symmetricQuan"].get("outputZeroPoint", 0) for n in q.nodes if "symmetricQuan" in n.param}
    assert (-127 in zeros) == (method == "EMA")
    assert not any(len(n.param["symmetricQuan"].get("winogradAttr", [])) for n in q.nodes if "symmetricQuan" in n.param)
    x = {q.inputs[0]: rng.uniform(-2, 2, (1, 3, 32, 32)).astype(np.float32)}
    theirs = mnn_run(tmp_path / "q.mnn", q.inputs, q.outputs, x)
    ours = mnntool.load(tmp_path / "q.mnn").run(x)
    for k in q.outputs:
        assert metrics(theirs[k], ours[k])["cosine"] >= 0.9999


def test_convolutions_before_an_average_pool_write_float(tmp_path):
    """MNN runs an average pool on its input's int8 grid and rounds each mean back to that grid, so the
    convolution feeding a global pool keeps a float output (and the head stays float, as ever): an int8
    layer with a float output (ptq.int8_before_average) where an int8 convolution writes its input."""
    rng = np.random.default_rng(3)
    w = [rng.standard_normal(s).astype(np.float32) / 4 for s in ((16, 3, 3, 3), (32, 16, 1, 1), (10, 32))]
    nodes = [h.make_node("Conv", ["x", "w0"], ["c0"], pads=[1] * 4), h.make_node("Relu", ["c0"], ["r0"]),
             h.make_node("Conv", ["r0", "w1"], ["c1"]), h.make_node("Relu", ["c1"], ["r1"]),
             h.make_node("GlobalAveragePool", ["r1"], ["p"]), h.make_node("Flatten", ["p"], ["f"]),
             h.make_node("Gemm", ["f", "w2"], ["y"], transB=1)]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, [1, 3, 16, 16])],
                     [h.make_empty_tensor_value_info("y")],
                     initializer=[nh.from_array(a, f"w{k}") for k, a in enumerate(w)])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), tmp_path / "m.onnx")
    api.convert(tmp_path / "m.onnx", tmp_path / "m.mnn")
    calib = tmp_path / "calib"
    calib.mkdir()
    for k in range(4):
        np.save(calib / f"{k}.npy", rng.standard_normal((1, 3, 16, 16)).astype(np.float32))
    r = quantize_file(tmp_path / "m.mnn", tmp_path / "q.mnn", QuantConfig(int8=True, calib=calib, samples=4))
    q = reader.load(tmp_path / "q.mnn")
    convs = [n for n in q.nodes if n.op == "Convolution"]
    assert ["symmetricQuan" in n.param for n in convs] == [True, True, False]
    assert convs[1].param["symmetricQuan"]["outputDataType"] == "DT_FLOAT"
    assert not q.tensors[convs[1].outputs[0]].quant           # no grid: the average reads float values
    # the float layers are reported with their reason, and store int8 weights (weight-only) by default
    assert [(f["name"], f["reason"], f["weights"]) for f in r["float_layers"]] == \
        [(n.name, "feeds an output or an average", "int8") for n in convs[2:]]
    assert all(n.param.get("weight") is None and n.param["quanParameter"] is not None for n in convs[2:])
    kept = quantize_file(tmp_path / "m.mnn", tmp_path / "f.mnn",
                         QuantConfig(int8=True, calib=calib, samples=4, float_weights=True))
    assert [f["weights"] for f in kept["float_layers"]] == ["fp32"]
    assert r["size_after"] < kept["size_after"]
    x = {"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)}
    theirs = mnn_run(tmp_path / "q.mnn", q.inputs, q.outputs, x)["y"]
    fp32 = mnntool.load(tmp_path / "m.mnn").run(x)["y"]
    assert metrics(fp32, theirs)["cosine"] >= 0.9999
    assert metrics(theirs, mnntool.load(tmp_path / "q.mnn").run(x)["y"])["cosine"] >= 0.99999
