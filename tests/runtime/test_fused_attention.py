"""The planner runs attention chains (MatMul [+ mask] -> Softmax [-> IsNaN guard] -> MatMul) as one
FusedAttention step; the file keeps MNN's ops. Reference: onnxruntime on the same ONNX model,
max abs error 1e-5; keep_all (verify's mode) plans the ops one by one. Shapes: a tiny BERT's, masks
broadcast per head and per key, MobileViT-like heads, heads larger than a tile."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h

from mnntool import api
from mnntool.runtime.session import Session

ort = pytest.importorskip("onnxruntime")


SMALL = ((1, 2, 5, 8), (1, 2, 7, 8), (1, 2, 7, 4), (1, 1, 5, 7))
SHAPES = {      # q, k, v, mask
    "small": SMALL,
    "mask per head": ((1, 2, 5, 8), (1, 2, 7, 8), (1, 2, 7, 4), (1, 2, 5, 7)),
    "mask per key": ((2, 3, 6, 16), (2, 3, 9, 16), (2, 3, 9, 16), (2, 1, 1, 9)),
    "mobilevit-like": ((4, 4, 64, 16), (4, 4, 64, 16), (4, 4, 64, 16), (1, 1, 64, 64)),
    "large heads": ((1, 2, 40, 64), (1, 2, 40, 64), (1, 2, 40, 48), (1, 1, 40, 40)),
}


def _model(path, mask: bool, guard: bool, probs_out: bool = False, shapes=SMALL):
    nodes = [h.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             h.make_node("MatMul", ["q", "kt"], ["s"])]
    src = "s"
    if mask:
        nodes.append(h.make_node("Add", ["s", "m"], ["sm"]))
        src = "sm"
    nodes.append(h.make_node("Softmax", [src], ["p"], axis=-1))
    p = "p"
    if guard:
        nodes += [h.make_node("IsNaN", ["p"], ["nan"]), h.make_node("Where", ["nan", "zero", "p"], ["pg"])]
        p = "pg"
    nodes.append(h.make_node("MatMul", [p, "v"], ["y"]))
    inputs = [h.make_tensor_value_info(n, TP.FLOAT, list(s)) for n, s in zip("qkv", shapes)]
    if mask:
        inputs.append(h.make_tensor_value_info("m", TP.FLOAT, list(shapes[3])))
    outputs = [h.make_tensor_value_info("y", TP.FLOAT, None)] + \
        ([h.make_tensor_value_info("p", TP.FLOAT, None)] if probs_out else [])
    _save(path, nodes, inputs, outputs, [h.make_tensor("zero", TP.FLOAT, [], [0.0])])


def _save(path, nodes, inputs, outputs, inits):
    """The graph as an opset-17 ONNX file at `path`."""
    m = h.make_model(h.make_graph(nodes, "attn", inputs, outputs, inits), opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("mask,guard", [(False, False), (True, False), (True, True)])
def test_fused_attention_matches_onnxruntime(tmp_path, mask, guard, shape):
    shapes = SHAPES[shape]
    _model(tmp_path / "a.onnx", mask, guard, shapes=shapes)
    api.convert(tmp_path / "a.onnx", tmp_path / "a.mnn")
    g = api.load_graph(tmp_path / "a.mnn")
    assert "Softmax" in {n.op for n in g.nodes}, "the file keeps the ops MNN runs"
    rng = np.random.RandomState(0)
    feeds = {n: rng.randn(*s) for n, s in zip("qkv", shapes)}
    if mask:
        m = np.where(rng.rand(*shapes[3]) < 0.3, -np.inf, rng.randn(*shapes[3]) * 0.5)    # an additive mask too
        if guard:
            m[0, 0, -1] = -np.inf       # every key masked (for a row, or all rows): NaN, turned into 0 by the guard
        feeds["m"] = m
    feeds = {k: v.astype(np.float32) for k, v in feeds.items()}
    ref = ort.InferenceSession(str(tmp_path / "a.onnx")).run(None, feeds)[0]
    s = Session(g)
    got = s.run(feeds)["y"]
    assert [st.op for st in s.plan.steps].count("FusedAttention") == 1
    np.testing.assert_allclose(got, ref, atol=1e-5)
    assert not np.isnan(got).any() or not guard
    whole = Session(g).run(feeds, keep_all=True)
    assert "p" in whole, "keep_all plans every op"
    np.testing.assert_allclose(whole["y"], ref, atol=1e-5)


SLICED = {      # q, k, v, mask: batches that broadcast, sliced on one or both leading axes
    "per head": ((2, 3, 6, 8), (2, 3, 9, 8), (2, 3, 9, 4), (2, 3, 6, 9)),
    "k and v shared": ((2, 3, 6, 8), (1, 3, 9, 8), (2, 1, 9, 4), (2, 1, 1, 9)),
    "mask per key": ((2, 3, 6, 16), (2, 3, 9, 16), (2, 3, 9, 16), (1, 1, 6, 9)),
}


@pytest.mark.parametrize("shape", list(SLICED))
@pytest.mark.parametrize("limit", [6 * 9 * 4, 3 * 6 * 9 * 4])
def test_sliced_attention_matches_onnxruntime(tmp_path, monkeypatch, shape, limit):
    """Scores over the L2 budget are computed a leading batch index at a time (the budget made small
    here, so one or two axes are sliced): the same values as onnxruntime's, within 1e-5."""
    from mnntool.runtime.kernels.ops import attention
    monkeypatch.setattr(attention, "SLICE_BYTES", limit)
    shapes = SLICED[shape]
    _model(tmp_path / "a.onnx", True, False, shapes=shapes)
    api.convert(tmp_path / "a.onnx", tmp_path / "a.mnn")
    rng = np.random.RandomState(1)
    feeds = {n: rng.randn(*s).astype(np.float32) for n, s in zip("qkvm", shapes)}
    ref = ort.InferenceSession(str(tmp_path / "a.onnx")).run(None, feeds)[0]
    s = Session(api.load_graph(tmp_path / "a.mnn"))
    got = s.run(feeds)["y"]
    assert [st.op for st in s.plan.steps].count("FusedAttention") == 1
    assert attention.slice_depth((2, 3, 6, 9), (2, 3)) == (2 if limit < 3 * 6 * 9 * 4 else 1)
    np.testing.assert_allclose(got, ref, atol=1e-5)


def test_probabilities_read_elsewhere_are_not_fused(tmp_path):
    _model(tmp_path / "a.onnx", False, False, probs_out=True)
    api.convert(tmp_path / "a.onnx", tmp_path / "a.mnn")
    s = Session(api.load_graph(tmp_path / "a.mnn"))
    rng = np.random.RandomState(1)
    feeds = {n: rng.randn(*shape).astype(np.float32) for n, shape in
             (("q", (1, 2, 5, 8)), ("k", (1, 2, 7, 8)), ("v", (1, 2, 7, 4)))}
    out = s.run(feeds)
    assert "FusedAttention" not in [st.op for st in s.plan.steps]
    ref = ort.InferenceSession(str(tmp_path / "a.onnx")).run(None, feeds)
    np.testing.assert_allclose(out["y"], ref[0], atol=1e-5)
    np.testing.assert_allclose(out["p"], ref[1], atol=1e-6)



@pytest.mark.parametrize("mask", [False, True])
def test_scaled_q_and_k_are_taken_into_the_softmax(tmp_path, mask):
    """The dynamo exporter's attention scales q and k by 1/sqrt(sqrt(d)) each: without a mask the fused
    step takes both factors into its softmax, with one (which adds to the scaled scores) it scales the
    scores before the mask: no Mul step left either way. Reference: onnxruntime, max abs error 1e-5."""
    shapes = ((1, 3, 9, 16), (1, 3, 11, 16), (1, 3, 11, 8), (1, 1, 9, 11))
    nodes = [h.make_node("Mul", ["q", "sq"], ["qs"]), h.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             h.make_node("Mul", ["kt", "sk"], ["ks"]), h.make_node("MatMul", ["qs", "ks"], ["s"])]
    src = "s"
    if mask:
        nodes.append(h.make_node("Add", ["s", "m"], ["sm"]))
        src = "sm"
    nodes += [h.make_node("Softmax", [src], ["p"], axis=-1), h.make_node("MatMul", ["p", "v"], ["y"])]
    inputs = [h.make_tensor_value_info(n, TP.FLOAT, list(s)) for n, s in zip("qkv", shapes)]
    if mask:
        inputs.append(h.make_tensor_value_info("m", TP.FLOAT, list(shapes[3])))
    inits = [h.make_tensor("sq", TP.FLOAT, [], [0.5]), h.make_tensor("sk", TP.FLOAT, [1], [0.7])]
    _save(tmp_path / "a.onnx", nodes, inputs, [h.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    api.convert(tmp_path / "a.onnx", tmp_path / "a.mnn")
    rng = np.random.RandomState(1)
    feeds = {n: (rng.randn(*s) * 3).astype(np.float32) for n, s in zip("qkvm" if mask else "qkv", shapes)}
    ref = ort.InferenceSession(str(tmp_path / "a.onnx")).run(None, feeds)[0]
    s = Session(api.load_graph(tmp_path / "a.mnn"))
    got = s.run(feeds)["y"]
    ops = [st.op for st in s.plan.steps]
    assert ops.count("FusedAttention") == 1 and "BinaryOp" not in ops and "Program" not in ops, ops
    np.testing.assert_allclose(got, ref, atol=1e-5)


@pytest.mark.parametrize("mask", [False, True])
def test_head_split_transposes_are_read_as_views(tmp_path, mask):
    """BERT as the dynamo exporter writes it: q, k and v split into heads by Reshape + Transpose, k
    transposed again on a 3-D view (Reshape, Transpose, Reshape), q and k scaled, the heads merged by a
    Transpose after the attention. The fused step reads all of it as numpy views and writes through the
    merge's: no Permute step is left. Reference: onnxruntime, max abs error 1e-5."""
    s_, heads, d = 9, 4, 16
    shape4 = h.make_tensor("s4", TP.INT64, [4], [1, s_, heads, d])
    shape3 = h.make_tensor("s3", TP.INT64, [3], [heads, s_, d])
    shape4k = h.make_tensor("s4k", TP.INT64, [4], [1, heads, d, s_])
    merged = h.make_tensor("sm", TP.INT64, [3], [1, s_, heads * d])
    nodes = []
    for n in "qkv":
        nodes += [h.make_node("Reshape", [n, "s4"], [n + "4"]),
                  h.make_node("Transpose", [n + "4"], [n + "h"], perm=[0, 2, 1, 3])]
    nodes += [h.make_node("Reshape", ["kh", "s3"], ["k3"]), h.make_node("Transpose", ["k3"], ["k3t"], perm=[0, 2, 1]),
              h.make_node("Reshape", ["k3t", "s4k"], ["kt"]),
              h.make_node("Mul", ["qh", "sq"], ["qs"]), h.make_node("Mul", ["kt", "sq"], ["ks"]),
              h.make_node("MatMul", ["qs", "ks"], ["s"])]
    src = "s"
    if mask:
        nodes.append(h.make_node("Add", ["s", "m"], ["sm_"]))
        src = "sm_"
    nodes += [h.make_node("Softmax", [src], ["p"], axis=-1), h.make_node("MatMul", ["p", "vh"], ["o"]),
              h.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]), h.make_node("Reshape", ["ot", "sm"], ["y"])]
    inputs = [h.make_tensor_value_info(n, TP.FLOAT, [1, s_, heads * d]) for n in "qkv"]
    if mask:
        inputs.append(h.make_tensor_value_info("m", TP.FLOAT, [1, 1, 1, s_]))
    inits = [shape4, shape3, shape4k, merged, h.make_tensor("sq", TP.FLOAT, [], [0.5])]
    _save(tmp_path / "a.onnx", nodes, inputs, [h.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    api.convert(tmp_path / "a.onnx", tmp_path / "a.mnn")
    rng = np.random.RandomState(2)
    feeds = {n: rng.randn(1, s_, heads * d).astype(np.float32) for n in "qkv"}
    if mask:
        feeds["m"] = np.where(rng.rand(1, 1, 1, s_) < 0.3, -1e4, 0).astype(np.float32)
    ref = ort.InferenceSession(str(tmp_path / "a.onnx")).run(None, feeds)[0]
    s = Session(api.load_graph(tmp_path / "a.mnn"))
    got = s.run(feeds)["y"]
    ops = [st.op for st in s.plan.steps]
    assert ops.count("FusedAttention") == 1 and "Permute" not in ops, ops
    np.testing.assert_allclose(got, ref, atol=1e-5)
    again = s.run({k: v * 0.5 for k, v in feeds.items()})["y"]     # the views follow the buffers' new contents
    ref2 = ort.InferenceSession(str(tmp_path / "a.onnx")).run(None, {k: v * 0.5 for k, v in feeds.items()})[0]
    np.testing.assert_allclose(again, ref2, atol=1e-5)


SMALL_PATH = {      # q, k, v, mask: run by small_attention's compiled loops
    "gpt2-like causal": ((1, 4, 16, 16), (1, 4, 16, 16), (1, 4, 16, 16), (1, 1, 16, 16)),
    "rows not in fours, keys past 16": ((2, 3, 5, 16), (2, 3, 21, 16), (2, 3, 21, 32), (2, 1, 1, 21)),
    "shared k and v, mask per head": ((2, 3, 6, 32), (1, 3, 9, 32), (2, 1, 9, 16), (2, 3, 6, 9)),
    "one key": ((1, 2, 3, 16), (1, 2, 1, 16), (1, 2, 1, 16), (1, 1, 3, 1)),
    "dims of 20 and 24": ((2, 2, 7, 20), (2, 2, 18, 20), (2, 2, 18, 24), (1, 1, 7, 18)),
    "mobilevit-like, large": ((4, 4, 256, 16), (4, 4, 256, 16), (4, 4, 256, 16), (1, 1, 256, 256)),
}


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", list(SMALL_PATH))
@pytest.mark.parametrize("mask,guard", [(False, False), (True, True)])
def test_small_attention_matches_onnxruntime(tmp_path, monkeypatch, shape, mask, guard, threads):
    """Heads of few dims, or small ones, run as one compiled call (kernels/small_attention.py, AVX-512
    hosts; at 2 threads the large one spreads its heads over them); the NumPy products (its thresholds
    set to 0) give the same values. Rows fully masked, rows not in blocks of four, keys over one 16-lane
    block, dims not a multiple of 16, broadcast k, v and masks. Reference: onnxruntime, max abs error
    1e-5."""
    from mnntool.runtime.kernels.ops import attention
    from mnntool.runtime.kernels.micro.llvm_ir import host_has
    shapes = SMALL_PATH[shape]
    _model(tmp_path / "a.onnx", mask, guard, shapes=shapes)
    api.convert(tmp_path / "a.onnx", tmp_path / "a.mnn")
    g = api.load_graph(tmp_path / "a.mnn")
    rng = np.random.RandomState(3)
    feeds = {n: rng.randn(*s).astype(np.float32) for n, s in zip("qkv", shapes)}
    if mask:
        lq, lk = shapes[3][-2:]
        causal = np.triu(np.full((lq, lk), -np.inf), 1) if lq == lk else np.zeros((lq, lk))
        m = np.broadcast_to(causal, shapes[3]) + np.where(rng.rand(*shapes[3]) < 0.2, -np.inf, 0)
        m.reshape(-1, lk)[0] = -np.inf        # a row with every key masked: NaN, 0 after the guard
        feeds["m"] = m.astype(np.float32)
    ref = ort.InferenceSession(str(tmp_path / "a.onnx")).run(None, feeds)[0]
    taken = []
    real = attention.geometry
    monkeypatch.setattr(attention, "geometry", lambda *a: taken.append(real(*a)) or taken[-1])
    got = Session(g, threads=threads).run(feeds)["y"]
    np.testing.assert_allclose(got, ref, atol=1e-5)
    assert not guard or not np.isnan(got).any()
    if host_has("avx512f"):
        assert taken and taken[0] is not None, "the compiled loops ran"
    monkeypatch.setattr(attention, "SMALL_ATTENTION_MAX_WORK", 0)
    monkeypatch.setattr(attention, "SMALL_ATTENTION_MAX_DIM", 0)
    np.testing.assert_allclose(Session(g, threads=threads).run(feeds)["y"], ref, atol=1e-5)
    assert len(taken) <= 1, "NumPy's products ran"
