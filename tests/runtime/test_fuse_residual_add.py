"""plan.fuse_residual_add: a convolution whose only reader is a residual Add (then a ReLU) planned as one
ResidualConvolution step (a LeakyReLU after it too). Reference: onnxruntime on the same ONNX model; tolerance 1e-5 relative to
max |out| (the convolutions' sums differ in order). Also where the stage must not fire: a residual
computed after the convolution, a broadcast one, an int8 file; and switched off, the same outputs."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from mnntool import api
from mnntool.runtime.session import Session

ort = pytest.importorskip("onnxruntime")
f32 = np.float32


def _save(path, nodes, shape, inits, outs=("y",)):
    g = h.make_graph(nodes, "res", [h.make_tensor_value_info("x", TP.FLOAT, list(shape))],
                     [h.make_tensor_value_info(o, TP.FLOAT, None) for o in outs], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))


def _w(rng, name, *shape):
    return nh.from_array((rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(f32), name)


def _block(path, k: int, c: int, shape, residual: str, relu: str):
    """conv(x) [k x k, stride 1, `c` channels in and out] + r [-> relu]; r the block input x, or another
    convolution of x ("conv"), or one of the first convolution's output made after it ("after")."""
    rng = np.random.default_rng(k * 10 + c)
    pad = [k // 2] * 4
    n = h.make_node
    # the fused convolution reads another tensor than the block input (one reading it would take an
    # identity residual into its weights: the converter does that)
    nodes = [n("Conv", ["x", "w0"], ["a"], pads=[1] * 4), n("Relu", ["a"], ["xa"]),
             n("Conv", ["xa", "wm"], ["m"], pads=[1] * 4), n("Relu", ["m"], ["xm"]),
             n("Conv", ["xm", "w1"], ["c1"], pads=pad, strides=[1, 1])]
    if residual == "x":
        r = "xa"
    elif residual == "conv":     # a projection shortcut: another convolution of the block input, made first
        nodes.insert(4, n("Conv", ["xa", "w2"], ["p"]))
        r = "p"
    elif residual == "after":    # made after the convolution, by an op no convolution fuses into
        nodes.append(n("Sigmoid", ["xa"], ["p"]))
        r = "p"
    else:                        # broadcast: one value per channel
        nodes.append(n("GlobalAveragePool", ["xa"], ["p"]))
        r = "p"
    nodes.append(n("Add", ["c1", r] if residual != "conv" else [r, "c1"], ["s" if relu else "y"]))
    if relu == "relu":
        nodes.append(n("Relu", ["s"], ["y"]))
    elif relu == "relu6":
        nodes.append(n("Clip", ["s", "lo", "hi"], ["y"]))
    elif relu == "leaky":
        nodes.append(n("LeakyRelu", ["s"], ["y"], alpha=0.01))
    inits = [_w(rng, "w0", c, shape[1], 3, 3), _w(rng, "wm", c, c, 3, 3), _w(rng, "w1", c, c, k, k),
             _w(rng, "w2", c, c, 1, 1),
             nh.from_array(np.array(0, f32), "lo"), nh.from_array(np.array(6, f32), "hi")]
    _save(path, nodes, shape, inits)


def _run(tmp_path, shape, off=()):
    api.convert(tmp_path / "m.onnx", tmp_path / "m.mnn")
    x = np.random.default_rng(1).standard_normal(shape).astype(f32) * 2
    ref = ort.InferenceSession(str(tmp_path / "m.onnx")).run(None, {"x": x})[0]
    s = Session(api.load_graph(tmp_path / "m.mnn"), threads=1, off=list(off))
    return s, s.run({"x": x})["y"], ref


def _close(out, ref):
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-5 * float(np.abs(ref).max()))


@pytest.mark.parametrize("k,c,hw", [(1, 16, (9, 13)), (3, 16, (9, 13)), (3, 24, (14, 20)),
                                    (1, 32, (7, 7))])
@pytest.mark.parametrize("residual", ["x", "conv"])
@pytest.mark.parametrize("relu", ["relu", "relu6", "leaky", ""])
def test_fused_block_matches_onnxruntime(tmp_path, k, c, hw, residual, relu):
    shape = (1, 8, *hw)
    _block(tmp_path / "m.onnx", k, c, shape, residual, relu)
    s, out, ref = _run(tmp_path, shape)
    ops = [st.op for st in s.plan.steps]
    assert "ResidualConvolution" in ops and "BinaryOp" not in ops and "Eltwise" not in ops, ops
    assert "ReLU" not in ops and "ReLU6" not in ops, ops       # the ReLU taken too (the Add's or a node's, or a LeakyReLU)
    _close(out, ref)
    s_off, out_off, _ = _run(tmp_path, shape, off=["fuse_residual_add"])
    assert "ResidualConvolution" not in [st.op for st in s_off.plan.steps]
    _close(out_off, ref)


@pytest.mark.parametrize("residual", ["after", "broadcast"])
def test_not_fused_where_it_must_not(tmp_path, residual):
    shape = (1, 8, 9, 13)
    _block(tmp_path / "m.onnx", 3, 16, shape, residual, "relu")
    s, out, ref = _run(tmp_path, shape)
    if residual == "after":      # the file keeps that order
        at = {o: i for i, nd in enumerate(s.graph.nodes) for o in nd.outputs}
        assert at["p"] > at["c1"], s.graph.nodes
    assert "ResidualConvolution" not in [st.op for st in s.plan.steps]
    _close(out, ref)


def test_not_fused_in_an_int8_file(tmp_path):
    from mnntool.quant import QuantConfig, quantize_file
    shape = (1, 8, 9, 13)
    _block(tmp_path / "m.onnx", 3, 16, shape, "x", "relu")
    api.convert(tmp_path / "m.onnx", tmp_path / "m.mnn")
    calib = tmp_path / "calib"
    calib.mkdir()
    rng = np.random.default_rng(2)
    for i in range(2):
        np.save(calib / f"{i}.npy", rng.standard_normal(shape).astype(f32))
    quantize_file(tmp_path / "m.mnn", tmp_path / "q.mnn", QuantConfig(int8=True, calib=calib, method="minmax"))
    g = api.load_graph(tmp_path / "q.mnn")
    # the pattern is there (an int8 convolution read only by a same-shape Add): refused for the grid
    made = {o: nd for nd in g.nodes for o in nd.outputs}
    adds = [nd for nd in g.nodes if nd.op == "BinaryOp" and nd.param.get("opType") == "ADD"]
    assert any(made.get(i) is not None and made[i].op == "Convolution" and
               (made[i].param.get("quanParameter") or {}).get("scaleIn") for a in adds for i in a.inputs)
    s = Session(g, threads=1)
    x = rng.standard_normal(shape).astype(f32)
    got = s.run({"x": x})["y"]
    assert "ResidualConvolution" not in [st.op for st in s.plan.steps]
    plain = Session(api.load_graph(tmp_path / "q.mnn"), threads=1, off=["fuse_residual_add"]).run({"x": x})["y"]
    np.testing.assert_array_equal(got, plain)


def test_batch_of_two(tmp_path):
    shape = (2, 8, 10, 11)
    _block(tmp_path / "m.onnx", 3, 16, shape, "conv", "relu")
    s, out, ref = _run(tmp_path, shape)
    assert "ResidualConvolution" in [st.op for st in s.plan.steps]
    _close(out, ref)


@pytest.mark.parametrize("lo,hi", [(-np.inf, np.inf), (0, np.inf), (0, 6)])
def test_the_pass_against_numpy(lo, hi):
    """kernels.micro.residual.add_clamped over a size with a partial last block; a NaN stays NaN (exact)."""
    from mnntool.runtime.kernels.micro.residual import BLOCK, add_clamped
    rng = np.random.default_rng(3)
    y, r = (rng.standard_normal(3 * BLOCK + 37).astype(f32) * 5 for _ in range(2))
    y[5] = np.nan
    want = np.clip(y + r, f32(lo), f32(hi))
    add_clamped(y, r, f32(lo), f32(hi))
    np.testing.assert_array_equal(y, want)


def test_a_declined_convolution_falls_back_inside_the_fused_step(tmp_path, monkeypatch):
    """Where the fast kernel declines a layer, the fused step runs the op's definition, then the add."""
    from mnntool.errors import MnnToolError
    from mnntool.runtime.kernels.ops import conv

    def declined(*a):
        raise MnnToolError("declined")
    monkeypatch.setattr(conv, "convolution", declined)
    shape = (1, 8, 9, 13)
    _block(tmp_path / "m.onnx", 3, 16, shape, "x", "relu6")
    s, out, ref = _run(tmp_path, shape)
    assert "ResidualConvolution" in [st.op for st in s.plan.steps]
    _close(out, ref)
