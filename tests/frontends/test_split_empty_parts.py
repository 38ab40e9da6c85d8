"""A Split with a part of size 0 and a Concat of it (RotaryEmbedding's function body when the whole head
rotates): MNN's Slice fails on an empty output and returned garbage in the other (3.97e37 off on the
ONNX suite's test_rotary_embedding); written without the empty part, both runtimes give onnxruntime's
values exactly."""
import numpy as np
import pytest

from mnntool.api import convert
from mnntool.runners import backend_runner
from tests.conftest import ort_run, save_onnx

onnx = pytest.importorskip("onnx")


@pytest.mark.parametrize("sizes", [[8, 0], [0, 8], [3, 0, 5]])
def test_empty_split_parts_in_both_runtimes(tmp_path, sizes):
    from onnx import TensorProto, helper, numpy_helper
    outs = [f"p{i}" for i in range(len(sizes))]
    nodes = [helper.make_node("Split", ["x", "sizes"], outs, axis=-1),
             helper.make_node("Neg", [outs[0]], ["n"]),
             helper.make_node("Concat", ["n"] + outs[1:], ["y"], axis=-1)]
    g = helper.make_graph(nodes, "s", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(np.array(sizes, np.int64), "sizes")])
    save_onnx(g, tmp_path / "s.onnx", opset=18)
    x = np.random.default_rng(0).standard_normal((2, 3, 8)).astype(np.float32)
    convert(tmp_path / "s.onnx", tmp_path / "s.mnn")
    ref = ort_run(tmp_path / "s.onnx", {"x": x})["y"]
    backends = ["numba"]
    try:
        import MNN  # noqa: F401
        backends.append("mnn")
    except ImportError:
        pass
    for b in backends:
        got = backend_runner(tmp_path / "s.mnn", b, 1).run({"x": x})["y"]
        assert got.reshape(ref.shape).tolist() == ref.tolist(), b
