"""StridedSlice with bounds known at prepare copies into its planned buffer (ops/tensor.strided_slice):
ONNX Slice with steps, negative steps, clamped ends and a subset of axes, against onnxruntime (exact, two
runs each: the second into the same buffers)."""
import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")


@pytest.mark.parametrize("starts, ends, axes, steps", [
    ([0, 16], [8, 32], [1, 3], [1, 1]),             # EfficientViT's q/k/v pieces of the last axis
    ([1, 0], [7, 100], [2, 3], [2, 3]),
    ([-1], [-100], [3], [-1]),                      # reversed
    ([2, 1, 0], [3, 6, 40], [1, 2, 3], [1, 2, 5]),
])
def test_strided_slice_matches_onnxruntime(tmp_path, starts, ends, axes, steps):
    import onnx
    from onnx import TensorProto as TP, helper as h, numpy_helper

    from mnntool.api import convert, load_session
    inits = [numpy_helper.from_array(np.array(v, np.int64), n) for v, n in
             ((starts, "st"), (ends, "en"), (axes, "ax"), (steps, "sp"))]
    g = h.make_graph([h.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["s"]), h.make_node("Relu", ["s"], ["y"])],
                     "slice", [h.make_tensor_value_info("x", TP.FLOAT, [1, 8, 9, 48])],
                     [h.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    onnx.save(m, tmp_path / "m.onnx")
    convert(tmp_path / "m.onnx", tmp_path / "m.mnn")
    sess = load_session(tmp_path / "m.mnn", threads=1)
    ref_sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for seed in (0, 1):
        x = np.random.default_rng(seed).standard_normal((1, 8, 9, 48)).astype(np.float32)
        np.testing.assert_array_equal(sess.run({"x": x})["y"], ref_sess.run(None, {"x": x})[0])
    kinds = {s.op: s.kernel.writes_out for s in sess.plan.steps if s.op in ("StridedSlice", "Slice")}
    assert kinds.get("StridedSlice", True)      # where the converter wrote a StridedSlice, it writes in place


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint8, np.bool_, np.float16])
@pytest.mark.parametrize("index", [(slice(None), slice(None), slice(0, 16)), (slice(None, None, -1), slice(1, 5, 2)),
                                   (slice(2, 3), slice(None), slice(40, 4, -3))])
def test_one_thread_copy_moves_the_bits(dtype, index):
    """At one thread a slice that is not a contiguous block copies with copy_strided's serial twin (rows as
    fixed-length loops, not NumPy's strided copy): every element type's bits, reversed and stepped axes, a
    second run into the same buffer; an input that is not C-contiguous takes NumPy's copy. Exact."""
    from mnntool.runtime.kernels.ops import parallel_steps
    shape = (3, 9, 48)
    x = (np.random.default_rng(0).standard_normal(shape) * 50).astype(dtype)
    want = x[index]
    run = parallel_steps.strided_slice(shape, index, want.shape, np.dtype(dtype), 1)
    assert run is not None
    for _ in range(2):
        out = np.zeros(want.shape, dtype)
        run([x], [out])
        assert np.array_equal(out.view(np.uint8), np.ascontiguousarray(want).view(np.uint8))
    xf = np.asfortranarray(x)
    out = np.zeros(want.shape, dtype)
    run([xf], [out])
    assert np.array_equal(out, want)
