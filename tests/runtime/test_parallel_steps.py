"""The parallel twins of the NumPy steps (kernels/ops/parallel_steps.py, micro/parallel_rows.py): a
Permute, StridedSlices (a step of 2, a negative step), a Concat, broadcast Mul/Add/Div, a LeakyReLU, a SUM
over a middle axis, a constant Pad split by rows and a LayerNorm over one long row, run at 1, 2 and 3
threads with every size made to pay for threads (MNNTOOL_PARALLEL_MIN_WORK=0). At 2 and 3 threads each
output is bit-identical to the one-thread run (the same IEEE operations in the same order; the LayerNorm's
sums in blocks fixed whatever the thread count), and the one-thread run matches onnxruntime: exactly for
the copies, 1e-6 relative for the arithmetic (float32, one rounding an element), 1e-5 absolute for the
LayerNorm (float32 output of float64 sums over 40,000 elements)."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from mnntool import api
from mnntool.runtime.kernels.micro import parallel_rows as pr
from mnntool.runtime.kernels.ops import parallel_steps
from mnntool.runtime.session import Session

ort = pytest.importorskip("onnxruntime")

INPUTS = {"x": (1, 97, 3, 4, 8), "a": (1, 2, 6, 9, 9), "s": (1, 2, 6, 1, 1), "p": (5, 1, 7), "q": (1, 6, 1),
          "r": (2, 8, 9, 9), "u": (1, 3, 6, 7, 7), "w": (1, 1, 40000), "v": (1, 3, 20, 30)}
EXACT = ("t", "sl", "neg", "cat", "lk", "pad")


def _model(path):
    ints = lambda name, v: nh.from_array(np.array(v, np.int64), name)     # noqa: E731
    rng = np.random.default_rng(3)
    inits = [ints("st", [1]), ints("en", [97]), ints("ax", [3]), ints("two", [2]), ints("st2", [-1]),
             ints("en2", [-1000]), ints("m2", [-2]), ints("ax1", [1]),
             nh.from_array(np.array(0.37, np.float32), "k"), ints("pads", [0, 0, 1, 2, 0, 0, 3, 1]),
             nh.from_array(np.array(0.5, np.float32), "pv"),
             nh.from_array(rng.standard_normal(40000).astype(np.float32), "g"),
             nh.from_array(rng.standard_normal(40000).astype(np.float32), "b")]
    nodes = [h.make_node("Transpose", ["x"], ["t"], perm=[2, 0, 3, 1, 4]),
             h.make_node("Slice", ["t", "st", "en", "ax", "two"], ["sl"]),
             h.make_node("Slice", ["t", "st2", "en2", "ax", "m2"], ["neg"]),
             h.make_node("Concat", ["sl", "neg"], ["cat"], axis=3),
             h.make_node("Mul", ["a", "s"], ["mul"]),
             h.make_node("Add", ["a", "k"], ["addk"]),
             h.make_node("Div", ["p", "q"], ["div"]),
             h.make_node("LeakyRelu", ["r"], ["lk"], alpha=0.01),
             h.make_node("ReduceSum", ["u", "ax1"], ["sum"], keepdims=0),
             h.make_node("LayerNormalization", ["w", "g", "b"], ["ln"], axis=-1, epsilon=1e-5),
             h.make_node("Pad", ["v", "pads", "pv"], ["pad"])]
    outs = ["t", "sl", "neg", "cat", "mul", "addk", "div", "lk", "sum", "ln", "pad"]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info(k, TP.FLOAT, list(v)) for k, v in INPUTS.items()],
                     [h.make_tensor_value_info(o, TP.FLOAT, None) for o in outs], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return outs


def test_parallel_steps_are_bit_identical_to_one_thread_and_match_onnxruntime(tmp_path, monkeypatch):
    monkeypatch.setenv("MNNTOOL_PARALLEL_MIN_WORK", "0")
    monkeypatch.setenv("MNNTOOL_ONE_THREAD_BELOW_FLOPS", "0")
    chosen = []
    real = parallel_steps.pays
    monkeypatch.setattr(parallel_steps, "pays", lambda w, t: chosen.append(t) or real(w, t))
    outs = _model(tmp_path / "m.onnx")
    api.convert(tmp_path / "m.onnx", tmp_path / "m.mnn")
    rng = np.random.default_rng(0)
    feeds = {k: rng.standard_normal(v).astype(np.float32) for k, v in INPUTS.items()}
    feeds["r"].reshape(-1)[:3] = [np.nan, -0.0, -np.inf]
    feeds["q"].reshape(-1)[0] = 0.0          # x / 0: inf, as NumPy and onnxruntime give
    graph = api.load_graph(tmp_path / "m.mnn")
    ops = {n.op for n in graph.nodes}
    assert {"Permute", "StridedSlice", "Concat", "BinaryOp", "ReLU", "Reduction", "LayerNorm", "Padding"} <= ops, ops
    got = {}
    for threads in (1, 2, 3):
        chosen.clear()
        s = Session(graph, threads=threads)
        for _ in range(2):
            with np.errstate(divide="ignore"):
                got[threads] = {k: np.array(v) for k, v in s.run(feeds).items()}
        if threads > 1:     # every kind above asked (Permute, slices, Concat, Mul, Add, Div, LeakyReLU, SUM, Pad;
            # the session's count: 3 is the host's cores where it has fewer, chunks of 3 are the test below)
            assert sum(t > 1 for t in chosen) >= 9, chosen
    for threads in (2, 3):
        for o in outs:
            assert np.array_equal(got[threads][o].view(np.uint32), got[1][o].view(np.uint32)), (threads, o)
    with np.errstate(all="ignore"):
        want = dict(zip(outs, ort.InferenceSession(str(tmp_path / "m.onnx")).run(None, feeds)))
    for o in outs:
        if o in EXACT:
            assert np.array_equal(got[1][o], want[o], equal_nan=True), o
        elif o == "ln":
            np.testing.assert_allclose(got[1][o], want[o], rtol=0, atol=1e-5)
        else:
            np.testing.assert_allclose(got[1][o], want[o], rtol=1e-6, atol=0, err_msg=o)


@pytest.mark.parametrize("perm", [(0, 2, 1, 3), (0, 1, 3, 2)])
@pytest.mark.parametrize("shape,chunks", [((1, 1, 1, 5), 3), ((2, 3, 5, 37), 4), ((1, 1, 7, 1000), 3),
                                          ((1, 1, 2, 3), 4)])
def test_copy_strided_chunks_cover_the_output_once(shape, chunks, perm):
    """The kernel alone: every output element written once from its source, in whole rows (many rows) and
    in runs of elements (few rows: chunk edges inside rows, past the end, more chunks than 16-element
    pieces), rows of unit stride and (the last axis moved) strided ones."""
    src = np.arange(int(np.prod(shape)), dtype=np.uint32)
    st = pr.c_strides(shape)
    out_shape = [shape[a] for a in perm]
    dims, (ss, ds) = pr.merge_axes(out_shape, [[st[a] for a in perm], pr.c_strides(out_shape)])
    dst = np.full(src.size, 0xFFFFFFFF, np.uint32)
    pr.copy_strided(src, pr.geometry(0, ss), dst, pr.geometry(0, ds), np.array(dims, np.int64), chunks)
    assert np.array_equal(dst.reshape(out_shape), src.reshape(shape).transpose(perm))


def test_copies_of_other_element_types_move_their_bits(monkeypatch):
    """A Permute, a StridedSlice and a Concat of 8-byte elements through the copy kernel (one kernel per
    element size: it moves bits), against NumPy exactly. (One size: each compiles ~8 s cold.)"""
    monkeypatch.setenv("MNNTOOL_PARALLEL_MIN_WORK", "0")
    dtype = np.int64
    x = (np.random.default_rng(5).standard_normal((2, 5, 3, 7)) * 100).astype(dtype)
    perm = (3, 0, 2, 1)
    y = np.empty([x.shape[a] for a in perm], dtype)
    parallel_steps.permute(x.shape, perm, dtype, 2)([x], [y])
    assert np.array_equal(y, x.transpose(perm))
    index = (slice(None), slice(4, 0, -2), 1)
    y = np.empty(x[index].shape, dtype)
    parallel_steps.strided_slice(x.shape, index, y.shape, dtype, 2)([x], [y])
    assert np.array_equal(y, x[index])
    y = np.empty((2, 10, 3, 7), dtype)
    parallel_steps.concat([x.shape, x.shape], 1, y.shape, dtype, 2)([x, x[::-1].copy()], [y])
    assert np.array_equal(y, np.concatenate([x, x[::-1]], axis=1))
