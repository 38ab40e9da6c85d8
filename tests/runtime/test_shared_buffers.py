"""Work buffers shared between kernels (kernels.Scratch, SharedZeros): row GEMMs' packed rows, padded
convolution inputs and attention scores live in one buffer per thread, not one per layer. Layers of one
session must not see each other's data, and two sessions run from two Python threads at once must not
either (a kernel's Python part lets the other thread run between its Numba calls). Reference:
onnxruntime on the same model and inputs, rtol 1e-4."""
import sys
import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h

from mnntool import api
from mnntool.runtime.session import Session
from mnntool.format import reader
from tests.conftest import save_onnx

ort = pytest.importorskip("onnxruntime")


def _model(path, seed):
    """Two padded 3x3 convolutions of one geometry (one shared padded buffer), then two Linear layers of
    different widths on the 64 pixels as rows (one shared packed-rows buffer)."""
    rng = np.random.RandomState(seed)
    arrays = {"w1": rng.randn(8, 8, 3, 3), "w2": rng.randn(8, 8, 3, 3), "f1": rng.randn(8, 24), "f2": rng.randn(24, 16)}
    inits = [onnx.numpy_helper.from_array((a * 0.3).astype(np.float32), n) for n, a in arrays.items()]
    inits.append(onnx.numpy_helper.from_array(np.array([1, 8, 64], np.int64), "s"))
    nodes = [h.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             h.make_node("Relu", ["c1"], ["r1"]),
             h.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             h.make_node("Reshape", ["c2", "s"], ["flat"]),
             h.make_node("Transpose", ["flat"], ["rows"], perm=[0, 2, 1]),
             h.make_node("MatMul", ["rows", "f1"], ["m1"]),
             h.make_node("Relu", ["m1"], ["r2"]),
             h.make_node("MatMul", ["r2", "f2"], ["y"])]
    g = h.make_graph(nodes, "shared", [h.make_tensor_value_info("x", TP.FLOAT, [1, 8, 8, 8])],
                     [h.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    save_onnx(g, path)


def test_layers_and_threads_keep_their_own_data(tmp_path):
    sessions, refs = [], []
    for seed in (0, 1):
        _model(tmp_path / f"m{seed}.onnx", seed)
        api.convert(tmp_path / f"m{seed}.onnx", tmp_path / f"m{seed}.mnn")
        sessions.append(Session(reader.load(tmp_path / f"m{seed}.mnn"), threads=1))
        refs.append(ort.InferenceSession(str(tmp_path / f"m{seed}.onnx")))
    rng = np.random.RandomState(2)
    inputs = [rng.randn(1, 8, 8, 8).astype(np.float32) for _ in range(4)]
    expected = [[r.run(None, {"x": x})[0] for x in inputs] for r in refs]
    failures = []

    def work(k):
        for i in range(60):
            got = sessions[k].run({"x": inputs[i % 4]})["y"]
            if not np.allclose(got.reshape(expected[k][i % 4].shape), expected[k][i % 4], rtol=1e-4, atol=1e-4):
                failures.append((k, i))
    threads = [threading.Thread(target=work, args=(k,)) for k in (0, 1)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)     # the threads take turns between nearly every two bytecodes
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not failures, failures[:5]
