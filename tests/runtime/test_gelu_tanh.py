"""UnaryOp GELU (the tanh form written by default, passes/approximate_gelu.py) runs on a vectorised kernel
that computes what MNN computes (MNNGeluCommon's rational tanh): against a float64 evaluation of MNN's
formula within 2e-6, against the real MNN within 2e-6, and against exact erf GELU within 4.8e-4."""
import math

import numpy as np
import pytest

from mnntool.api import convert
from mnntool.runners import backend_runner
from mnntool.runtime.kernels.ops.elementwise import gelu_tanh_flat
from tests.conftest import save_onnx


def _mnn_formula(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    t = np.clip(0.79788458 * (0.044715 * x ** 3 + x), -5, 5)
    t2 = t * t
    th = t * (135135 + t2 * (17325 + t2 * (378 + t2))) / (135135 + t2 * (62370 + t2 * (3150 + t2 * 28)))
    return (1 + np.clip(th, -1, 1)) * x * 0.5


def test_kernel_is_mnns_formula():
    x = np.concatenate([np.linspace(-8, 8, 20001), np.random.default_rng(0).standard_normal(50000) * 3])
    x = x.astype(np.float32)
    out = np.empty_like(x)
    gelu_tanh_flat(x, out)
    assert np.abs(out - _mnn_formula(x)).max() <= 2e-6
    exact = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x.astype(np.float64)])
    assert np.abs(out - exact).max() <= 4.8e-4


def test_both_runtimes_agree(tmp_path):
    from onnx import TensorProto, helper
    g = helper.make_graph([helper.make_node("Gelu", ["x"], ["y"], approximate="tanh")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 100, 100])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    save_onnx(g, tmp_path / "g.onnx", opset=20, ir_version=9)
    convert(tmp_path / "g.onnx", tmp_path / "g.mnn")
    x = (np.random.default_rng(1).standard_normal((1, 3, 100, 100)) * 3).astype(np.float32)
    ours = backend_runner(tmp_path / "g.mnn", "numba", 2).run({"x": x})["y"]
    assert np.abs(ours - _mnn_formula(x)).max() <= 2e-6
    pytest.importorskip("MNN")
    theirs = backend_runner(tmp_path / "g.mnn", "mnn", 1).run({"x": x})["y"]
    assert np.abs(ours - theirs).max() <= 2e-6
