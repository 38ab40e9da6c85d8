"""A model whose layers differ in how much int4 costs them, for the mixed-precision tests: a chain of
1x1 convolutions (128 channels, ReLU between, activations neither vanish nor grow: rows of norm 1.4),
every third one with heavy-tailed weights (a Student t with 1.5 degrees of freedom: a few large weights
set each row's int4 step, the many small ones round to zero), then a global pool and a linear head."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto as TP, helper as h, numpy_helper as nh

from mnntool import api
from tests.conftest import save_onnx

C, LAYERS, HW = 128, 9, 4


def build(folder) -> tuple:
    """(path of the float .mnn, feeds maker: seed -> {input: array})"""
    r = np.random.default_rng(0)
    inits, nodes, t = [], [], "x"
    for i in range(LAYERS):
        w = r.standard_t(1.5, (C, C, 1, 1)) if i % 3 == 1 else r.standard_normal((C, C, 1, 1))
        w = (w / np.sqrt((w ** 2).sum((1, 2, 3), keepdims=True)) * 1.4).astype(np.float32)
        inits.append(nh.from_array(w, f"w{i}"))
        nodes += [h.make_node("Conv", [t, f"w{i}"], [f"c{i}"]), h.make_node("Relu", [f"c{i}"], [f"r{i}"])]
        t = f"r{i}"
    inits.append(nh.from_array((r.standard_normal((C, 10)) * 0.2).astype(np.float32), "wf"))
    nodes += [h.make_node("GlobalAveragePool", [t], ["g"]), h.make_node("Flatten", ["g"], ["f"]),
              h.make_node("MatMul", ["f", "wf"], ["y"])]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, [1, C, HW, HW])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [1, 10])], inits)
    save_onnx(g, folder / "m.onnx")
    api.convert(folder / "m.onnx", folder / "m.mnn")
    return folder / "m.mnn", feeds


def feeds(seed: int) -> dict:
    return {"x": np.random.default_rng(seed).standard_normal((1, C, HW, HW)).astype(np.float32)}


def cosine(a, b) -> float:
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
