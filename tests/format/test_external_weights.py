"""External weights (`<model>.mnn.weight`, MNN's --saveExternalData layout): mnntool writes what MNN's
converter writes, both runtimes run both tools' pairs with the single file's outputs, quantized pairs
too, and a missing or short weight file is one line naming the file and the op."""
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP, helper as h, numpy_helper as nh

import mnntool
from mnntool import api
from mnntool.errors import MnnToolError
from mnntool.format import reader, writer
from mnntool.format.flatbuf import decode
from mnntool.mnn_tools import mnnconvert
from mnntool.runtime.session import Session
from tests.conftest import assert_close, mnn_run

X = np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32)


def _onnx(path, deconv: bool):
    """Every op kind MNN moves out: convolutions (one without bias), a deconvolution, MatMuls (become
    1x1 convolutions), LayerNorm, a constant of more than 1024 values; and a small constant that stays."""
    r = np.random.default_rng(0)

    def init(name, shape):
        return nh.from_array((r.standard_normal(shape) * 0.1).astype(np.float32), name)
    c = 8 if deconv else 16
    nodes = [h.make_node("Conv", ["x", "cw", "cb"], ["c1"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["c1"], ["r1"]),
             h.make_node("Conv", ["r1", "cw2"], ["c2"]),
             h.make_node("ConvTranspose", ["c2", "tw", "tb"], ["t1"], strides=[2, 2]) if deconv
             else h.make_node("Relu", ["c2"], ["t1"]),
             h.make_node("MaxPool", ["t1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
             h.make_node("Flatten", ["p1"], ["f1"]), h.make_node("MatMul", ["f1", "fw"], ["m1"]),
             h.make_node("LayerNormalization", ["m1", "g", "b"], ["l1"], axis=-1),
             h.make_node("Add", ["l1", "add"], ["a1"]), h.make_node("MatMul", ["a1", "mw"], ["y"])]
    inits = [init("cw", (16, 3, 3, 3)), init("cb", (16,)), init("cw2", (16, 16, 1, 1)),
             init("fw", (c * 64 * (4 if deconv else 1), 32)), init("g", (32,)), init("b", (32,)), init("add", (40, 32)), init("mw", (32, 48))]
    if deconv:
        inits += [init("tw", (16, 8, 2, 2)), init("tb", (8,))]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, [1, 3, 16, 16])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [40, 48])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The ONNX sources, and the pairs MNN's converter writes from them (float, int4 weight-only, fp16)."""
    d = tmp_path_factory.mktemp("ext")
    out = {"full": _onnx(d / "full.onnx", True), "plain": _onnx(d / "plain.onnx", False), "dir": d}
    for name, src, extra in (("mnn_float", "full", []), ("mnn_int4", "plain", ["--weightQuantBits", "4"]),
                             ("mnn_fp16", "plain", ["--fp16"])):
        out[name] = d / f"{name}.mnn"
        mnnconvert("-f", "ONNX", "--modelFile", out[src], "--MNNModel", out[name], "--bizCode", "test",
                   "--saveExternalData", *extra)
    return out


def _externals(path) -> list:
    net = decode(path.read_bytes(), "Net")
    return [(op["type"], list(op["main"]["external"])) for op in net["oplists"]
            if isinstance(op.get("main"), dict) and "external" in op["main"]]


def _mnn(path):
    return mnn_run(path, ["x"], ["y"], {"x": X})["y"]


def _ours(path):
    return Session(reader.load(path)).run({"x": X})["y"]


def test_our_weight_file_is_mnns_byte_for_byte(models, tmp_path):
    ours = tmp_path / "ours.mnn"
    r = api.convert(models["full"], ours, external_weights=True)
    assert r["weight_file"] == str(ours) + ".weight"
    theirs = models["mnn_float"]
    assert (tmp_path / "ours.mnn.weight").read_bytes() == (theirs.parent / (theirs.name + ".weight")).read_bytes()
    assert _externals(ours) == _externals(theirs)        # Convolution [offset, weight, bias], LayerNorm, Const
    assert {t for t, _ in _externals(ours)} == {"Convolution", "Deconvolution", "LayerNorm", "Const"}


def test_mnn_and_mnntool_run_our_pair_as_the_single_file(models, tmp_path):
    single, pair = tmp_path / "single.mnn", tmp_path / "pair.mnn"
    api.convert(models["full"], single)
    api.convert(models["full"], pair, external_weights=True)
    assert pair.stat().st_size < 8000 < single.stat().st_size
    np.testing.assert_array_equal(_mnn(pair), _mnn(single))
    np.testing.assert_array_equal(_ours(pair), _ours(single))
    info = api.info(pair)
    assert info["weight_file"] == str(pair) + ".weight" and info["size_bytes"] > single.stat().st_size - 1000


@pytest.mark.parametrize("name", ["mnn_float", "mnn_int4", "mnn_fp16"])
def test_we_run_mnns_pairs(models, name):
    g = reader.load(models[name])
    assert g.weight_file
    assert_close(_mnn(models[name]), Session(g).run({"x": X})["y"], min_cos=0.99999, rel_abs=1e-4)


def test_rewriting_mnns_pair_keeps_its_layout(models, tmp_path):
    ours = tmp_path / "rw.mnn"
    writer.save(reader.load(models["mnn_int4"]), ours, external=True)
    theirs = models["mnn_int4"]
    assert (tmp_path / "rw.mnn.weight").read_bytes() == (theirs.parent / (theirs.name + ".weight")).read_bytes()
    np.testing.assert_array_equal(_mnn(ours), _mnn(theirs))


@pytest.mark.parametrize("mode", [{"weight_bits": 4}, {"weight_bits": 8, "asymmetric": True}, {"fp16": True}])
def test_quantized_pairs_run_as_their_single_files(models, tmp_path, mode):
    src = tmp_path / "f.mnn"                       # the source itself a pair: quant reads it mapped
    api.convert(models["plain"], src, external_weights=True)
    single, pair = tmp_path / "q.mnn", tmp_path / "qe.mnn"
    mnntool.quantize(src, single, **mode)
    r = mnntool.quantize(src, pair, external_weights=True, **mode)
    assert r["weight_file"] == str(pair) + ".weight"
    convs = [e for t, e in _externals(pair) if t == "Convolution"]
    assert convs and all(len(e) == 5 for e in convs)     # [offset, buffer, alpha, bias, index]
    np.testing.assert_array_equal(_mnn(pair), _mnn(single))
    np.testing.assert_array_equal(_ours(pair), _ours(single))


def test_constants_inside_control_flow_bodies(tmp_path):
    r = np.random.default_rng(0)
    branch = [h.make_graph([h.make_node("Constant", [], [f"k{i}"], value=nh.from_array(
        r.standard_normal((40, 32)).astype(np.float32), f"c{i}")), h.make_node(op, ["x", f"k{i}"], [f"o{i}"])],
        f"b{i}", [], [h.make_tensor_value_info(f"o{i}", TP.FLOAT, [40, 32])]) for i, op in enumerate(["Add", "Mul"])]
    g = h.make_graph([h.make_node("If", ["c"], ["y"], then_branch=branch[0], else_branch=branch[1])], "g",
                     [h.make_tensor_value_info("x", TP.FLOAT, [40, 32]), h.make_tensor_value_info("c", TP.BOOL, [])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [40, 32])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "if.onnx"))
    api.convert(tmp_path / "if.onnx", tmp_path / "if.mnn", external_weights=True)
    assert (tmp_path / "if.mnn.weight").stat().st_size == 2 * 40 * 32 * 4
    x = r.standard_normal((40, 32)).astype(np.float32)
    for c in (True, False):
        feeds = {"x": x, "c": np.array(c)}
        a = mnn_run(tmp_path / "if.mnn", ["x", "c"], ["y"], feeds)["y"]
        b = Session(reader.load(tmp_path / "if.mnn")).run(feeds)["y"]
        np.testing.assert_array_equal(a, b)


@pytest.fixture
def pair(models, tmp_path):
    p = tmp_path / "m.mnn"
    api.convert(models["full"], p, external_weights=True)
    return p


@pytest.mark.parametrize("damage", ["missing", "truncated", "empty", "directory"])
def test_a_bad_weight_file_is_one_line_naming_file_and_op(pair, damage):
    w = pair.parent / (pair.name + ".weight")
    data = w.read_bytes()
    w.unlink()
    if damage == "truncated":
        w.write_bytes(data[:5000])
    elif damage == "empty":
        w.write_bytes(b"")
    elif damage == "directory":
        w.mkdir()
    with pytest.raises(MnnToolError) as e:
        reader.load(pair)
    msg = str(e.value)
    assert str(w) in msg and "op '" in msg and "\n" not in msg
    if damage == "truncated":
        assert "MatMul" in msg and "5000" in msg


def test_the_cli_reports_a_short_weight_file_with_exit_2(pair):
    w = pair.parent / (pair.name + ".weight")
    w.write_bytes(w.read_bytes()[:100])
    done = subprocess.run([sys.executable, "-m", "mnntool", "run", str(pair)], capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and str(w) in done.stderr


def test_a_failed_write_leaves_neither_file_and_keeps_the_old_ones(models, tmp_path, monkeypatch):
    out = tmp_path / "m.mnn"
    out.write_bytes(b"old model")
    (tmp_path / "m.mnn.weight").write_bytes(b"old weights")

    def fail(*a, **k):
        raise writer.FormatError("the file would pass 2 GB")
    monkeypatch.setattr(writer, "encode_buffer", fail)
    with pytest.raises(MnnToolError, match="2 GB"):
        api.convert(models["full"], out, external_weights=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.mnn", "m.mnn.weight"]
    assert out.read_bytes() == b"old model" and (tmp_path / "m.mnn.weight").read_bytes() == b"old weights"


def test_a_pairs_files_are_sources_never_outputs(pair):
    with pytest.raises(MnnToolError, match="source"):
        mnntool.quantize(pair, pair, weight_bits=8, external_weights=True)
    with pytest.raises(MnnToolError, match="source"):
        mnntool.convert(pair, pair.parent / "m.mnn.weight")


def test_weights_past_2000_mb_go_external_on_their_own(models, tmp_path, monkeypatch):
    monkeypatch.setattr(writer, "EXTERNAL_ABOVE", 100_000)     # the model holds ~280 KB
    r = api.convert(models["full"], tmp_path / "auto.mnn")
    assert r["weight_file"] and (tmp_path / "auto.mnn.weight").exists()
    r = api.convert(models["full"], tmp_path / "one.mnn", external_weights=False)
    assert r["weight_file"] is None and not (tmp_path / "one.mnn.weight").exists()


def test_saving_a_pair_leaves_the_graph_whole(models, tmp_path):
    """Without consume (quant, rewrites) the graph keeps its weights: a single file written after the
    pair is the file written before it."""
    single = tmp_path / "s.mnn"
    api.convert(models["full"], single)
    g = reader.load(single)
    writer.save(g, tmp_path / "before.mnn")
    writer.save(g, tmp_path / "pair.mnn", external=True)
    writer.save(g, tmp_path / "after.mnn")
    assert (tmp_path / "after.mnn").read_bytes() == (tmp_path / "before.mnn").read_bytes()
