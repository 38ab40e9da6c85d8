"""Permutes that keep runs of the last axis (kernels/ops/tensor.py permute_runs: one copy loop a run,
outer axes merged where they stay neighbours), against onnxruntime's Transpose: exactly equal (a copy).
Attention's qkv split, heads back to tokens, a window partition of short rows; a permute that moves nothing
(one run longer than RUN_MAX: NumPy's copy)."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h

from mnntool import api
from mnntool.runtime.kernels.ops.tensor import permute_groups
from mnntool.runtime.session import Session

ort = pytest.importorskip("onnxruntime")


@pytest.mark.parametrize("shape,perm", [((1, 197, 3, 8, 8), (2, 0, 3, 1, 4)), ((1, 8, 50, 16), (0, 2, 1, 3)),
                                        ((1, 4, 7, 4, 7, 8), (0, 1, 3, 2, 4, 5)), ((2, 3, 5, 6), (0, 1, 2, 3)),
                                        ((5, 7, 3, 6), (1, 0, 2, 3)), ((6, 1, 5, 2, 9), (3, 2, 1, 0, 4))])
@pytest.mark.parametrize("threads", [1, 2])
def test_permute_keeping_runs_matches_onnxruntime(tmp_path, shape, perm, threads):
    m = h.make_model(h.make_graph([h.make_node("Transpose", ["x"], ["y"], perm=list(perm))], "g",
                                  [h.make_tensor_value_info("x", TP.FLOAT, list(shape))],
                                  [h.make_tensor_value_info("y", TP.FLOAT, None)]),
                     opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "m.onnx"))
    api.convert(tmp_path / "m.onnx", tmp_path / "m.mnn")
    x = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
    s = Session(api.load_graph(tmp_path / "m.mnn"), threads=threads)
    want = ort.InferenceSession(str(tmp_path / "m.onnx")).run(None, {"x": x})[0]
    for _ in range(2):
        np.testing.assert_array_equal(s.run({"x": x})["y"], want)


def test_groups_merge_neighbours_and_refuse_a_moved_last_axis():
    sizes, steps, run = permute_groups((1, 197, 3, 8, 8), (2, 0, 3, 1, 4))
    assert list(sizes) == [1, 1, 24, 197] and list(steps) == [0, 0, 8, 192] and run == 8     # (3, 8) merged
    sizes, steps, run = permute_groups((2, 4, 7, 4, 7, 12), (0, 1, 3, 2, 4, 5))
    assert list(sizes) == [1, 8, 4, 7] and list(steps) == [0, 2352, 84, 336] and run == 84
    assert permute_groups((2, 3, 4), (0, 2, 1)) is None
