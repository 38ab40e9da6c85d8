"""A same-shape Add stored on an int8 grid, rounded in its own pass (kernels.ops.int8_add) against the
two steps it replaces (elementwise.add_relu, then the store's rounding step int8_store.rounding):
bit-exact, with and without ReLU and zero point, on values at rounding ties; and a residual block's
int8 file run with the rounded Add against the same session without it (bit-exact) and against the
real MNN runtime (cosine >= 0.9999)."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP, helper as h, numpy_helper as nh

from mnntool import api
from mnntool.compare import metrics
from mnntool.format import reader
from mnntool.ir.ops import Val
from mnntool.loading import load_graph
from mnntool.quant import QuantConfig, quantize_file
from mnntool.runtime.kernels import sized
from mnntool.runtime.kernels.micro.epilogue import grid_of
from mnntool.runtime.kernels.ops import elementwise, int8_add
from mnntool.runtime.plan.int8_store import rounding
from mnntool.runtime.session import Session
from tests.conftest import mnn_run

f = np.float32


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("zero", [0.0, -127.0, 5.0])
def test_rounded_add_matches_add_then_rounding(relu, zero):
    r = np.random.default_rng(int(zero) + 300 + 1000 * relu)
    s = f(0.037)
    grid = grid_of(s, -128 - zero, 127 - zero)
    a = (r.standard_normal((6, 333)) * 3).astype(f)
    b = (r.standard_normal((6, 333)) * 3).astype(f)
    # half-steps: sums that land on rounding ties
    a[0] = ((r.integers(-300, 300, 333) + f(0.5)) * s).astype(f)
    b[0] = 0
    outs = [Val((6, 333), "float32", grid=grid, zero=zero)]
    k = int8_add.rounded_add(6, outs, relu, 1)
    got = np.empty((6, 333), f)
    k.fn([a, b], [got])
    assert k.out_grid == grid
    added = np.empty((6, 333), f)
    sized(elementwise.add_relu, 1, 1)(a, b, added, relu)
    want = rounding(grid, 1, zero).fn([added])[0]
    np.testing.assert_array_equal(got, want)
    assert int8_add.rounded_add(6, [Val((6, 333), "float32")], relu, 1) is None      # no grid: no kernel


def test_residual_block_matches_unfused_and_mnn(tmp_path, monkeypatch):
    r = np.random.default_rng(1)
    def block(x, k, y):     # ResNet's basic block: two convolutions, then the input added back
        return [h.make_node("Conv", [x, f"w{k}a"], [f"c{k}a"], pads=[1] * 4),
                h.make_node("Relu", [f"c{k}a"], [f"r{k}"]),
                h.make_node("Conv", [f"r{k}", f"w{k}b"], [f"c{k}b"], pads=[1] * 4),
                h.make_node("Add", [f"c{k}b", x], [f"s{k}"]), h.make_node("Relu", [f"s{k}"], [y])]
    nodes = [h.make_node("Conv", ["x", "w0"], ["c0"], pads=[1] * 4), h.make_node("Relu", ["c0"], ["a0"]),
             *block("a0", 1, "a1"), *block("a1", 2, "y")]
    inits = [nh.from_array(r.standard_normal((16, 8, 3, 3)).astype(f) / 4, "w0")]
    inits += [nh.from_array(r.standard_normal((16, 16, 3, 3)).astype(f) / 8, f"w{k}") for k in ("1a", "1b", "2a", "2b")]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, [1, 8, 14, 20])],
                     [h.make_empty_tensor_value_info("y")], initializer=inits)
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), tmp_path / "m.onnx")
    api.convert(tmp_path / "m.onnx", tmp_path / "m.mnn")
    calib = tmp_path / "calib"
    calib.mkdir()
    for i in range(3):
        np.save(calib / f"{i}.npy", r.standard_normal((1, 8, 14, 20)).astype(f))
    quantize_file(tmp_path / "m.mnn", tmp_path / "q.mnn", QuantConfig(int8=True, calib=calib, method="minmax"))
    feeds = {"x": r.standard_normal((1, 8, 14, 20)).astype(f)}
    s = Session(load_graph(tmp_path / "q.mnn"), 1)
    fused = s.run(feeds)
    steps = [st.op for st in s.plan.ran]
    assert "Int8Store" not in steps, steps         # the stored sum rounded by the Add itself
    monkeypatch.setattr(int8_add, "rounded_add", lambda *a: None)
    plain = Session(load_graph(tmp_path / "q.mnn"), 1)
    unfused = plain.run(feeds)
    assert "Int8Store" in [st.op for st in plain.plan.ran]
    q = reader.load(tmp_path / "q.mnn")
    theirs = mnn_run(tmp_path / "q.mnn", q.inputs, q.outputs, feeds)
    for name in fused:
        np.testing.assert_array_equal(fused[name], unfused[name])
        assert metrics(theirs[name], fused[name])["cosine"] >= 0.9999
