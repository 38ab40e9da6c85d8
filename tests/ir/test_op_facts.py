"""The facts an op's definition carries (kind, moves, layout, growth, int8) and its parameters read with
the schema's defaults: what the passes, the quantizer and the planner ask instead of sets of op names.
LRN's absent fields are checked against MNN itself (`import MNN`), its ONNX defaults against
onnxruntime; tolerances: cosine >= 0.99999 and max |diff| <= 1e-5 of the output's scale."""
import numpy as np
import pytest

from mnntool.ir.graph import Graph, Node, TensorInfo
from mnntool.ir.ops import (REGISTRY, define, grows, int8_in_float, int8_weights, is_convolution, is_view, keeps_values,
                            layout_of, ops_where, params, rows_at_run_time, runs_int8, schema_defaults, spreads_grid)
from tests.conftest import assert_close, mnn_run, ort_run, save_onnx


def _lrn_graph(param: dict, shape=(1, 6, 3, 4)) -> Graph:
    g = Graph(inputs=["x"], outputs=["y"], nodes=[Node("LRN", ["x"], ["y"], "lrn", param)])
    g.tensors["x"] = TensorInfo("x", "float32", shape)
    return g


@pytest.mark.parametrize("param", [{"localSize": 3, "beta": 0.75, "bias": 2.0},     # alpha left out: 0
                                   {"localSize": 3, "alpha": 0.5, "bias": 2.0},     # beta left out: 0
                                   {"localSize": 5, "alpha": 0.3, "beta": 0.6}])    # bias left out: 1
def test_lrn_reads_fields_left_out_as_mnn_does(tmp_path, param):
    """The definition's compute and MNN agree on a file that leaves LRN's alpha, beta or bias out: both
    read the schema's defaults (the compute used to assume alpha 1.0 and beta 0.75)."""
    from mnntool.format import writer
    from mnntool.runtime.session import Session
    x = np.random.default_rng(0).standard_normal((1, 6, 3, 4)).astype(np.float32) * 2
    path = tmp_path / "lrn.mnn"
    writer.save(_lrn_graph(param), path)
    theirs = mnn_run(path, ["x"], ["y"], {"x": x})["y"]
    ours = REGISTRY["LRN"].evaluate(_lrn_graph(param).nodes[0], [x])[0]
    assert_close(theirs, ours, min_cos=0.99999, rel_abs=1e-5)
    assert_close(theirs, Session(_lrn_graph(param)).run({"x": x})["y"], min_cos=0.99999, rel_abs=1e-5)


def test_lrn_onnx_defaults_match_onnxruntime(tmp_path):
    """ONNX's own defaults (alpha 1e-4, beta 0.75, bias 1) are the converter's to write."""
    from onnx import TensorProto, helper

    from mnntool import api
    from mnntool.runtime.session import Session
    node = helper.make_node("LRN", ["x"], ["y"], size=3)
    graph = helper.make_graph([node], "lrn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 5, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5, 4, 4])])
    save_onnx(graph, tmp_path / "lrn.onnx")
    x = np.random.default_rng(1).standard_normal((1, 5, 4, 4)).astype(np.float32) * 30
    api.convert(tmp_path / "lrn.onnx", tmp_path / "lrn.mnn")
    ref = ort_run(tmp_path / "lrn.onnx", {"x": x})["y"]
    assert_close(ref, Session(api.load_graph(tmp_path / "lrn.mnn")).run({"x": x})["y"], min_cos=0.99999, rel_abs=1e-5)


def test_params_read_the_schema_defaults():
    conv = Node("Convolution", ["x"], ["y"], "c", {"common": {"outputCount": 4, "kernelX": 3}})
    c = params(conv)["common"]
    assert (c["outputCount"], c["kernelX"], c["kernelY"], c["strideX"], c["padMode"]) == (4, 3, 1, 1, "CAFFE")
    pool = params(Node("Pooling", ["x"], ["y"], "p", {}))
    assert pool["ceilModel"] is True and pool["type"] == "MAXPOOL"     # Pool's ceilModel defaults to true
    assert params(Node("LRN", ["x"], ["y"])).get("nonsense") is None
    with pytest.raises(KeyError):
        params(Node("LRN", ["x"], ["y"]))["nonsense"]
    assert schema_defaults("LRN") == {"regionType": 0, "localSize": 0, "alpha": 0.0, "beta": 0.0, "bias": 1.0}


def test_the_facts_the_passes_used_to_spell_out():
    """The sets passes/, quant/ and runtime/ held before the facts moved onto the definitions."""
    assert ops_where(is_convolution) == {"Convolution", "ConvolutionDepthwise"} == ops_where(int8_weights)
    assert ops_where(runs_int8) == {"Convolution", "ConvolutionDepthwise", "Pooling", "ReLU", "ReLU6"}
    assert ops_where(is_view) == {"ConvertTensor", "Identity", "Dropout", "Reshape", "Flatten", "Squeeze",
                                  "Unsqueeze", "ExpandDims"}
    assert ops_where(keeps_values) == ops_where(is_view) | {"Permute", "Transpose", "ReverseSequence"}  # + new op
    assert ops_where(lambda op: layout_of(op).startswith("NC4HW4")) == {
        "Convolution", "ConvolutionDepthwise", "Deconvolution", "DeconvolutionDepthwise", "Pooling", "Scale",
        "Interp", "PReLU", "GridSample", "ROIPooling", "DetectionOutput"}
    assert ops_where(lambda op: layout_of(op) == "NC4HW4-all") == {"ROIPooling", "DetectionOutput"}
    assert ops_where(lambda op: layout_of(op) == "either") == {"ReLU", "ReLU6", "Sigmoid", "TanH", "UnaryOp"}
    assert ops_where(grows) == {"Fill", "Tile", "BroadcastTo", "Range", "OneHot", "EyeLike", "Interp", "Padding"}
    assert ops_where(rows_at_run_time) == {"DetectionOutput"}
    assert ops_where(int8_in_float) == {"BinaryOp", "UnaryOp"}      # int8_store's MNN_FLOAT_ARITHMETIC
    # ptq's GRID_SPREADING (less the MNN ops the IR has no definition of: CropAndResize, Raster, Crop),
    # and every op that only moves values
    assert ops_where(spreads_grid) == {"Pooling", "ReLU", "ReLU6", "Interp", "ROIPooling", "Concat", "Slice",
                                       "StridedSlice", "Padding", "DepthToSpace", "SpaceToDepth", "Pack", "Unpack",
                                       "Tile", "BroadcastTo"} | ops_where(keeps_values)
    assert not is_view("FusedAttention") and layout_of("FusedAttention") == "NCHW"    # no definition


def test_define_refuses_facts_it_does_not_know():
    with pytest.raises(TypeError, match="kind"):
        define("Nothing", kind="magic")
    with pytest.raises(TypeError, match="param"):
        define("Nothing", param="NoSuchTable")
    with pytest.raises(TypeError, match="layout"):
        define("Nothing", layout="NHWC4")
    assert "Nothing" not in REGISTRY
