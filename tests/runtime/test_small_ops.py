"""The cheap paths for tiny tensors (an unrolled LSTM's gates) and the cache-line alignment of the
runtime's buffers. Reference: numpy in float64; tolerance 1e-6 absolute on values of order 1."""
import numpy as np
import pytest

from mnntool.ir.graph import Graph, Node, TensorInfo
from mnntool.runtime.kernels import CACHE_LINE, aligned_empty, scratch
from mnntool.runtime.kernels.ops.elementwise import SMALL, sigmoid_flat
from mnntool.runtime.kernels.micro.float_gemm import pack_weights
from mnntool.runtime.session import Session


def _graph(nodes, inputs, outputs):
    g = Graph(nodes=nodes, inputs=[n for n, _ in inputs], outputs=outputs)
    for name, shape in inputs:
        g.tensors[name] = TensorInfo(name, "float32", shape)
    return g


def test_sigmoid_is_stable_and_exact_over_the_float_range():
    x = np.concatenate([np.linspace(-100, 100, 2001), [-1e30, 1e30, -88.7, 88.7, 0.0]]).astype(np.float32)
    out = np.empty_like(x)
    sigmoid_flat(x, out)
    with np.errstate(over="ignore"):
        ref = 1 / (1 + np.exp(-x.astype(np.float64)))
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-6)


@pytest.mark.parametrize("size", [64, SMALL - 1, SMALL, 3 * SMALL])
@pytest.mark.parametrize("relu", [0, 1])
def test_lstm_like_gate_chain(size, relu):
    """Add (MNN's fused ReLU as activationType), a four-way split along the last axis, sigmoid on a
    piece that is a view, and a multiply: both sides of the small/large Add threshold."""
    four = 4 * (size // 4)
    nodes = [Node("BinaryOp", ["a", "b"], ["s"], "add", {"opType": "ADD", "activationType": relu}),
             Node("Slice", ["s"], ["i", "f", "g", "o"], "split",
                  {"axis": 2, "slicePoints": [size // 4, 2 * (size // 4), 3 * (size // 4)], "sourceType": "CAFFE"}),
             Node("Sigmoid", ["f"], ["sf"], "sig"),
             Node("UnaryOp", ["i"], ["si"], "sig2", {"opType": "SIGMOID"}),
             Node("BinaryOp", ["sf", "si"], ["y"], "mul", {"opType": "MUL"})]
    g = _graph(nodes, [("a", (1, 2, four)), ("b", (1, 2, four))], ["y", "o"])
    rng = np.random.default_rng(size + relu)
    a, b = (rng.standard_normal((1, 2, four)).astype(np.float32) * 4 for _ in range(2))
    got = Session(g, threads=1).run({"a": a, "b": b})
    s = a.astype(np.float64) + b
    if relu:
        s = np.maximum(s, 0)
    q = four // 4
    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    np.testing.assert_allclose(got["y"], sig(s[..., q:2 * q]) * sig(s[..., :q]), rtol=0, atol=1e-6)
    np.testing.assert_allclose(got["o"], s[..., 3 * q:], rtol=0, atol=1e-6)


def test_uneven_split_on_a_middle_axis():
    nodes = [Node("Slice", ["x"], ["p", "q", "r"], "split", {"axis": 1, "slicePoints": [1, 4], "sourceType": "CAFFE"})]
    g = _graph(nodes, [("x", (2, 6, 3))], ["p", "q", "r"])
    x = np.arange(36, dtype=np.float32).reshape(2, 6, 3)
    got = Session(g, threads=1).run({"x": x})
    for name, ref in zip("pqr", np.split(x, [1, 4], axis=1)):
        np.testing.assert_array_equal(got[name], ref)


def test_buffers_start_on_a_cache_line():
    for count, dtype in [(1, np.float32), (1001, np.float32), (77, np.uint8), (5, np.int64)]:
        a = aligned_empty(count, dtype)
        assert a.ctypes.data % CACHE_LINE == 0 and a.size == count and a.dtype == dtype
    assert scratch("test_alignment", (3, 17)).ctypes.data % CACHE_LINE == 0
    w = np.arange(30, dtype=np.float32).reshape(5, 6)
    packed = pack_weights(w)
    assert packed.ctypes.data % CACHE_LINE == 0
    np.testing.assert_array_equal(packed.reshape(1, 6, 8)[0, :, :5], w.T)
    nodes = [Node("BinaryOp", ["a", "a"], ["s"], "add", {"opType": "ADD"}),
             Node("BinaryOp", ["s", "a"], ["y"], "mul", {"opType": "MUL"})]
    # past kernels.ops.small_op_program's LIMIT, so the adds get pool buffers of their own
    sess = Session(_graph(nodes, [("a", (3, 50, 170))], ["y"]), threads=1)
    plan = sess.prepare({"a": (3, 50, 170)})
    views = [v for s in plan.steps for v in s.out_views]
    assert views and all(v.ctypes.data % CACHE_LINE == 0 for v in views)


@pytest.mark.parametrize("op", ["ERF", "GELU_STANDARD"])
@pytest.mark.parametrize("shape,threads", [((3, 5), 1), ((2, 128, 1024), 1), ((2, 128, 1024), 2)])
def test_erf_and_gelu_against_math_erf(op, shape, threads):
    """The exp-free erf: 5e-7 absolute for erf, 5e-7 x max(1, |x|) for GELU (float32 rounding of x/2)."""
    import math
    g = _graph([Node("UnaryOp", ["x"], ["y"], "u", {"opType": op})], [("x", shape)], ["y"])
    rng = np.random.default_rng(len(shape))
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    x.reshape(-1)[:6] = [0.0, -0.0, 30.0, -30.0, 4.0, -4.0]
    got = Session(g, threads=threads).run({"x": x})["y"]
    xd = x.astype(np.float64)
    erf = np.vectorize(math.erf)
    ref = erf(xd) if op == "ERF" else 0.5 * xd * (1 + erf(xd / math.sqrt(2)))
    np.testing.assert_allclose(got, ref, rtol=0, atol=5e-7 * max(1.0, float(np.abs(xd).max())) if op != "ERF" else 5e-7)


@pytest.mark.parametrize("shape,axis", [((2, 4, 16, 128), -1), ((3, 7), 1), ((5, 1), -1), ((2, 6, 5), 1)])
def test_softmax_matches_float64(shape, axis):
    """The last axis takes the one-pass-per-step Numba kernel (its own exp), other axes NumPy; scores
    include a row max far above the rest (exp of -200 underflows to the floor) and large spreads.
    Tolerance: 1e-6 absolute on probabilities."""
    nodes = [Node("Softmax", ["x"], ["y"], "sm", {"axis": axis})]
    g = _graph(nodes, [("x", shape)], ["y"])
    rng = np.random.default_rng(len(shape))
    x = (rng.standard_normal(shape) * 10).astype(np.float32)
    x.reshape(-1)[:2] = [90.0, -200.0]
    got = Session(g, threads=2).run({"x": x})["y"]
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=axis, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(axis=axis, keepdims=True), rtol=0, atol=1e-6)


@pytest.mark.parametrize("rms", [False, True])
@pytest.mark.parametrize("affine", [False, True])
@pytest.mark.parametrize("shape", [(1, 128, 256), (3, 5, 7)])
def test_layer_norm_rows_match_float64(shape, affine, rms):
    """LayerNorm over the last axis (the Numba row kernel), on rows with a mean of 1000 and unit spread
    (float32 one-pass sums would lose the variance). Tolerance: 2e-4 absolute on values of order 1
    (float32 inputs at 1000 carry 6e-5)."""
    n = shape[-1]
    rng = np.random.default_rng(n)
    param = {"axis": [-1], "epsilon": 1e-5, "useRMSNorm": rms}
    gamma, beta = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    if affine:
        param.update(gamma=gamma, beta=beta)
    g = _graph([Node("LayerNorm", ["x"], ["y"], "ln", param)], [("x", shape)], ["y"])
    x = (1000 + rng.standard_normal(shape)).astype(np.float32)
    got = Session(g, threads=2).run({"x": x})["y"]
    x64 = x.astype(np.float64)
    if rms:
        ref = x64 / np.sqrt(np.mean(x64 ** 2, axis=-1, keepdims=True) + 1e-5)
    else:
        d = x64 - x64.mean(axis=-1, keepdims=True)
        ref = d / np.sqrt(np.mean(d ** 2, axis=-1, keepdims=True) + 1e-5)
    if affine:
        ref = ref * gamma + beta
    np.testing.assert_allclose(got, ref, rtol=0, atol=2e-4)


@pytest.mark.parametrize("e", [2.0, 3.0, 0.5, 1.7])
def test_power_by_a_constant(e):
    """x ** 2, x ** 3 and x ** 0.5 as products or a square root, any other exponent as numpy's power;
    reference float64 pow, within rtol 5e-7 (x*x*x rounds twice; float32 pow is within 4e-7)."""
    g = _graph([Node("BinaryOp", ["x", "e"], ["y"], "pow", {"opType": "POW"})], [("x", (64, 256))], ["y"])
    g.constants["e"] = np.array(e, np.float32)
    x = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32) * 3
    if e % 1:
        x = np.abs(x)
    out = Session(g, threads=1).run({"x": x})["y"]
    ref = np.power(x.astype(np.float64), e)
    np.testing.assert_allclose(out, ref, rtol=5e-7, atol=0)


@pytest.mark.parametrize("scale", [1.0, 0.125])
@pytest.mark.parametrize("n", [1, 15, 16, 17, 33, 256])
def test_row_softmax_kernels_agree_with_float64(n, scale):
    """Both row kernels (the IR one where the host has AVX-512, and the Numba loops) give softmax(scale *
    x) (attention's 1/sqrt(d) taken in): masked tails of any length, a row of -inf (NaN, as exp(x - max)
    / sum gives) and half-masked rows. Tolerance: 3e-6 relative (float32 sums of up to 256 terms)."""
    from mnntool.runtime.kernels.micro.llvm_ir import host_has
    from mnntool.runtime.kernels.ops.norm import softmax_rows
    kernels = [softmax_rows]
    if host_has("avx512f"):
        from mnntool.runtime.kernels.micro.softmax_ir import softmax_rows_ir
        kernels.append(softmax_rows_ir)
    x = (np.random.default_rng(n).standard_normal((9, n)) * 8).astype(np.float32)
    x[2] = -np.inf
    x[5, : (n + 1) // 2] = -np.inf
    x64 = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        e = np.exp((x64 - x64.max(axis=1, keepdims=True)) * scale)
        ref = e / e.sum(axis=1, keepdims=True)
    for fn in kernels:
        got = np.empty_like(x)
        fn(x, got, np.float32(scale))
        assert np.array_equal(np.isnan(got), np.isnan(ref))
        ok = ~np.isnan(ref)
        np.testing.assert_allclose(got[ok], ref[ok], rtol=3e-6, atol=1e-30)


@pytest.mark.parametrize("op", ["MEAN", "SUM", "MAXIMUM"])
@pytest.mark.parametrize("shape,dims,keep", [((1, 64, 56, 56), [2, 3], True), ((2, 3, 5), [2], False),
                                             ((2, 3, 5), [1], True), ((4, 7), [0, 1], False),
                                             ((2, 320, 14, 14), [-2, -1], False)])
@pytest.mark.parametrize("threads", [1, 2])
def test_reductions_over_trailing_axes_match_float64(op, shape, dims, keep, threads):
    """SUM/MEAN over the last axes run as one row pass (norm.row_sums), the rest on NumPy; both against
    NumPy in float64 (relative 1e-5: float32 sums over up to 3136 values)."""
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32) + 0.5
    g = _graph([Node("Reduction", ["x"], ["y"], "r", {"operation": op, "dim": dims, "keepDims": keep})],
               [("x", shape)], ["y"])
    got = Session(g, threads).run({"x": x})["y"]
    fn = {"MEAN": np.mean, "SUM": np.sum, "MAXIMUM": np.max}[op]
    ref = fn(x.astype(np.float64), axis=tuple(dims), keepdims=keep)
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize("mode", ["half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel"])
@pytest.mark.parametrize("shape,sizes", [((1, 3, 16, 16), (64, 64)), ((2, 5, 7, 9), (20, 13)), ((1, 2, 30, 40), (15, 10))])
def test_bilinear_resize_matches_onnxruntime(tmp_path, mode, shape, sizes):
    """Linear Resize as the separable two-pass kernel (resize._bilinear): up, down and uneven sizes in
    four coordinate modes against onnxruntime; tolerance 1e-5 absolute on values of order 1."""
    import onnx
    from onnx import TensorProto as TP, helper as h
    from mnntool import api
    from tests.conftest import save_onnx
    ort = pytest.importorskip("onnxruntime")
    out = list(shape[:2]) + list(sizes)
    g = h.make_graph([h.make_node("Resize", ["x", "", "", "s"], ["y"], mode="linear",
                                  coordinate_transformation_mode=mode)], "r",
                     [h.make_tensor_value_info("x", TP.FLOAT, list(shape))], [h.make_tensor_value_info("y", TP.FLOAT, out)],
                     [onnx.numpy_helper.from_array(np.array(out, np.int64), "s")])
    save_onnx(g, tmp_path / "r.onnx", opset=13)
    api.convert(tmp_path / "r.onnx", tmp_path / "r.mnn")
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    got = Session(api.load_graph(tmp_path / "r.mnn"), 2).run({"x": x})["y"]
    ref = ort.InferenceSession(str(tmp_path / "r.onnx")).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5)


@pytest.mark.parametrize("op", ["ADD", "SUB", "MUL", "MAXIMUM", "MINIMUM", "GREATER", "LESS_EQUAL", "EQUAL"])
@pytest.mark.parametrize("da,db", [("int32", "int32"), ("int64", "int32"), ("bool", "int32"), ("int64", "bool"),
                                   ("bool", "bool")])
def test_integer_binary_ops_match_the_definition(op, da, db):
    """Integer and boolean BinaryOps on the prepared kernel (elementwise._integer_binary) give the
    definition's values and dtype (ir/ops/elementwise.binary_value: MNN's meaning), with broadcasting;
    shape inference gives that dtype too."""
    from mnntool.errors import MnnToolError
    from mnntool.ir.ops.elementwise import binary_value
    r = np.random.RandomState(0)
    a = (r.randint(-50, 50, (2, 3, 4)) if da != "bool" else r.rand(2, 3, 4) < 0.5).astype(da)
    b = (r.randint(-50, 50, (3, 1)) if db != "bool" else r.rand(3, 1) < 0.5).astype(db)
    g = Graph(nodes=[Node("BinaryOp", ["a", "b"], ["y"], "op", {"opType": op})], inputs=["a", "b"], outputs=["y"])
    g.tensors["a"], g.tensors["b"] = TensorInfo("a", da, a.shape), TensorInfo("b", db, b.shape)
    s = Session(g, threads=1)
    if da == db == "bool" and op == "SUB":      # NumPy has no boolean subtract: both refuse it
        with pytest.raises(TypeError):
            binary_value(op, a, b)
        with pytest.raises(MnnToolError, match="BinaryOp 'op' failed: TypeError"):
            s.run({"a": a, "b": b})
        return
    got = s.run({"a": a, "b": b})["y"]
    ref = binary_value(op, a, b)
    assert got.dtype == ref.dtype and np.array_equal(got, ref)
    step = s.plan.steps[0]
    assert "_integer_binary" in step.kernel.fn.__qualname__ or (da == db == "bool" and op not in ("EQUAL", "LESS_EQUAL",
                                                                                                   "GREATER"))


def test_serial_twins_use_numpys_error_model_and_give_the_parallel_values():
    """kernels.serial compiles the twin with error_model='numpy' (Python's zero-division checks kept the
    twins' loops scalar: 4x slower than the parallel kernel on one thread); every fused activation gives
    the parallel kernel's values (relative 1e-6) through it."""
    import numba

    from mnntool.runtime.kernels import serial
    from mnntool.runtime.kernels.micro.activation_ir import post_flat
    from mnntool.runtime.kernels.micro.epilogue import POST_KINDS
    twin = serial(post_flat)
    assert twin.targetoptions.get("error_model") == "numpy" and not twin.targetoptions.get("parallel")
    x = np.random.RandomState(0).randn(10000).astype(np.float32) * 4
    saved = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        for kind in POST_KINDS:
            a, b = x.copy(), x.copy()
            post_flat(a, kind, np.float32(0.1), np.float32(0.6))
            twin(b, kind, np.float32(0.1), np.float32(0.6))
            np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-7, err_msg=f"post kind {kind}")
    finally:
        numba.set_num_threads(saved)


@pytest.mark.parametrize("op", ["MUL", "ADD"])
@pytest.mark.parametrize("xs, ss", [((1, 32, 14, 14), (1, 32, 1, 1)), ((2, 24, 9, 20), (1, 24, 1, 1)),
                                    ((2, 24, 9, 20), (2, 24, 1, 1)), ((1, 8, 3, 3), (1, 8, 1, 1))])
@pytest.mark.parametrize("s_first, relu", [(False, 0), (True, 0), (False, 1)])
def test_channel_scale(op, xs, ss, s_first, relu):
    """A per-channel operand ((1|N, C, 1, 1)) against a map: one pass per channel row (the squeeze-
    excite scale) where the map is large, numpy's broadcast where small; either operand order, batch
    1 and 2, MNN's fused ReLU. Reference numpy in float64, tolerance 1e-6."""
    inputs = [("s", ss), ("x", xs)] if s_first else [("x", xs), ("s", ss)]
    g = _graph([Node("BinaryOp", [n for n, _ in inputs], ["y"], "op", {"opType": op, "activationType": relu})],
               inputs, ["y"])
    rng = np.random.default_rng(sum(xs))
    feeds = {"x": rng.standard_normal(xs).astype(np.float32), "s": rng.standard_normal(ss).astype(np.float32)}
    x, s = feeds["x"].astype(np.float64), feeds["s"].astype(np.float64)
    ref = x * s if op == "MUL" else x + s
    got = Session(g).run(feeds)["y"]
    np.testing.assert_allclose(got, np.maximum(ref, 0) if relu else ref, rtol=0, atol=1e-6)


@pytest.mark.parametrize("shape, perm", [((64, 2, 16, 2), (0, 2, 1, 3)), ((8, 16, 2, 4), (2, 0, 1, 3)),
                                         ((4, 6, 3, 4, 2), (2, 0, 3, 1, 4)), ((5, 3, 2), (1, 0, 2)),
                                         ((4, 6, 3), (0, 2, 1))])
def test_permute_matches_numpy(shape, perm):
    """Permute's kernel (runs of 2 or 4 floats along a kept last axis copied as one wide element) against
    numpy's transpose, exact; on a strided view as input too (the plain copy then)."""
    from mnntool.ir.ops import Val
    from mnntool.runtime.kernels.ops.tensor import permute
    from mnntool.runtime.settings import Settings
    x = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
    node = Node("Permute", ["x"], ["y"], "p", {"dims": list(perm)})
    k = permute(node, [Val(shape)], [Val(tuple(shape[p] for p in perm))], Settings(1))
    for src in (x, np.ascontiguousarray(np.repeat(x, 2, axis=-1))[..., ::2]):
        y = np.full(tuple(shape[p] for p in perm), np.nan, np.float32)
        k.fn([src], [y])
        np.testing.assert_array_equal(y, src.transpose(perm))


def test_steps_with_bound_arguments_read_each_runs_values():
    """A step whose inputs sit in the planner's fixed buffers gets its argument list once, at prepare
    (Session.prepare: `bound`); the buffers' new contents, and a new feed to the steps that read it,
    must reach every run. Reference: numpy, exact."""
    nodes = [Node("Permute", ["x"], ["t"], "t1", {"dims": [1, 0, 2]}),
             Node("Permute", ["t"], ["u"], "t2", {"dims": [2, 1, 0]}),
             Node("Softmax", ["u"], ["y"], "sm", {"axis": -1})]
    g = _graph(nodes, [("x", (3, 4, 5))], ["y"])
    s = Session(g, threads=1)
    rng = np.random.default_rng(9)
    for _ in range(3):
        x = rng.standard_normal((3, 4, 5)).astype(np.float32)
        got = s.run({"x": x})["y"]
        u = x.transpose(1, 0, 2).transpose(2, 1, 0).astype(np.float64)
        e = np.exp(u - u.max(-1, keepdims=True))
        np.testing.assert_allclose(got, e / e.sum(-1, keepdims=True), rtol=1e-6)
    assert [c[4] is not None for c in s.plan.calls] == [False, True, True], "only the step reading x rebuilds"


def test_layer_norm_step_reads_its_buffers_afresh_every_run():
    """LayerNorm's row kernel keeps the row views of the arrays of the run before: a planner buffer's new
    contents (a Permute's output), and a strided input (copied, never kept), must reach every run.
    Reference: float64, 1e-5 relative."""
    from mnntool.ir.ops import Val
    from mnntool.runtime.kernels.ops.norm import layer_norm
    from mnntool.runtime.settings import Settings
    rng = np.random.default_rng(4)
    gamma, beta = rng.standard_normal(8).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    node = Node("LayerNorm", ["x"], ["y"], "ln", {"axis": [-1], "epsilon": 1e-5, "gamma": gamma, "beta": beta})
    k = layer_norm(node, [Val((6, 8))], [Val((6, 8))], Settings(1))
    buf, y = np.empty((6, 8), np.float32), np.empty((6, 8), np.float32)
    wide = np.empty((6, 16), np.float32)
    for src in (buf, buf, wide[:, ::2], buf):
        src[...] = rng.standard_normal(src.shape)
        k.fn([src], [y])
        x = src.astype(np.float64)
        ref = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * gamma + beta
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
