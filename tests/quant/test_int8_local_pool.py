"""A local average pooling (2x2, DenseNet's transitions) after a convolution: the convolution runs int8
with an int8 output and the pool's output gets its input's grid (ptq._averages_many,
ptq.pooled_on_input_grid), so both runtimes pool int8 bytes and round each mean to that grid; a global
pool keeps the convolution before it writing float. References: the real MNN runtime on the same int8
file (cosine >= 0.99999: the same arithmetic) and the float file (cosine >= 0.999)."""
import numpy as np
import onnx
from onnx import TensorProto as TP, helper as h, numpy_helper as nh

import mnntool
from mnntool import api
from mnntool.compare import metrics
from mnntool.format import reader
from mnntool.quant import QuantConfig, quantize_file
from tests.conftest import mnn_run


def test_local_average_pools_read_int8(tmp_path):
    rng = np.random.default_rng(5)
    w = [rng.standard_normal(s).astype(np.float32) / 4
         for s in ((16, 3, 3, 3), (24, 16, 1, 1), (32, 24, 3, 3), (32, 32, 1, 1))]
    # DenseNet's transition: a float op (a sum) + ReLU, a 1x1 convolution, a 2x2 average, read in float
    nodes = [h.make_node("Conv", ["x", "w0"], ["c0"], pads=[1] * 4), h.make_node("Conv", ["c0", "k0"], ["e0"]),
             h.make_node("Relu", ["e0"], ["f0"]), h.make_node("Conv", ["f0", "k1"], ["d0"]),
             h.make_node("Add", ["c0", "d0"], ["b0"]), h.make_node("Relu", ["b0"], ["r0"]),
             h.make_node("Conv", ["r0", "w1"], ["c1"]),
             h.make_node("AveragePool", ["c1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
             h.make_node("Mul", ["p1", "k"], ["m1"]),      # a float reader (DenseNet: BatchNorm after a concat)
             h.make_node("Conv", ["m1", "w2"], ["c2"], pads=[1] * 4), h.make_node("Relu", ["c2"], ["r2"]),
             h.make_node("Conv", ["r2", "w3"], ["c3"]), h.make_node("GlobalAveragePool", ["c3"], ["y"])]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, [1, 3, 20, 20])],
                     [h.make_empty_tensor_value_info("y")],
                     initializer=[nh.from_array(a, f"w{k}") for k, a in enumerate(w)]
                     + [nh.from_array((rng.random((1, 24, 1, 1)) + 0.5).astype(np.float32), "k"),
                        nh.from_array(rng.standard_normal((16, 16, 1, 1)).astype(np.float32) / 4, "k0"),
                        nh.from_array(rng.standard_normal((16, 16, 1, 1)).astype(np.float32) / 4, "k1")])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), tmp_path / "m.onnx")
    api.convert(tmp_path / "m.onnx", tmp_path / "m.mnn")
    calib = tmp_path / "calib"
    calib.mkdir()
    for k in range(4):
        np.save(calib / f"{k}.npy", rng.standard_normal((1, 3, 20, 20)).astype(np.float32))
    quantize_file(tmp_path / "m.mnn", tmp_path / "q.mnn", QuantConfig(int8=True, calib=calib, samples=4))
    q = reader.load(tmp_path / "q.mnn")
    producers = q.producers()
    pool, last = (next(n for n in q.nodes if n.op == "Pooling" and bool(n.param.get("isGlobal")) == g_)
                  for g_ in (False, True))
    before = [producers[n.inputs[0]] for n in (pool, last)]
    while before[1].op not in ("Convolution", "ConvolutionDepthwise"):       # past the layout change
        before[1] = producers[before[1].inputs[0]]
    out_type = [n.param["symmetricQuan"].get("outputDataType", "DT_INT8") for n in before]
    assert out_type == ["DT_INT8", "DT_FLOAT"]       # before the 2x2 pool: int8; before the global: float
    src, dst = (q.tensors[t].quant for t in (pool.inputs[0], pool.outputs[0]))    # no reader gave it a grid
    assert src and dst and (src["scale"], src.get("zero", 0)) == (dst["scale"], dst.get("zero", 0))
    x = {"x": rng.standard_normal((1, 3, 20, 20)).astype(np.float32)}
    theirs = mnn_run(tmp_path / "q.mnn", q.inputs, q.outputs, x)["y"]
    ours = mnntool.load(tmp_path / "q.mnn").run(x)["y"]
    assert metrics(theirs, ours)["cosine"] >= 0.99999
    assert metrics(mnntool.load(tmp_path / "m.mnn").run(x)["y"], ours)["cosine"] >= 0.999
