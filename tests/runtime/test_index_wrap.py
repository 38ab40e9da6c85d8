"""An embedding lookup on run-time indices: the converter writes idx + (0 > idx) * n before MNN's
GatherV2 (MNN reads negative indices as they are); the planner has the GatherV2 read idx itself
(runtime.fusion.fuse_index_wrap), its kernel counting negative indices from the end. The table an
initializer (the converter knows its shape from the constant: ONNX shape inference lists none).
Reference: onnxruntime on the ONNX file, exact (a gather copies values); the file in MNN as well."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h

from mnntool import api
from mnntool.runtime.session import Session

ort = pytest.importorskip("onnxruntime")


def _model(path, axis: int, table_shape):
    nodes = [h.make_node("Gather", ["table", "ids"], ["y"], axis=axis)]
    table = np.random.default_rng(0).standard_normal(table_shape).astype(np.float32)
    g = h.make_graph(nodes, "emb", [h.make_tensor_value_info("ids", TP.INT64, [1, 6])],
                     [h.make_tensor_value_info("y", TP.FLOAT, None)], [onnx.numpy_helper.from_array(table, "table")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))


@pytest.mark.parametrize("axis,table_shape", [(0, (10, 8)), (1, (1, 10, 4))])
def test_negative_index_fix_is_read_through(tmp_path, axis, table_shape):
    _model(tmp_path / "e.onnx", axis, table_shape)
    api.convert(tmp_path / "e.onnx", tmp_path / "e.mnn")
    g = api.load_graph(tmp_path / "e.mnn")
    assert [n.op for n in g.nodes].count("BinaryOp") == 3, "the file keeps MNN's fix"
    ids = np.array([[0, 3, -1, 9, -10, 5]], np.int64)
    ref = ort.InferenceSession(str(tmp_path / "e.onnx")).run(None, {"ids": ids})[0]
    s = Session(g)
    np.testing.assert_array_equal(s.run({"ids": ids})["y"], ref)
    assert [st.op for st in s.plan.steps] == ["GatherV2"]
    np.testing.assert_array_equal(Session(g).run({"ids": ids}, keep_all=True)["y"], ref)
    pytest.importorskip("MNN")
    from mnntool.runners import backend_runner
    np.testing.assert_array_equal(backend_runner(tmp_path / "e.mnn", "mnn", threads=1).run({"ids": ids})["y"], ref)


def test_a_fix_read_elsewhere_stays(tmp_path):
    """The wrapped indices are a graph output too: the three steps stay."""
    _model(tmp_path / "e.onnx", 0, (10, 8))
    api.convert(tmp_path / "e.onnx", tmp_path / "e.mnn")
    g = api.load_graph(tmp_path / "e.mnn")
    gather = next(n for n in g.nodes if n.op == "GatherV2")
    g.outputs.append(gather.inputs[1])
    ids = np.array([[0, -1, 2, -3, 4, 5]], np.int64)
    s = Session(g)
    out = s.run({"ids": ids})
    np.testing.assert_array_equal(out[gather.inputs[1]], np.where(ids < 0, ids + 10, ids))
    assert [st.op for st in s.plan.steps].count("BinaryOp") == 3
