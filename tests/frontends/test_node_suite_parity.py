"""ONNX ops whose direct MNN op means something else in MNN 3.6's runtime, written as ops both runtimes
compute as ONNX means them (issue 51: the node suite's cases that passed in mnntool's runtime only).
One test per rewrite; each runs the converted file in mnntool's runtime and in MNN (`import MNN`, when
installed) against an independent reference: onnxruntime, or ONNX's reference evaluator where
onnxruntime lacks the op's form (signed BitShift at opset 28, float Mod with fmod=0). Integers exactly;
floats to 1e-6 of the output's scale (1e-4 for cubic Resize: float32 arithmetic in a different order
from the reference's float64)."""
import numpy as np
import pytest

from mnntool.api import convert
from mnntool.errors import MnnToolError
from mnntool.runners import backend_runner
from tests.conftest import ort_run, save_onnx

onnx = pytest.importorskip("onnx")


def _backends():
    out = ["numba"]
    try:
        import MNN  # noqa: F401
        out.append("mnn")
    except ImportError:
        pass
    return out


def _graph(nodes, inputs, outputs, inits=()):
    from onnx import helper
    return helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                             [helper.make_tensor_value_info(n, t, None) for n, t in outputs], list(inits))


def _reference(path, feeds):
    from onnx.reference import ReferenceEvaluator
    model = onnx.load(str(path))
    names = [o.name for o in model.graph.output]
    return dict(zip(names, ReferenceEvaluator(model).run(None, feeds)))


def _check(path, feeds, ref, tol=0.0):
    convert(path, path.with_suffix(".mnn"))
    for b in _backends():
        got = backend_runner(path.with_suffix(".mnn"), b, 1).run(feeds)
        for name, want in ref.items():
            have = np.asarray(got[name]).reshape(np.shape(want))
            if want.dtype.kind in "iub":
                assert have.astype(np.int64).tolist() == want.astype(np.int64).tolist(), (b, name, have, want)
            else:
                scale = max(1.0, float(np.nanmax(np.abs(np.where(np.isinf(want), 0, want)))))
                np.testing.assert_allclose(have, want, rtol=0, atol=tol * scale, equal_nan=True,
                                           err_msg=f"{b} {name}")


@pytest.mark.parametrize("dtype", [np.int32, np.int8, np.uint8])
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bitshift_out_of_range_counts(tmp_path, dtype, direction):
    """Counts below 0 or at/above the width, and left shifts overflowing a narrow type: ONNX's values
    (0 / the sign / wrapped), where MNN's C shift gave others."""
    from onnx import helper
    bits = np.iinfo(dtype).bits
    tp = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    lo = -2 if np.iinfo(dtype).min < 0 else 0
    x = np.array([-8, 4, -1, 64, 1, -64, 7, 3], dtype=np.int64).clip(np.iinfo(dtype).min, np.iinfo(dtype).max)
    y = np.array([lo, 1, bits, bits - 1, bits + 3, 1, 0, min(127, 2 * bits)], dtype=np.int64)
    g = _graph([helper.make_node("BitShift", ["x", "y"], ["z"], direction=direction)],
               [("x", tp, [8]), ("y", tp, [8])], [("z", tp)])
    save_onnx(g, tmp_path / "s.onnx", opset=28, ir_version=10)
    feeds = {"x": x.astype(dtype), "y": y.astype(dtype)}
    _check(tmp_path / "s.onnx", feeds, _reference(tmp_path / "s.onnx", feeds))


def test_float_mod_infinite_and_zero_divisors(tmp_path):
    """fmod=0 on floats with infinite, zero and NaN divisors: ONNX's x (same signs) or the divisor
    (signs differ) by an infinity, NaN by 0; MNN's FLOORMOD gave NaN for the infinities."""
    from onnx import TensorProto, helper
    g = _graph([helper.make_node("Mod", ["x", "y"], ["z"], fmod=0)],
               [("x", TensorProto.FLOAT, [16]), ("y", TensorProto.FLOAT, [16])], [("z", TensorProto.FLOAT)])
    save_onnx(g, tmp_path / "m.onnx", opset=28, ir_version=10)
    inf, nan = np.inf, np.nan
    x = np.array([0, -0.0, -3, 3, -1, 1, inf, -inf, 1, 1, nan, 1, 5.5, -5.5, 7.25, -2], np.float32)
    y = np.array([-2, 2, inf, inf, -inf, -inf, 2, 2, 0, -0.0, 2, nan, -2, 2, 1.5, -0.75], np.float32)
    feeds = {"x": x, "y": y}
    _check(tmp_path / "m.onnx", feeds, _reference(tmp_path / "m.onnx", feeds), tol=1e-6)


@pytest.mark.parametrize("case", [
    dict(scales=[1, 1, 2, 2]),
    dict(sizes=[1, 2, 9, 10]),
    dict(scales=[1, 1, 3, 2.5], ctm="pytorch_half_pixel"),
    dict(scales=[1, 1, 0.8, 0.6]),
    dict(scales=[1, 1, 2, 2], cubic_coeff_a=-0.5, exclude_outside=1),
    dict(sizes=[1, 2, 3, 7], ctm="asymmetric", cubic_coeff_a=-0.5),
    dict(scales=[1, 1, 3, 1]),
    dict(sizes=[1, 2, 10, 12], ctm="pytorch_half_pixel"),
    dict(scales=[1, 1, 2, 3], ctm="align_corners"),
    dict(scales=[1, 1, 0.8, 1.3], ctm="align_corners", reference="onnx"),
], ids=["up_scales", "up_sizes", "pytorch_half", "down", "A-0.5_exclude", "asym_A-0.5", "whole_3x1", "whole_sizes",
        "corners", "corners_unrounded"])
@pytest.mark.parametrize("runtime", [False, True], ids=["const", "input"])
def test_cubic_resize(tmp_path, case, runtime):
    """Cubic Resize as gathers and weights, or (whole factors, constant: up_scales, whole_*) MNN's Interp
    on an input with an edge row and column in front, cropped: MNN's Interp kernel read the wrong
    neighbours where the source coordinate is in (-1, 0) (3.9 off on the suite's 4x4 -> 8x8) and knows
    only A = -0.75. align_corners with an unrounded output length (4 x 0.8): onnxruntime divides by the
    rounded length, ONNX's spec and reference (and the node suite's data) by the unrounded one: checked
    against ONNX's reference evaluator."""
    from onnx import TensorProto, helper, numpy_helper
    case = dict(case)
    reference = _reference if case.pop("reference", "") == "onnx" else ort_run
    key = "scales" if "scales" in case else "sizes"
    value = np.array(case.pop(key), np.float32 if key == "scales" else np.int64)
    ctm = case.pop("ctm", "half_pixel")
    ins = ["x", "", "v", ""] if key == "scales" else ["x", "", "", "v"]
    node = helper.make_node("Resize", ins, ["y"], mode="cubic", coordinate_transformation_mode=ctm, **case)
    tp = TensorProto.FLOAT if key == "scales" else TensorProto.INT64
    inputs = [("x", TensorProto.FLOAT, [1, 2, 5, 4])] + ([("v", tp, [4])] if runtime else [])
    inits = [] if runtime else [numpy_helper.from_array(value, "v")]
    save_onnx(_graph([node], inputs, [("y", TensorProto.FLOAT)], inits), tmp_path / "r.onnx", opset=19,
              ir_version=9)
    feeds = {"x": np.random.default_rng(1).standard_normal((1, 2, 5, 4)).astype(np.float32)}
    if runtime:
        feeds["v"] = value
    _check(tmp_path / "r.onnx", feeds, reference(tmp_path / "r.onnx", feeds), tol=1e-4)


@pytest.mark.parametrize("case", [
    dict(kernel_shape=[3, 3], strides=[3, 3], pads=[1, 1, 1, 1], ceil_mode=1, shape=[1, 3, 2, 2]),
    dict(kernel_shape=[3, 2], strides=[2, 2], pads=[0, 1, 2, 0], ceil_mode=1, shape=[1, 2, 7, 6]),
    dict(kernel_shape=[2, 2], strides=[1, 1], pads=[0, 0, 1, 1], shape=[1, 2, 5, 5]),
    dict(kernel_shape=[3], strides=[2], pads=[1, 2], ceil_mode=1, shape=[1, 2, 8]),
], ids=["ceil_window_on_pad", "ceil_asym", "end_pads", "1d"])
def test_average_pool_counting_padding(tmp_path, case):
    """count_include_pad=1 with pads or ceil_mode: zeros from a Padding op, then an average over them;
    MNN's pooling kept a ceil window ONNX drops (it starts on the padding)."""
    from onnx import TensorProto, helper
    case = dict(case)
    shape = case.pop("shape")
    node = helper.make_node("AveragePool", ["x"], ["y"], count_include_pad=1, **case)
    save_onnx(_graph([node], [("x", TensorProto.FLOAT, shape)], [("y", TensorProto.FLOAT)]),
              tmp_path / "a.onnx", opset=19, ir_version=9)
    feeds = {"x": np.random.default_rng(2).standard_normal(shape).astype(np.float32)}
    _check(tmp_path / "a.onnx", feeds, ort_run(tmp_path / "a.onnx", feeds), tol=1e-6)


@pytest.mark.parametrize("attrs", [dict(auto_pad="SAME_UPPER", kernel_shape=[2, 2]),
                                   dict(auto_pad="SAME_LOWER", kernel_shape=[3, 2], strides=[2, 1]),
                                   dict(pads=[0, 1, 1, 1], kernel_shape=[2, 3], p=3)],
                         ids=["same_upper", "same_lower", "asym_p3"])
def test_lp_pool_padding(tmp_path, attrs):
    """LpPool's sum over windows on end padding: zeros from a Padding op and whole windows; MNN's
    INCLUDE_PADDING average divided the end windows wrongly (1.3 off on the suite's SAME_UPPER case)."""
    from onnx import TensorProto, helper
    node = helper.make_node("LpPool", ["x"], ["y"], **attrs)
    save_onnx(_graph([node], [("x", TensorProto.FLOAT, [1, 3, 9, 8])], [("y", TensorProto.FLOAT)]),
              tmp_path / "l.onnx", opset=18, ir_version=9)
    feeds = {"x": np.random.default_rng(3).standard_normal((1, 3, 9, 8)).astype(np.float32)}
    _check(tmp_path / "l.onnx", feeds, ort_run(tmp_path / "l.onnx", feeds), tol=1e-5)


def test_lp_pool_same_upper_with_open_size_is_refused(tmp_path):
    """With the size open, MNN's SAME padding would divide the end windows wrongly: refused in one line."""
    from onnx import TensorProto, helper
    node = helper.make_node("LpPool", ["x"], ["y"], auto_pad="SAME_UPPER", kernel_shape=[2, 2], name="lp")
    save_onnx(_graph([node], [("x", TensorProto.FLOAT, [1, 3, "h", "w"])], [("y", TensorProto.FLOAT)]),
              tmp_path / "l.onnx", opset=18, ir_version=9)
    with pytest.raises(MnnToolError, match=r"LpPool 'lp': counting padding with auto_pad SAME_UPPER needs the "
                                           r"input's size at convert time"):
        convert(tmp_path / "l.onnx", tmp_path / "l.mnn")
    assert not (tmp_path / "l.mnn").exists()


@pytest.mark.parametrize("dtype", [np.int32, np.float32])
@pytest.mark.parametrize("batch_dims,data_shape,idx", [
    (1, (2, 2, 2), np.array([[1], [0]])),
    (1, (2, 3, 4), np.array([[[2, 1], [0, 3]], [[1, 0], [2, 2]]])),
    (2, (2, 3, 4, 2), np.array([[[1], [3], [0]], [[2], [2], [1]]])),
], ids=["suite", "b1_k2", "b2"])
def test_gather_nd_batch_dims(tmp_path, dtype, batch_dims, data_shape, idx):
    """batch_dims as leading batch coordinates in each index tuple and GatherND with batch_dims 0."""
    from onnx import TensorProto, helper
    tp = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    node = helper.make_node("GatherND", ["d", "i"], ["y"], batch_dims=batch_dims)
    save_onnx(_graph([node], [("d", tp, list(data_shape)), ("i", TensorProto.INT64, list(idx.shape))],
                     [("y", tp)]), tmp_path / "g.onnx", opset=13, ir_version=8)
    feeds = {"d": np.arange(np.prod(data_shape)).reshape(data_shape).astype(dtype), "i": idx.astype(np.int64)}
    _check(tmp_path / "g.onnx", feeds, ort_run(tmp_path / "g.onnx", feeds))


@pytest.mark.parametrize("sorted_", [0, 1])
@pytest.mark.parametrize("x", [np.array([2, 1, 1, 3, 4, 3], np.float32),
                               np.array([-1.5, 2, -3, 2, 0.5, -1.5, -7, 9], np.float32),
                               np.array([5, -2, 5, 0, -9, -2, 3], np.int64)], ids=["suite", "negative", "int"])
def test_unique_orders(tmp_path, sorted_, x):
    """MNN's Unique orders by the int32 bits (negative floats last, reversed): ONNX's order of first
    appearance or of values through TopKV2 permutations; all four outputs."""
    from onnx import TensorProto, helper
    tp = helper.np_dtype_to_tensor_dtype(x.dtype)
    node = helper.make_node("Unique", ["x"], ["y", "idx", "inv", "cnt"], sorted=sorted_)
    save_onnx(_graph([node], [("x", tp, [x.size])], [("y", tp), ("idx", TensorProto.INT64),
                                                      ("inv", TensorProto.INT64), ("cnt", TensorProto.INT64)]),
              tmp_path / "u.onnx", opset=13, ir_version=8)
    feeds = {"x": x}
    _check(tmp_path / "u.onnx", feeds, ort_run(tmp_path / "u.onnx", feeds))


def test_cubic_resize_open_size(tmp_path):
    """H and W open at convert time: the lengths come from Shape at run time; two sizes, one file."""
    from onnx import TensorProto, helper, numpy_helper
    node = helper.make_node("Resize", ["x", "", "s"], ["y"], mode="cubic")
    save_onnx(_graph([node], [("x", TensorProto.FLOAT, [1, 3, "h", "w"])], [("y", TensorProto.FLOAT)],
                     [numpy_helper.from_array(np.array([1, 1, 2, 3], np.float32), "s")]), tmp_path / "c.onnx",
              opset=19, ir_version=9)
    for shape in [(1, 3, 5, 4), (1, 3, 7, 9)]:
        feeds = {"x": np.random.default_rng(4).standard_normal(shape).astype(np.float32)}
        _check(tmp_path / "c.onnx", feeds, ort_run(tmp_path / "c.onnx", feeds), tol=1e-4)
