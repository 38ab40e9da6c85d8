"""Each pass on small graphs: what it changes, and that outputs stay the same.

Reference for "the same": the graph before the pass run in mnntool's runtime (cosine >= 0.99999,
max abs <= 1e-4 x scale), and onnxruntime / the real MNN runtime for the converted files.
"""
import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP, helper as h, numpy_helper as nh

from mnntool import api
from mnntool.format import reader
from mnntool.frontends.onnx import load_onnx
from mnntool.passes import ALL, run_pipeline
from mnntool.runtime.session import Session
from tests.conftest import assert_close, mnn_run, ort_run

R = np.random.RandomState(3)


def f32(*s):
    return R.randn(*s).astype(np.float32)


def save(path, nodes, inputs, inits, opset=17):
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info(n, TP.FLOAT, s) for n, s in inputs],
                     [h.make_empty_tensor_value_info("y")], initializer=[nh.from_array(v, k) for k, v in inits.items()])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", opset)]), path)
    return {n: R.randn(*s).astype(np.float32) for n, s in inputs}


def check_pass(path, feeds, name):
    """Run one pass on the imported graph; outputs must match the graph before it. Returns the report."""
    before = load_onnx(path, {})
    ref = Session(before).run(feeds)
    g = load_onnx(path, {})
    report = run_pipeline(g, passes=[name])
    got = Session(g).run(feeds)
    for k in ref:
        assert_close(ref[k], got[k], min_cos=0.99999, rel_abs=1e-4)
    return g, report


GELU = ([h.make_node("Div", ["x", "s2"], ["a"]), h.make_node("Erf", ["a"], ["b"]), h.make_node("Add", ["b", "one"], ["c"]),
         h.make_node("Mul", ["x", "c"], ["d"]), h.make_node("Mul", ["d", "half"], ["y"])],
        {"s2": np.array(1.4142135, np.float32), "one": np.array(1.0, np.float32), "half": np.array(0.5, np.float32)})

LAYERNORM = ([h.make_node("ReduceMean", ["x"], ["m"], axes=[-1]), h.make_node("Sub", ["x", "m"], ["d"]),
              h.make_node("Pow", ["d", "two"], ["p"]), h.make_node("ReduceMean", ["p"], ["v"], axes=[-1]),
              h.make_node("Add", ["v", "eps"], ["ve"]), h.make_node("Sqrt", ["ve"], ["s"]),
              h.make_node("Div", ["d", "s"], ["n"]), h.make_node("Mul", ["n", "g"], ["ng"]),
              h.make_node("Add", ["ng", "b"], ["y"])],
             {"two": np.array(2.0, np.float32), "eps": np.array(1e-5, np.float32), "g": f32(16), "b": f32(16)})


def test_fuse_gelu(tmp_path):
    feeds = save(tmp_path / "m.onnx", GELU[0], [("x", [2, 8, 16])], GELU[1])
    g, report = check_pass(tmp_path / "m.onnx", feeds, "fuse_gelu")
    assert [n.op for n in g.nodes] == ["UnaryOp"] and g.nodes[0].param["opType"] == "GELU_STANDARD"
    assert report["fuse_gelu"]["removed"] == {"BinaryOp": 4}   # ERF out, GELU in: UnaryOp count unchanged


GELU_TANH = ([h.make_node("Pow", ["x", "three"], ["p"]), h.make_node("Mul", ["p", "c"], ["pc"]),
              h.make_node("Add", ["x", "pc"], ["s"]), h.make_node("Mul", ["s", "k"], ["sk"]),
              h.make_node("Tanh", ["sk"], ["t"]), h.make_node("Add", ["t", "one"], ["t1"]),
              h.make_node("Mul", ["x", "half"], ["hx"]), h.make_node("Mul", ["hx", "t1"], ["y"])],
             {"three": np.array(3.0, np.float32), "c": np.array(0.044715, np.float32),
              "k": np.array(np.sqrt(2 / np.pi), np.float32), "one": np.array(1.0, np.float32),
              "half": np.array(0.5, np.float32)})


@pytest.mark.parametrize("cube", ["pow", "mul"])
def test_fuse_gelu_tanh(tmp_path, cube):
    """GPT-2's gelu_new as exporters unroll it (x^3 as Pow or as x * x * x) -> one UnaryOp GELU, the same
    outputs as onnxruntime in both runtimes for the converted file, which compute MNN's own rational tanh
    (runtime/kernels/elementwise.gelu_tanh_flat): within 1e-4 of the output's range, and within 2e-6 of
    each other."""
    nodes = list(GELU_TANH[0])
    if cube == "mul":
        nodes[0:1] = [h.make_node("Mul", ["x", "x"], ["xx"]), h.make_node("Mul", ["xx", "x"], ["p"])]
    feeds = save(tmp_path / "m.onnx", nodes, [("x", [2, 8, 64])], GELU_TANH[1])
    feeds["x"] *= 3
    g, report = check_pass(tmp_path / "m.onnx", feeds, "fuse_gelu_tanh")
    assert [(n.op, n.param.get("opType")) for n in g.nodes] == [("UnaryOp", "GELU")]
    api.convert(tmp_path / "m.onnx", tmp_path / "m.mnn")
    ref = ort_run(tmp_path / "m.onnx", feeds)["y"]
    theirs = mnn_run(tmp_path / "m.mnn", ["x"], ["y"], feeds)["y"]
    ours = Session(reader.load(tmp_path / "m.mnn")).run(feeds)["y"]
    assert_close(ref, theirs, min_cos=0.99999, rel_abs=1e-4)
    assert_close(ref, ours, min_cos=0.99999, rel_abs=1e-4)
    assert np.abs(ours - theirs.reshape(ours.shape)).max() <= 2e-6


def test_gelu_tanh_with_another_reader_is_left_alone(tmp_path):
    """The cube also read elsewhere: fusing would drop a tensor another op needs."""
    nodes = list(GELU_TANH[0]) + [h.make_node("Add", ["y", "p"], ["y2"])]
    nodes[-2] = h.make_node("Mul", ["hx", "t1"], ["g"])
    nodes[-1] = h.make_node("Add", ["g", "p"], ["y"])
    feeds = save(tmp_path / "m.onnx", nodes, [("x", [2, 8, 64])], GELU_TANH[1])
    g, _ = check_pass(tmp_path / "m.onnx", feeds, "fuse_gelu_tanh")
    assert not any(n.param.get("opType") == "GELU" for n in g.nodes)


def test_fuse_layer_norm(tmp_path):
    feeds = save(tmp_path / "m.onnx", LAYERNORM[0], [("x", [2, 8, 16])], LAYERNORM[1], opset=13)
    g, _ = check_pass(tmp_path / "m.onnx", feeds, "fuse_layer_norm")
    assert [n.op for n in g.nodes] == ["LayerNorm"]


def test_fused_patterns_run_in_mnn(tmp_path):
    nodes = LAYERNORM[0][:-1] + [h.make_node("Add", ["ng", "b"], ["x2"])] + \
        [h.make_node(n.op_type, ["x2" if i == "x" else (i if i in GELU[1] else "gelu_" + i) for i in n.input],
                     [o if o == "y" else "gelu_" + o for o in n.output], name=f"g{k}") for k, n in enumerate(GELU[0])]
    feeds = save(tmp_path / "m.onnx", nodes, [("x", [1, 8, 16])], {**LAYERNORM[1], **GELU[1]}, opset=13)
    r = api.convert(tmp_path / "m.onnx", tmp_path / "m.mnn")
    assert api.info(tmp_path / "m.mnn")["op_counts"] == {"LayerNorm": 1, "UnaryOp": 1}
    assert set(r["passes_changed"]) >= {"fuse_gelu", "fuse_layer_norm"}
    assert_close(ort_run(tmp_path / "m.onnx", feeds)["y"], mnn_run(tmp_path / "m.mnn", ["x"], ["y"], feeds)["y"])


def test_fold_mul_add_into_conv(tmp_path):
    nodes = [h.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), h.make_node("Mul", ["c", "k"], ["m"]),
             h.make_node("Add", ["m", "k2"], ["a"]), h.make_node("Relu", ["a"], ["y"])]
    feeds = save(tmp_path / "m.onnx", nodes, [("x", [1, 3, 8, 8])],
                 {"w": f32(6, 3, 3, 3), "b": f32(6), "k": f32(1, 6, 1, 1), "k2": f32(6, 1, 1)})
    g, _ = check_pass(tmp_path / "m.onnx", feeds, "fold_affine_into_conv")
    assert [n.op for n in g.nodes] == ["Convolution", "ReLU"]
    g2 = load_onnx(tmp_path / "m.onnx", {})
    run_pipeline(g2, 1)
    assert [n.op for n in g2.nodes] == ["ConvertTensor", "Convolution", "ConvertTensor"]
    assert g2.nodes[1].param["common"]["relu"]


def test_non_channel_constant_is_not_folded(tmp_path):
    nodes = [h.make_node("Conv", ["x", "w"], ["c"]), h.make_node("Mul", ["c", "k"], ["y"])]
    feeds = save(tmp_path / "m.onnx", nodes, [("x", [1, 3, 4, 4])], {"w": f32(2, 3, 1, 1), "k": f32(1, 1, 4, 4)})
    g, report = check_pass(tmp_path / "m.onnx", feeds, "fold_affine_into_conv")
    assert not report and [n.op for n in g.nodes] == ["Convolution", "BinaryOp"]


def test_constant_fold_shape_arithmetic(tmp_path):
    nodes = [h.make_node("Shape", ["x"], ["s"]), h.make_node("Gather", ["s", "i0"], ["n"], axis=0),
             h.make_node("Unsqueeze", ["n", "ax"], ["nu"]), h.make_node("Concat", ["nu", "m1"], ["shape"], axis=0),
             h.make_node("Reshape", ["x", "shape"], ["r"]), h.make_node("Add", ["c1", "c2"], ["c3"]),
             h.make_node("Mul", ["r", "c3"], ["y"])]
    feeds = save(tmp_path / "m.onnx", nodes, [("x", [2, 3, 4])],
                 {"i0": np.array(0, np.int64), "ax": np.array([0], np.int64), "m1": np.array([-1], np.int64),
                  "c1": f32(12), "c2": f32(12)})
    # the ONNX frontend folds shape arithmetic before converting (frontends/onnx/fold.py) ...
    g, _ = check_pass(tmp_path / "m.onnx", feeds, "constant_fold")
    assert [n.op for n in g.nodes] == ["Reshape", "BinaryOp"]
    # ... and the pass does the same on IR from any frontend
    from mnntool.ir.graph import Graph, Node, TensorInfo
    ir = Graph(nodes=[Node("Shape", ["x"], ["s"]), Node("GatherV2", ["s", "i0", "ax0"], ["n"]),
                      Node("Unsqueeze", ["n"], ["nu"], param={"squeezeDims": [0]}),
                      Node("Concat", ["nu", "m1"], ["shape"], param={"axis": 0}),
                      Node("Reshape", ["x", "shape"], ["r"]), Node("BinaryOp", ["c1", "c2"], ["c3"], param={"opType": "ADD"}),
                      Node("BinaryOp", ["r", "c3"], ["y"], param={"opType": "MUL"})],
               inputs=["x"], outputs=["y"], tensors={"x": TensorInfo("x", "float32", (2, 3, 4))},
               constants={"i0": np.array(0, np.int32), "ax0": np.array([0], np.int32), "m1": np.array([-1], np.int32),
                          "c1": f32(12), "c2": f32(12)})
    ref = Session(ir).run(feeds)
    report = run_pipeline(ir, passes=["constant_fold"])
    assert [n.op for n in ir.nodes] == ["Reshape", "BinaryOp"]
    assert report["constant_fold"]["removed"]["Shape"] == 1
    assert_close(ref["y"], Session(ir).run(feeds)["y"], min_cos=0.99999, rel_abs=1e-4)


def test_remove_noops_and_dead_code(tmp_path):
    nodes = [h.make_node("Identity", ["x"], ["a"]), h.make_node("Reshape", ["a", "same"], ["b"]),
             h.make_node("Transpose", ["b"], ["c"], perm=[0, 1, 2]), h.make_node("Relu", ["c"], ["y"]),
             h.make_node("Sigmoid", ["c"], ["unused"])]
    feeds = save(tmp_path / "m.onnx", nodes, [("x", [2, 3, 4])], {"same": np.array([2, 3, 4], np.int64)})
    g, _ = check_pass(tmp_path / "m.onnx", feeds, "remove_noops")
    assert [n.op for n in g.nodes] == ["ReLU", "UnaryOp"]
    g2, _ = check_pass(tmp_path / "m.onnx", feeds, "dead_code")
    assert "UnaryOp" not in [n.op for n in g2.nodes]


@pytest.mark.parametrize("add_inputs", [["m", "b"], ["b", "m"]])     # PyTorch's Linear exports Add(bias, MatMul)
def test_matmul_to_conv_matches_mnn(tmp_path, add_inputs):
    nodes = [h.make_node("MatMul", ["x", "w"], ["m"]), h.make_node("Add", add_inputs, ["y"])]
    feeds = save(tmp_path / "m.onnx", nodes, [("x", [2, 5, 16])], {"w": f32(16, 7), "b": f32(7)})
    g, _ = check_pass(tmp_path / "m.onnx", feeds, "matmul_to_conv")
    assert [n.op for n in g.nodes] == ["Reshape", "Convolution", "Reshape"]
    api.convert(tmp_path / "m.onnx", tmp_path / "m.mnn")
    assert_close(ort_run(tmp_path / "m.onnx", feeds)["y"], mnn_run(tmp_path / "m.mnn", ["x"], ["y"], feeds)["y"])


def test_matmul_to_conv_keeps_an_add_that_is_not_a_row_bias(tmp_path):
    """A (5, 1) constant has the conv's 5 output channels' count but broadcasts down the rows."""
    nodes = [h.make_node("MatMul", ["x", "w"], ["m"]), h.make_node("Add", ["b", "m"], ["y"])]
    feeds = save(tmp_path / "m.onnx", nodes, [("x", [5, 16])], {"w": f32(16, 5), "b": f32(5, 1)})
    g, _ = check_pass(tmp_path / "m.onnx", feeds, "matmul_to_conv")
    assert [n.op for n in g.nodes] == ["Reshape", "Convolution", "Reshape", "BinaryOp"]


def test_O0_keeps_the_graph_as_imported(fixture_model, tmp_path):
    src = fixture_model("resnet18")
    r = api.convert(src, tmp_path / "o0.mnn", optimize=0)
    assert r["passes_changed"] == ["layout"]
    imported = load_onnx(src, {})
    counts = api.info(tmp_path / "o0.mnn")["op_counts"]
    assert sum(counts.values()) - counts.get("ConvertTensor", 0) == len(imported.nodes)


@pytest.mark.parametrize("name", ["mobilenetv2", "resnet18"])
def test_cnn_fixture_is_fused_and_no_larger_than_mnn(fixture_model, tmp_path, name):
    from tests.conftest import mnn_convert
    src = fixture_model(name)
    ours, theirs = tmp_path / "ours.mnn", tmp_path / "theirs.mnn"
    api.convert(src, ours)
    mnn_convert(src, theirs)
    counts = api.info(ours)["op_counts"]
    assert not {"Scale", "BatchNorm", "Dropout", "Identity", "ReLU6"} & set(counts)
    if name == "mobilenetv2":
        assert "ReLU" not in counts
    assert sum(counts.values()) <= api.info(theirs)["ops"]


def test_pass_listing_and_selection(tmp_path):
    from tests.test_cli import run
    import json
    code, out, _ = run("convert", "passes", "--passes", "list", "--json")
    assert code == 0 and set(json.loads(out)["passes"]) == set(ALL)
    nodes = [h.make_node("Identity", ["x"], ["a"]), h.make_node("Relu", ["a"], ["y"])]
    save(tmp_path / "m.onnx", nodes, [("x", [1, 4])], {})
    code, out, _ = run("convert", tmp_path / "m.onnx", tmp_path / "m.mnn", "--passes", "dead_code", "--json")
    assert code == 0 and "Identity" in api.info(tmp_path / "m.mnn")["op_counts"]
    code, _, err = run("convert", tmp_path / "m.onnx", tmp_path / "m.mnn", "--passes", "nope")
    assert code == 2 and "unknown pass" in err


def test_fold_batch_norm_matches_onnxruntime(tmp_path):
    """ONNX BatchNormalization becomes the IR's BatchNorm (as every frontend's does); the pass lowers it to
    Scale, which then folds into the convolution; outputs match onnxruntime and MNN."""
    nodes = [h.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             h.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["y"], epsilon=1e-3)]
    inits = {"w": f32(4, 3, 3, 3), "s": f32(4), "b": f32(4), "m": f32(4), "v": np.abs(f32(4)) + 0.5}
    feeds = save(tmp_path / "m.onnx", nodes, [("x", [1, 3, 8, 8])], inits)
    g = load_onnx(tmp_path / "m.onnx", {})
    assert [n.op for n in g.nodes] == ["Convolution", "BatchNorm"]
    ref = ort_run(tmp_path / "m.onnx", feeds)["y"]
    assert_close(ref, Session(g).run(feeds)["y"], min_cos=0.99999, rel_abs=1e-4)
    report = api.convert(tmp_path / "m.onnx", tmp_path / "m.mnn")
    assert report["passes"]["fold_batch_norm"]["removed"] == {"BatchNorm": 1}
    ops = api.info(tmp_path / "m.mnn")["op_counts"]
    assert "BatchNorm" not in ops and "Scale" not in ops
    assert_close(ref, mnn_run(tmp_path / "m.mnn", ["x"], ["y"], feeds)["y"], min_cos=0.99999, rel_abs=1e-4)
