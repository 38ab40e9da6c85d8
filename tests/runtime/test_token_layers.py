"""What transformer-style models spend their time on outside the big GEMMs, against onnxruntime on the
same ONNX model (or NumPy where the case is written into the .mnn graph):

- BatchNorm1d over tokens ((tokens, C): one value a channel) and with few values a channel, a ReLU after
  it fused (ops/scale.py's scale_cols), and after a linear layer folded into it (plan/fuse_linear_scale.py):
  abs and relative error 1e-5;
- Permutes that are batched 2-D transposes (micro/transpose.py, register blocks): exactly equal;
- attention whose scores are scaled by a constant before a bias (LeViT) or the softmax, fused
  (plan/fuse_attention.py): abs error 1e-5; a negative factor is left to the ops (still equal);
- a MatMul reading a constant through a transpose (a tied LM head) reads the constant
  (plan/fuse_transposed_weights.py): abs and relative error 1e-5 against NumPy, and not where the
  transpose has another reader."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from mnntool import api
from mnntool.ir.graph import Node
from mnntool.runtime.kernels.micro.transpose import as_batched_transpose
from mnntool.runtime.session import Session

ort = pytest.importorskip("onnxruntime")


def _run_both(tmp_path, nodes, inputs, inits, out_shape=None, threads=1):
    """(mnntool's outputs, onnxruntime's, the plan's step ops) for a one-output ONNX graph."""
    rng = np.random.default_rng(0)
    vi = [h.make_tensor_value_info(n, TP.FLOAT, list(s)) for n, s in inputs.items()]
    m = h.make_model(h.make_graph(nodes, "g", vi, [h.make_tensor_value_info("y", TP.FLOAT, out_shape)], inits),
                     opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "m.onnx"))
    api.convert(tmp_path / "m.onnx", tmp_path / "m.mnn")
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in inputs.items()}
    ref = ort.InferenceSession(str(tmp_path / "m.onnx")).run(None, feeds)[0]
    s = Session(api.load_graph(tmp_path / "m.mnn"), threads=threads)
    got = s.run(feeds)["y"]
    return got, ref, [st.op for st in s.plan.steps]


def _const(rng, name, *shape, s=0.5):
    return nh.from_array((rng.standard_normal(shape) * s).astype(np.float32), name)


@pytest.mark.parametrize("linear", [False, True])
@pytest.mark.parametrize("shape,relu", [((196, 64), False), ((50, 24, 3), True), ((7, 16, 1), False)])
def test_batchnorm_over_tokens(tmp_path, shape, relu, linear):
    """On its own a Scale step (scale_cols); after a linear layer folded into its weights (fuse_linear_scale)."""
    rng = np.random.default_rng(1)
    c = shape[1]
    inits = [_const(rng, "w", c, c), nh.from_array((rng.random(c) + 0.5).astype(np.float32), "g"),
             _const(rng, "b", c), _const(rng, "mu", c), nh.from_array((rng.random(c) + 0.5).astype(np.float32), "var")]
    perm = [0] + list(range(2, len(shape))) + [1]
    back = [0, len(shape) - 1] + list(range(1, len(shape) - 1))
    nodes = [h.make_node("Transpose", ["x"], ["xt"], perm=perm), h.make_node("MatMul", ["xt", "w"], ["lin"]),
             h.make_node("Transpose", ["lin"], ["lt"], perm=back)] if linear else \
        [h.make_node("Relu", ["x"], ["lt"])]
    nodes.append(h.make_node("BatchNormalization", ["lt", "g", "b", "mu", "var"], ["bn" if relu else "y"]))
    if relu:
        nodes.append(h.make_node("Relu", ["bn"], ["y"]))
    got, ref, ops = _run_both(tmp_path, nodes, {"x": shape}, inits)
    assert ("Scale" in ops) == (not linear or len(shape) > 2)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape,perm", [((1, 196, 64), (0, 2, 1)), ((1, 32, 14, 14), (0, 2, 3, 1)),
                                        ((2, 37, 21), (0, 2, 1)), ((3, 5, 9, 17), (0, 3, 1, 2)),
                                        ((40, 1, 24), (2, 1, 0)), ((2, 3, 4), (1, 0, 2))])
def test_permutes_as_block_transposes(tmp_path, shape, perm):
    out = tuple(shape[p] for p in perm)
    got, ref, _ = _run_both(tmp_path, [h.make_node("Transpose", ["x"], ["y"], perm=list(perm))], {"x": shape}, [], out)
    np.testing.assert_array_equal(got, ref)


def test_block_transpose_on_threads(tmp_path):
    """Large enough for the parallel kernel at 2 threads (row blocks spread over the threads)."""
    node = h.make_node("Transpose", ["x"], ["y"], perm=[0, 2, 1])
    got, ref, _ = _run_both(tmp_path, [node], {"x": (2, 520, 300)}, [], (2, 300, 520), threads=2)
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("shape", [(8, 48, 196), (3, 37, 150), (1, 8, 65), (2, 130, 8)])
def test_block_transpose_items_of_row_blocks_and_column_groups(shape, three_threads):
    """transpose_blocks' parallel items are BLOCK rows by COL_GROUP columns (few row blocks still spread over
    the threads): every element moved once, at 3 threads and in the serial twin, exact against NumPy."""
    from mnntool.runtime.kernels.micro.transpose import transpose_blocks
    x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
    for fn in (transpose_blocks.dispatcher(), transpose_blocks.serial().dispatcher()):
        out = np.full((shape[0], shape[2], shape[1]), np.nan, np.float32)
        fn(x, out)
        np.testing.assert_array_equal(out, x.transpose(0, 2, 1))


def test_batched_transpose_shapes():
    assert as_batched_transpose((1, 3136, 256), (0, 2, 1)) == (1, 3136, 256)
    assert as_batched_transpose((1, 32, 56, 56), (0, 2, 3, 1)) == (1, 32, 3136)
    assert as_batched_transpose((2, 3, 4, 5), (0, 3, 1, 2)) == (2, 12, 5)
    assert as_batched_transpose((1, 196, 4, 16), (0, 2, 1, 3)) is None     # the last axis stays: runs of 16
    assert as_batched_transpose((2, 3, 4), (0, 1, 2)) is None


@pytest.mark.parametrize("factor,bias", [(0.25, True), (0.125, False), (-0.5, True)])
def test_attention_with_scaled_scores(tmp_path, factor, bias):
    """LeViT: softmax(q k^T * scale + attention biases) v, 4 heads of 49 tokens, keys of 16, values of 32."""
    rng = np.random.default_rng(2)
    inits = [nh.from_array(np.array(factor, np.float32), "c")] + ([_const(rng, "ab", 4, 49, 49)] if bias else [])
    nodes = [h.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]), h.make_node("MatMul", ["q", "kt"], ["s"]),
             h.make_node("Mul", ["s", "c"], ["sc"])]
    if bias:
        nodes.append(h.make_node("Add", ["sc", "ab"], ["sb"]))
    nodes += [h.make_node("Softmax", ["sb" if bias else "sc"], ["p"], axis=-1),
              h.make_node("MatMul", ["p", "v"], ["y"])]
    got, ref, ops = _run_both(tmp_path, nodes, {"q": (1, 4, 49, 16), "k": (1, 4, 49, 16), "v": (1, 4, 49, 32)}, inits)
    assert ("FusedAttention" in ops) == (factor > 0)
    np.testing.assert_allclose(got, ref, atol=1e-5)


def _head_graph(tmp_path, shared: bool):
    """An embedding (Gather) and a head reading the same table through its transpose, written into the
    .mnn graph (the converter folds the transpose of a table this small); with `shared`, a second reader
    of the transposed table that is not a MatMul."""
    rng = np.random.default_rng(3)
    table = (rng.standard_normal((40, 24)) * 0.5).astype(np.float32)
    nodes = [h.make_node("Gather", ["table", "ids"], ["y"], axis=0)]
    m = h.make_model(h.make_graph(nodes, "g", [h.make_tensor_value_info("ids", TP.INT64, [1, 9])],
                                  [h.make_tensor_value_info("y", TP.FLOAT, None)], [nh.from_array(table, "table")]),
                     opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "e.onnx"))
    api.convert(tmp_path / "e.onnx", tmp_path / "e.mnn")
    g = api.load_graph(tmp_path / "e.mnn")
    g.nodes += [Node("Permute", ["table"], ["table_t"], "head_t", {"dims": [1, 0]}),
                Node("MatMul", ["y", "table_t"], ["logits"], "head", {"transposeA": False, "transposeB": False})]
    g.outputs.append("logits")
    if shared:
        g.nodes.append(Node("UnaryOp", ["table_t"], ["neg_t"], "neg", {"opType": "NEG"}))
        g.outputs.append("neg_t")
    return g, table


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("threads", [1, 2])
def test_head_reads_the_table_itself(tmp_path, shared, threads):
    g, table = _head_graph(tmp_path, shared)
    ids = np.array([[0, 5, 39, 7, 7, 12, 1, 30, 2]], np.int64)
    s = Session(g, threads=threads)
    got = s.run({"ids": ids})
    emb = table[ids]
    np.testing.assert_allclose(got["y"], emb, rtol=1e-6)
    np.testing.assert_allclose(got["logits"], emb @ table.T, rtol=1e-5, atol=1e-5)
    permutes = [st for st in s.plan.steps if st.op == "Permute"]
    assert bool(permutes) == shared
    if shared:
        np.testing.assert_array_equal(got["neg_t"], -table.T)
