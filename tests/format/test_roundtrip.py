"""write -> read preserves the IR; rewriting an MNN-made file keeps it runnable with the same outputs."""
import numpy as np
import pytest

from mnntool import api
from mnntool.format import reader, writer
from tests.conftest import assert_close, mnn_convert, mnn_run


def _same_graph(a, b):
    assert a.inputs == b.inputs and a.outputs == b.outputs
    assert [n.op for n in a.nodes] == [n.op for n in b.nodes]
    assert [(n.inputs, n.outputs) for n in a.nodes] == [(n.inputs, n.outputs) for n in b.nodes]
    assert set(a.constants) == set(b.constants)
    for k in a.constants:
        np.testing.assert_array_equal(a.constants[k], b.constants[k])
    for na, nb in zip(a.nodes, b.nodes):
        _same_value(na.param, nb.param)


def _same_value(va, vb):
    """Every field written must read back equal (the reader adds schema defaults, so vb may hold more)."""
    if isinstance(va, dict):
        for key, v in va.items():
            _same_value(v, vb[key])
    elif isinstance(va, (np.ndarray, list)) and not (isinstance(va, list) and va and isinstance(va[0], dict)):
        np.testing.assert_array_equal(np.asarray(va), np.asarray(vb))
    elif isinstance(va, list):
        assert len(va) == len(vb)
        for x, y in zip(va, vb):
            _same_value(x, y)
    elif isinstance(va, float):
        assert np.float32(va) == np.float32(vb)
    else:
        assert va == vb


@pytest.mark.parametrize("name", ["mobilenetv2", "bert"])
def test_write_read_write_is_stable(tmp_path, fixture_model, name):
    first = tmp_path / "a.mnn"
    api.convert(fixture_model(name), first)
    g1 = reader.load(first)
    second = tmp_path / "b.mnn"
    writer.save(g1, second)
    g2 = reader.load(second)
    _same_graph(g1, g2)
    assert first.read_bytes() == second.read_bytes()


def test_rewriting_an_mnn_made_file_gives_the_same_outputs(tmp_path, fixture_model):
    src = fixture_model("resnet18")
    theirs = tmp_path / "theirs.mnn"
    mnn_convert(src, theirs)
    g = reader.load(theirs)
    ours = tmp_path / "ours.mnn"
    writer.save(g, ours)
    feeds = {"input": np.random.default_rng(3).standard_normal((1, 3, 224, 224)).astype(np.float32)}
    a = mnn_run(theirs, g.inputs, g.outputs, feeds)
    b = mnn_run(ours, g.inputs, g.outputs, feeds)
    assert_close(a["output"], b["output"], min_cos=0.999999, rel_abs=1e-5)


def test_inferred_shapes_are_stored_in_tensor_describes(tmp_path, fixture_model):
    from mnntool.format.flatbuf import decode
    dst = tmp_path / "m.mnn"
    api.convert(fixture_model("mobilenetv2"), dst)
    net = decode(dst.read_bytes(), "Net")
    names = net["tensorName"]
    dims = {names[d["index"]]: list(d["blob"]["dims"]) for d in net["extraTensorDescribe"]}
    assert dims["output"] == [1, 1000]
    assert dims["input"] == [1, 3, 224, 224]
    layouts = {names[d["index"]]: d["blob"]["dataFormat"] for d in net["extraTensorDescribe"]}
    assert "NC4HW4" in layouts.values()


def test_bodies_sharing_a_name_get_distinct_ones():
    """Body names are made unique on writing, also when a numbered name is itself taken (the loop that
    numbers them once never ended on 'b', 'b_2', 'b')."""
    from mnntool.format.writer import _subgraphs
    from mnntool.ir.graph import Graph, Node
    subs = [Graph(name=n) for n in ("b", "b_2", "b", "b")]
    g = Graph()
    g.nodes = [Node("While", [], [f"o{k}"], f"w{k}", {"body_graph": s.name}, graphs={"body_graph": s})
               for k, s in enumerate(subs)]
    names = [d["name"] for d in _subgraphs(g)]
    assert len(set(names)) == 4 and names[:2] == ["b", "b_2"]
    assert [n.param["body_graph"] for n in g.nodes] == names


def test_index_tensors_keep_their_int32_through_a_rewrite(tmp_path):
    """An embedding's negative-index fix computes int32 tensors; the file records their type among its
    tensor facts (extraTensorDescribe) and reading gives it back, so a rewrite is the same bytes."""
    import onnx
    from onnx import TensorProto as TP
    from onnx import helper as h
    table = onnx.numpy_helper.from_array(np.arange(80, dtype=np.float32).reshape(10, 8), "table")
    graph = h.make_graph([h.make_node("Gather", ["table", "ids"], ["y"], axis=0)], "emb",
                         [h.make_tensor_value_info("ids", TP.INT64, [1, 6])], [h.make_tensor_value_info("y", TP.FLOAT, None)],
                         [table])
    m = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "e.onnx"))
    first, second = tmp_path / "a.mnn", tmp_path / "b.mnn"
    api.convert(tmp_path / "e.onnx", first)
    g = reader.load(first)
    fixed = [n.outputs[0] for n in g.nodes if n.op == "BinaryOp"]
    assert len(fixed) == 3 and all(g.tensors[t].dtype == "int32" for t in fixed)
    writer.save(g, second)
    assert first.read_bytes() == second.read_bytes()
