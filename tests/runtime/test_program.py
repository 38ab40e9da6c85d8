"""Runs of small elementwise ops as one program (`kernels.ops.small_op_program`): every op `execute` has, scalar
broadcast, a fused ReLU, a Slice's pieces as ranges, programs split at five outside inputs and at an
op that is not theirs, and every tensor readable with keep_all. Reference: numpy in float64;
tolerance 1e-6 absolute on values of order 1."""
import numpy as np
import pytest

from mnntool.ir.graph import Graph, Node, TensorInfo
from mnntool.runtime.session import Session


def _graph(nodes, inputs, outputs, consts=None):
    g = Graph(nodes=nodes, inputs=[n for n, _ in inputs], outputs=outputs)
    for name, shape in inputs:
        g.tensors[name] = TensorInfo(name, "float32", shape)
    for name, value in (consts or {}).items():
        g.constants[name] = value
        g.tensors[name] = TensorInfo(name, str(value.dtype), value.shape)
    return g


def bop(kind, a, b, y, relu=0):
    return Node("BinaryOp", [a, b], [y], y, {"opType": kind, "activationType": relu})


def uop(kind, x, y):
    return Node("UnaryOp", [x], [y], y, {"opType": kind})


def test_every_op_and_the_splits_match_numpy():
    n = 48
    nodes = [bop("ADD", "a", "b", "s"),
             Node("Slice", ["s"], ["p", "q", "r"], "split", {"axis": 2, "slicePoints": [16, 32], "sourceType": "CAFFE"}),
             uop("SIGMOID", "p", "sp"), Node("Sigmoid", ["q"], ["sq"], "sq"), Node("TanH", ["r"], ["tr"], "tr"),
             uop("TANH", "q", "tq"), Node("ReLU", ["p"], ["rp"], "rp"), uop("NEG", "q", "nq"), uop("EXP", "sp", "ep"),
             uop("ABS", "r", "ar"), bop("SUB", "sp", "sq", "d"), bop("MUL", "d", "half", "m"),
             bop("REALDIV", "ep", "two", "dv"), bop("MAXIMUM", "tr", "nq", "mx"), bop("MINIMUM", "tq", "ar", "mn"),
             bop("ADD", "mx", "mn", "z", relu=1),
             # outside inputs: c, e, f, h with a, b above -> the program splits before five
             bop("ADD", "z", "c", "z1"), bop("ADD", "z1", "e", "z2"), bop("ADD", "z2", "f", "z3"), bop("ADD", "z3", "h", "z4"),
             Node("Concat", ["z4", "m"], ["cat"], "cat", {"axis": 2}),     # not a program op: a new run after it
             bop("MUL", "cat", "cat", "sq2"), uop("TANH", "sq2", "y")]
    shape = (1, 1, n)
    small = (1, 1, 16)
    consts = {"half": np.array([0.5], np.float32), "two": np.array(2.0, np.float32)}
    g = _graph(nodes, [("a", shape), ("b", shape), ("c", small), ("e", small), ("f", small), ("h", small)],
               ["y", "dv", "rp"], consts)
    rng = np.random.default_rng(0)
    feeds = {k: rng.standard_normal(v.shape).astype(np.float32) * 2 for k, v in g.tensors.items() if k in g.inputs}
    sess = Session(g, threads=1)
    got = sess.run(feeds, keep_all=True)
    assert [s.op for s in sess.plan.steps].count("Program") >= 3

    f = {k: v.astype(np.float64) for k, v in feeds.items()}
    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    s = f["a"] + f["b"]
    p, q, r = s[..., :16], s[..., 16:32], s[..., 32:]
    sp, sq, tr, tq = sig(p), sig(q), np.tanh(r), np.tanh(q)
    m = (sp - sq) * 0.5
    z = np.maximum(np.maximum(tr, -q) + np.minimum(tq, np.abs(r)), 0)
    z4 = z + f["c"] + f["e"] + f["f"] + f["h"]
    cat = np.concatenate([z4, m], axis=2)
    want = {"s": s, "p": p, "r": r, "sp": sp, "sq": sq, "rp": np.maximum(p, 0), "ep": np.exp(sp), "dv": np.exp(sp) / 2,
            "m": m, "z": z, "z4": z4, "cat": cat, "y": np.tanh(cat * cat)}
    for name, ref in want.items():
        np.testing.assert_allclose(got[name], ref, rtol=0, atol=1e-6, err_msg=name)
    again = sess.run(feeds)      # a second run reuses the arena and reloads the outside inputs
    np.testing.assert_allclose(again["y"], want["y"], rtol=0, atol=1e-6)


def test_programs_are_left_for_large_or_broadcast_tensors():
    """A (4, 1) + (1, 4) broadcast and a tensor past LIMIT keep their own kernels."""
    nodes = [bop("ADD", "a", "b", "s"), uop("TANH", "s", "t"), bop("MUL", "big", "big", "bb"), uop("NEG", "bb", "nb")]
    g = _graph(nodes, [("a", (4, 1)), ("b", (1, 4)), ("big", (200, 100))], ["t", "nb"])
    feeds = {"a": np.ones((4, 1), np.float32), "b": np.arange(4, dtype=np.float32)[None], "big": np.ones((200, 100), np.float32)}
    sess = Session(g, threads=1)
    got = sess.run(feeds)
    assert "Program" not in [s.op for s in sess.plan.steps]
    np.testing.assert_allclose(got["t"], np.tanh(1 + np.arange(4))[None].repeat(4, 0), atol=1e-6)
    np.testing.assert_array_equal(got["nb"], -np.ones((200, 100)))


def test_a_recurrent_step_runs_as_one_program():
    """An unrolled RNN's pieces: a time step's row of the inputs (a contiguous StridedSlice), the
    one-row MatMul with a constant (plain and transposeB, weights past 16 rows and with a tail of k),
    a constant initial state; a strided (non-contiguous) slice keeps its own kernel."""
    k, n = 37, 50
    rng = np.random.default_rng(1)
    w, wt = rng.standard_normal((k, n)).astype(np.float32), rng.standard_normal((n, n)).astype(np.float32)
    h0 = rng.standard_normal((1, 1, k)).astype(np.float32)
    i32 = lambda *v: np.array(v, np.int32)  # noqa: E731
    ss = {"fromType": 1}     # ONNX Slice semantics: starts, ends, axes
    nodes = [Node("StridedSlice", ["xs", "s1", "e1", "ax"], ["x1"], "x1", ss),
             Node("MatMul", ["h0", "w"], ["hw"], "hw", {}),
             bop("ADD", "x1", "hw", "g"), uop("TANH", "g", "h1"),
             Node("MatMul", ["h1", "wt"], ["hw2"], "hw2", {"transposeB": True}),
             Node("StridedSlice", ["xs", "s2", "e2", "ax"], ["x2"], "x2", ss),
             bop("ADD", "x2", "hw2", "g2"), Node("Sigmoid", ["g2"], ["y"], "y"),
             Node("StridedSlice", ["xs", "s0", "e0", "ax2"], ["cols"], "cols", {"fromType": 1})]
    consts = {"w": w, "wt": wt, "h0": h0, "s1": i32(0), "e1": i32(1), "s2": i32(1), "e2": i32(2), "ax": i32(0),
              "s0": i32(0), "e0": i32(3), "ax2": i32(2)}
    g = _graph(nodes, [("xs", (2, 1, n))], ["y", "h1", "cols"], consts)
    xs = rng.standard_normal((2, 1, n)).astype(np.float32)
    sess = Session(g, threads=1)
    got = sess.run({"xs": xs}, keep_all=True)
    ops = [s.op for s in sess.plan.steps]
    assert ops.count("Program") == 1 and "MatMul" not in ops and ops.count("StridedSlice") == 1
    h1 = np.tanh(xs[0:1].astype(np.float64) + h0 @ w.astype(np.float64))
    y = 1 / (1 + np.exp(-(xs[1:2] + h1 @ wt.T.astype(np.float64))))
    np.testing.assert_allclose(got["h1"], h1, rtol=0, atol=1e-6)
    np.testing.assert_allclose(got["y"], y, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(got["cols"], xs[:, :, :3])


def test_strided_views_load_by_rows():
    """EfficientViT's attention: q, k, v split off the last axis (views of rows 48 floats apart), then ReLU of q
    and k as one program: the program reads the views' rows in place (no copy of each by NumPy), kept while
    the planner hands the same views, and a second run reads the new values. Exact (a ReLU and an add)."""
    nodes = [bop("MUL", "x", "one", "qkv"),      # (a program op of its own would take the split in: a big one)
             Node("Slice", ["qkv"], ["q", "k", "v"], "split", {"axis": 3, "slicePoints": [16, 32], "sourceType": "CAFFE"}),
             Node("ReLU", ["q"], ["rq"], "rq"), Node("ReLU", ["k"], ["rk"], "rk"), bop("ADD", "rq", "rk", "y")]
    shape = (1, 4, 49, 48)
    g = _graph(nodes, [("x", shape)], ["y", "v"], {"one": np.ones(shape, np.float32)})
    sess = Session(g, threads=1)
    rng = np.random.default_rng(2)
    for _ in range(2):
        x = rng.standard_normal(shape).astype(np.float32)
        got = sess.run({"x": x})
        np.testing.assert_array_equal(got["y"], np.maximum(x[..., :16], 0) + np.maximum(x[..., 16:32], 0))
    prog_steps = [s for s in sess.plan.steps if s.op == "Program"]
    assert len(prog_steps) == 1
    # the layout: rows of 16 floats 48 apart, from the view's first element; two strides: copied (None)
    from mnntool.runtime.kernels.micro.parallel_rows import row_span
    base = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    flat, step = row_span(base[..., 16:32], 4 * 49, 16)
    assert step == 48 and flat[0] == 16 and flat.size == (4 * 49 - 1) * 48 + 16 and flat.flags.c_contiguous
    assert row_span(base[:, :, ::2, :16], 4 * 25, 16) is None and row_span(base.astype(np.float64), 4 * 49, 48) is None
    assert row_span(base, 4 * 49, 48)[1] == 48


@pytest.mark.parametrize("between", ["Identity", "Dropout"])
def test_a_program_reads_its_own_output_through_a_planned_name(tmp_path, between):
    """Relu -> Identity -> Relu (the ONNX frontend's graph, before the passes that drop the Identity): the Identity is planned as another name of the first Relu's slot (no step), and
    the two Relus run as one Program, which must read the first's result from its arena rather than load that
    slot (still empty) as an input. Against onnxruntime, exact (max(0, x) twice)."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto as TP, helper as oh
    from mnntool.frontends.onnx import load_onnx
    nodes = [oh.make_node("Relu", ["x"], ["a"]), oh.make_node(between, ["a"], ["b"]), oh.make_node("Relu", ["b"], ["c"]),
             oh.make_node("Identity", ["c"], ["y"])]
    g = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("x", TP.FLOAT, [1, 1, 6, 6])],
                      [oh.make_tensor_value_info("y", TP.FLOAT, None)])
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "m.onnx"))
    x = np.random.default_rng(0).standard_normal((1, 1, 6, 6)).astype(np.float32)
    s = Session(load_onnx(tmp_path / "m.onnx", {}))     # the frontend's graph, the Identity kept (no passes)
    got = s.run({"x": x})["y"]
    assert "Program" in [st.op for st in s.plan.steps]
    np.testing.assert_array_equal(got, ort.InferenceSession(str(tmp_path / "m.onnx")).run(None, {"x": x})[0])
