"""A StridedSlice that takes one contiguous block of its input (attention's q/k/v of a packed qkv tensor,
the tokens after a class token) is a view of it, not a copy (kernels/ops/tensor.py _contiguous_block);
other slices still copy. Against onnxruntime, exact: overlapping block slices with an elementwise op
after one of them (which must not write into the shared input) and a non-contiguous slice."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from mnntool import api
from mnntool.runtime.kernels.ops.tensor import _contiguous_block
from mnntool.runtime.session import Session

ort = pytest.importorskip("onnxruntime")


def _slice(name, src, out, start, end, axis):
    inits = [nh.from_array(np.array([v], np.int64), f"{name}_{k}") for k, v in
             (("s", start), ("e", end), ("a", axis))]
    return h.make_node("Slice", [src, f"{name}_s", f"{name}_e", f"{name}_a"], [out], name=name), inits


@pytest.mark.parametrize("threads", [1, 2])
def test_block_slices_are_views_and_match_onnxruntime(tmp_path, threads):
    shape, tokens = (3, 1, 4, 1100, 8), (1, 2101, 16)     # above the small-op programs' size
    # the slices read an inner tensor (q = x * 2): a view must keep it from in-place writes after it
    parts = [_slice("a", "q", "xa", 0, 2, 0), _slice("b", "q", "xb", 1, 3, 0), _slice("c", "t", "xc", 1, 2101, 1),
             _slice("d", "q", "xd", 0, 4, 4)]
    nodes = [h.make_node("Mul", ["x", "two"], ["q"])] + [n for n, _ in parts] + [
        h.make_node("Relu", ["xa"], ["ra"]), h.make_node("Add", ["ra", "xb"], ["y"]),
        h.make_node("Neg", ["xc"], ["z"]), h.make_node("Abs", ["xd"], ["w"])]
    inits = [i for _, ii in parts for i in ii] + [nh.from_array(np.array(2.0, np.float32), "two")]
    m = h.make_model(h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, list(shape)),
                                               h.make_tensor_value_info("t", TP.FLOAT, list(tokens))],
                                  [h.make_tensor_value_info(n, TP.FLOAT, None) for n in ("y", "z", "w")], inits),
                     opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "m.onnx"))
    api.convert(tmp_path / "m.onnx", tmp_path / "m.mnn")
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal(shape).astype(np.float32), "t": rng.standard_normal(tokens).astype(np.float32)}
    s = Session(api.load_graph(tmp_path / "m.mnn"), threads=threads)
    want = ort.InferenceSession(str(tmp_path / "m.onnx")).run(None, feeds)
    for _ in range(3):
        got = s.run(feeds)
        for name, w in zip(("y", "z", "w"), want):
            np.testing.assert_array_equal(got[name], w)
    kinds = sorted(st.kernel.view for st in s.plan.steps if st.op == "StridedSlice")
    assert kinds == [False, True, True, True]       # the slice of the last axis copies


def test_contiguous_block_rule():
    assert _contiguous_block((3, 1, 8, 10, 8), (slice(1, 2),), "float32")
    assert _contiguous_block((1, 11, 64), (slice(None), slice(1, 11)), "float32")
    assert not _contiguous_block((1, 11, 64), (slice(None), slice(None), slice(0, 32)), "float32")
    assert not _contiguous_block((4, 6), (slice(0, 4, 2),), "float32")
    assert not _contiguous_block((4, 6), (slice(2, 2),), "float32")
