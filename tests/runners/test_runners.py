"""Every runner behind the one interface gives the same model the same meaning: outputs against
onnxruntime run directly (tolerance: cosine >= 0.9999, max error 1e-3 of the output's scale), per-layer
tensors where the engine exposes them, and clear errors for what a runner cannot do."""
import numpy as np
import pytest

from mnntool.errors import MnnToolError
from mnntool.runners import BACKENDS, backend_runner, reference_runner
from tests.conftest import assert_close, ort_run

onnx = pytest.importorskip("onnx")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3, "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Add", ["r", "c"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 10, 10])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 10, 10])], [w])
    d = tmp_path_factory.mktemp("runners")
    src = d / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), src)
    from mnntool.api import convert
    convert(src, d / "m.mnn")
    x = rng.standard_normal((1, 3, 10, 10)).astype(np.float32)
    return src, d / "m.mnn", {"x": x}, ort_run(src, {"x": x})["y"]


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_backends_agree_with_onnxruntime(model, backend):
    src, mnn, feeds, ref = model
    if backend == "mnn":
        pytest.importorskip("MNN")
    if backend == "openvino":
        pytest.importorskip("openvino")
    r = backend_runner(src if backend in ("onnxruntime", "openvino") else mnn, backend, threads=1)
    r.prepare({"x": (1, 3, 10, 10)})
    assert_close(ref, r.run(feeds)["y"])
    assert r.graph.inputs == ["x"]


def test_per_layer_tensors(model):
    src, mnn, feeds, _ = model
    ref, order = reference_runner(src).run_all(feeds)
    assert [name for name, _ in order] == ["c", "r", "y"] and [op for _, op in order] == ["Conv", "Relu", "Add"]
    ours, our_order = backend_runner(mnn, "numba").run_all(feeds, ["c", "r", "y"])
    assert {"c", "y"} <= set(ours) and {n for n, _ in our_order} <= set(ours)
    for name in ("c", "y"):
        assert_close(ref[name], ours[name])


def test_profile_where_the_engine_gives_one(model):
    src, mnn, feeds, _ = model
    own = backend_runner(mnn, "numba", threads=1)
    steps = own.profile(feeds)
    assert steps and all(isinstance(dt, float) and dt >= 0 for _, _, dt in steps)
    assert backend_runner(src, "onnxruntime", threads=1).profile(feeds) is None


def test_errors_name_the_file_and_the_choice(model, tmp_path):
    src, mnn, _, _ = model
    with pytest.raises(MnnToolError, match="unknown backend 'tvm'"):
        backend_runner(mnn, "tvm")
    with pytest.raises(MnnToolError, match="not a .mnn file"):
        reference_runner(mnn)
    with pytest.raises(MnnToolError, match="needs the source .onnx"):
        backend_runner(mnn, "onnxruntime")
    with pytest.raises(MnnToolError, match="runs the source .onnx"):
        backend_runner(mnn, "openvino")
