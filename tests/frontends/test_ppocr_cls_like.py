"""PP-OCR's direction classifier (ch_ppocr_mobile_v2.0_cls_infer.onnx in the rapidocr-onnxruntime wheel)
declares its input [-1, 3, '?', '?'] (issue 49, item 3): `convert --input-shape x:1x3x48x192` must take
it and the file must match onnxruntime. The wheel is not a light dependency (it pulls OpenCV), so this
builds a small model with the same declaration, opset (11), IR version (7) and op mix as paddle2onnx
wrote it -- Constant nodes, Conv + BatchNormalization, hard-swish as Add/Clip/Mul/Div, depthwise
convolutions with stride (2, 1), a squeeze-excite gate whose biases are Reshape'd initializers added
after the convolution and closed by HardSigmoid, MaxPool, GlobalAveragePool, the batch dim read back
through Shape/Cast/Slice/Cast/Concat into a Reshape, MatMul + Add, Softmax, Identity -- with random
weights. The real model is scored in benchmarks/quant_accuracy.py --ocr and benchmarks/wheel_models.py.

Reference: onnxruntime; outputs (softmax probabilities) within 1e-5 absolute in mnntool's runtime
and in MNN's.
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from mnntool import api
from mnntool.runtime.session import Session
from tests.conftest import mnn_run, save_onnx

ort = pytest.importorskip("onnxruntime")


class _Builder:
    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.k = [], 0

    def const(self, value) -> str:
        """A Constant node, as paddle2onnx writes weights and scalars."""
        self.k += 1
        name = f"Constant@{self.k}"
        self.nodes.append(h.make_node("Constant", [], [name], value=nh.from_array(np.asarray(value), name)))
        return name

    def node(self, op, inputs, **attrs) -> str:
        self.k += 1
        out = f"{op.lower()}_{self.k}"
        self.nodes.append(h.make_node(op, list(inputs), [out], **attrs))
        return out

    def conv_bn(self, x, cin, cout, k=1, stride=(1, 1), group=1) -> str:
        fan = cin // group * k * k
        w = self.const((self.rng.standard_normal((cout, cin // group, k, k)) / np.sqrt(fan)).astype(np.float32))
        c = self.node("Conv", [x, w], kernel_shape=[k, k], strides=list(stride), pads=[k // 2] * 4, group=group,
                      dilations=[1, 1])
        bn = [self.const((self.rng.uniform(0.5, 1.5, cout)).astype(np.float32)),
              self.const((self.rng.standard_normal(cout) * 0.1).astype(np.float32)),
              self.const((self.rng.standard_normal(cout) * 0.1).astype(np.float32)),
              self.const(self.rng.uniform(0.5, 1.5, cout).astype(np.float32))]
        return self.node("BatchNormalization", [c, *bn], epsilon=1e-5, momentum=0.9)

    def hardswish(self, x) -> str:
        a = self.node("Add", [x, self.const(np.float32(3))])
        c = self.node("Clip", [a, self.const(np.float32(0)), self.const(np.float32(6))])
        return self.node("Div", [self.node("Mul", [x, c]), self.const(np.float32(6))])

    def se(self, x, c) -> str:
        p = self.node("GlobalAveragePool", [x])
        r = c // 4
        w1 = self.const((self.rng.standard_normal((r, c, 1, 1)) / np.sqrt(c)).astype(np.float32))
        b1 = self.node("Reshape", [self.const(self.rng.standard_normal(r).astype(np.float32) * 0.1),
                                   self.const(np.array([1, r, 1, 1], np.int64))])
        f1 = self.node("Relu", [self.node("Add", [self.node("Conv", [p, w1], kernel_shape=[1, 1]), b1])])
        w2 = self.const((self.rng.standard_normal((c, r, 1, 1)) / np.sqrt(r)).astype(np.float32))
        b2 = self.node("Reshape", [self.const(self.rng.standard_normal(c).astype(np.float32) * 0.1),
                                   self.const(np.array([1, c, 1, 1], np.int64))])
        g = self.node("HardSigmoid", [self.node("Add", [self.node("Conv", [f1, w2], kernel_shape=[1, 1]), b2])],
                      alpha=0.2, beta=0.5)
        return self.node("Mul", [x, g])

    def block(self, x, cin, mid, cout, stride) -> str:
        e = self.node("Relu", [self.conv_bn(x, cin, mid)])
        d = self.node("Relu", [self.conv_bn(e, mid, mid, 3, stride, group=mid)])
        y = self.conv_bn(self.se(d, mid), mid, cout)
        return self.node("Add", [x, y]) if cin == cout and stride == (1, 1) else y


def _cls_like(path, dims=(-1, 3, "?", "?")):
    b = _Builder()
    x = b.hardswish(b.conv_bn("x", 3, 8, 3, (2, 2)))
    x = b.block(x, 8, 16, 16, (2, 1))
    x = b.block(x, 16, 32, 16, (1, 1))
    x = b.block(x, 16, 32, 24, (2, 1))
    x = b.hardswish(b.conv_bn(x, 24, 48))
    pooled = b.node("GlobalAveragePool", [b.node("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2], pads=[0] * 4,
                                                 ceil_mode=0)])
    shape = b.node("Cast", [b.node("Shape", [pooled])], to=TP.INT32)
    first = b.node("Slice", [shape, b.const(np.array([0], np.int64)), b.const(np.array([1], np.int64))])
    batch = b.node("Cast", [first], to=TP.INT64)
    flat = b.node("Reshape", [pooled, b.node("Concat", [batch, b.const(np.array([48], np.int64))], axis=-1)])
    fc = b.node("Add", [b.node("MatMul", [flat, b.const(b.rng.standard_normal((48, 2)).astype(np.float32))]),
                        b.const(b.rng.standard_normal(2).astype(np.float32) * 0.1)])
    b.nodes.append(h.make_node("Identity", [b.node("Softmax", [fc], axis=1)], ["y"]))
    xi = h.make_tensor_value_info("x", TP.FLOAT, [1, 3, 4, 4])
    for d, v in zip(xi.type.tensor_type.shape.dim, dims):
        if isinstance(v, int):
            d.dim_value = v
        else:
            d.dim_param = v
    g = h.make_graph(b.nodes, "cls", [xi], [h.make_tensor_value_info("y", TP.FLOAT, [-1, 2])])
    save_onnx(g, path, opset=11, ir_version=7)
    return path


def _ort(path, x):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_cls_like_converts_with_input_shape_and_matches_onnxruntime(tmp_path):
    src = _cls_like(tmp_path / "cls.onnx")
    assert [d.dim_value or d.dim_param for d in onnx.load(str(src)).graph.input[0].type.tensor_type.shape.dim] == \
        [-1, 3, "?", "?"]
    dst = tmp_path / "cls.mnn"
    p = subprocess.run([sys.executable, "-m", "mnntool", "convert", str(src), str(dst),
                        "--input-shape", "x:1x3x48x192"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    g = api.load_graph(dst)
    assert tuple(g.tensors["x"].shape) == (1, 3, 48, 192)
    x = np.random.default_rng(1).standard_normal((1, 3, 48, 192)).astype(np.float32)
    ref = _ort(src, x)
    np.testing.assert_allclose(Session(g).run({"x": x})["y"], ref, atol=1e-5)
    np.testing.assert_allclose(mnn_run(dst, ["x"], ["y"], {"x": x})["y"].reshape(ref.shape), ref, atol=1e-5)


def test_cls_like_keeps_batch_and_size_open_without_input_shape(tmp_path):
    """Without --input-shape the file runs any batch and line width, as onnxruntime does."""
    src = _cls_like(tmp_path / "cls.onnx")
    dst = tmp_path / "cls.mnn"
    api.convert(src, dst)
    s = Session(api.load_graph(dst))
    for shape in [(2, 3, 48, 192), (1, 3, 48, 320)]:
        x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose(s.run({"x": x})["y"], _ort(src, x), atol=1e-5)
