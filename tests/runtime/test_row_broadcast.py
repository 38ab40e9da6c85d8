"""BinaryOp with the second operand broadcast along the last axis ((..., n) op (..., 1): ops/elementwise
.by_row_value), against onnxruntime: add, sub, mul exact; div within 1 ulp-scale (1e-6 relative); a zero
divisor gives inf / nan as NumPy's and onnxruntime's division does."""
import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("shape", [(1, 8, 196, 16), (2, 5, 3), (4, 40000)])
def test_last_axis_broadcast_matches_onnxruntime(tmp_path, op, shape):
    import onnx
    from onnx import TensorProto as TP, helper as h

    from mnntool.api import convert, load_session
    # a Relu on the result: the op is an inner node (and MNN's converter may fuse the ReLU into it)
    g = h.make_graph([h.make_node(op, ["x", "s"], ["z"]), h.make_node("Relu", ["z"], ["y"])], "rows",
                     [h.make_tensor_value_info("x", TP.FLOAT, list(shape)),
                      h.make_tensor_value_info("s", TP.FLOAT, list(shape[:-1]) + [1])],
                     [h.make_tensor_value_info("y", TP.FLOAT, None)])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    onnx.save(m, tmp_path / "m.onnx")
    convert(tmp_path / "m.onnx", tmp_path / "m.mnn")
    rng = np.random.default_rng(len(shape))
    x = rng.standard_normal(shape).astype(np.float32)
    s = rng.standard_normal(shape[:-1] + (1,)).astype(np.float32)
    if op == "Div":
        s.reshape(-1)[:2] = 0.0       # x / 0: inf or nan (0 / 0 never here: x is not 0)
    feeds = {"x": x, "s": s}
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    sess = load_session(tmp_path / "m.mnn", threads=1)
    with np.errstate(all="ignore"):
        got = sess.run(feeds)["y"]
    fin = np.isfinite(ref)
    np.testing.assert_allclose(got[fin], ref[fin], rtol=1e-6, atol=0)
    assert np.array_equal(np.isposinf(got), np.isposinf(ref)) and np.array_equal(np.isnan(got), np.isnan(ref))
    assert any(s.op == "BinaryOp" and "_last_axis_broadcast" in getattr(s.kernel.fn, "__qualname__", "")
               for s in sess.plan.steps)


@pytest.mark.parametrize("kind", [0, 1, 2, 3])
def test_rows_of_a_strided_view_in_place(kind, three_threads):
    """by_row_value and clip_rows read x through parallel_rows.row_span: a split's view of the last axis
    (rows of 16 floats 48 apart, EfficientViT's attention output) in place, no copy. Bit for bit NumPy's
    broadcast ufunc (and np.maximum / np.clip), the parallel kernel at 3 threads and its serial twin alike."""
    from mnntool.runtime.kernels.micro.parallel_rows import row_span
    from mnntool.runtime.kernels.ops.elementwise import by_row_value, clip_rows
    rng = np.random.default_rng(kind)
    qkv = rng.standard_normal((1, 8, 196, 48)).astype(np.float32)
    x = qkv[..., 16:32]
    s = rng.standard_normal((1, 8, 196, 1)).astype(np.float32)
    rows = 8 * 196
    flat, step = row_span(x, rows, 16)
    assert step == 48 and np.shares_memory(flat, qkv)
    ufunc = [np.add, np.subtract, np.multiply, np.divide][kind]
    want = np.maximum(ufunc(x, s), 0).reshape(rows, 16)
    for fn in (by_row_value.dispatcher(), by_row_value.serial().dispatcher()):
        got = np.full((rows, 16), np.nan, np.float32)
        fn(flat, step, s.reshape(rows), kind, True, got)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    for fn in (clip_rows.dispatcher(), clip_rows.serial().dispatcher()):
        got = np.full((rows, 16), np.nan, np.float32)
        fn(flat, step, np.float32(-0.5), np.float32(0.75), got)
        assert np.array_equal(got, np.clip(x, -0.5, 0.75).reshape(rows, 16))
