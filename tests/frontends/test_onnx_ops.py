"""Each supported ONNX op: convert with mnntool, run the .mnn in the real MNN runtime, compare with onnxruntime.

Tolerance: cosine >= 0.9999 and max abs diff <= 1e-3 x the output's max magnitude.
"""
import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP, helper as h, numpy_helper as nh

from mnntool import api
from tests.conftest import assert_close, mnn_run, ort_run

R = np.random.RandomState(0)


def W(name, a):
    return nh.from_array(np.asarray(a), name)


def vi(name, shape, t=TP.FLOAT):
    return h.make_tensor_value_info(name, t, shape)


def N(op, ins, outs, **kw):
    return h.make_node(op, ins, outs, **kw)


f32 = lambda *s: R.randn(*s).astype(np.float32)  # noqa: E731
X4 = [("x", [1, 4, 8, 8])]

# regions (batch index, x1, y1, x2, y2) in input pixels before spatial_scale: inside, across the edge, one pixel
ROIS = np.array([[0, 0, 0, 14, 14], [0, 4, 2, 20, 9], [0, 6, 6, 6, 6]], np.float32)

CASES = {
    "reverse_sequence": ([N("ReverseSequence", ["x", "lens"], ["y"], batch_axis=1, time_axis=0)], [("x", [5, 3, 4])],
                         [W("lens", np.array([5, 2, 1], np.int64))], 17),
    "reverse_sequence_batch_first": ([N("ReverseSequence", ["x", "lens"], ["y"], batch_axis=0, time_axis=1)],
                                     [("x", [3, 6, 2])], [W("lens", np.array([1, 4, 6], np.int64))], 17),
    "max_roi_pool": ([N("MaxRoiPool", ["x", "rois"], ["y"], pooled_shape=[3, 2], spatial_scale=0.5)], X4,
                     [W("rois", ROIS)], 17),
    "conv": ([N("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2])], X4,
             [W("w", f32(6, 4, 3, 3)), W("b", f32(6))], 17),
    "conv_dilated_nobias": ([N("Conv", ["x", "w"], ["y"], dilations=[2, 2], pads=[2, 2, 2, 2])], X4,
                            [W("w", f32(5, 4, 3, 3))], 17),
    "conv_group_depthwise": ([N("Conv", ["x", "w"], ["a"], group=2), N("Conv", ["a", "wd"], ["y"], group=6,
                                                                         pads=[1, 1, 1, 1])], X4,
                             [W("w", f32(6, 2, 1, 1)), W("wd", f32(6, 1, 3, 3))], 17),
    "conv_same_upper": ([N("Conv", ["x", "w"], ["y"], auto_pad="SAME_UPPER", strides=[2, 2])], X4,
                        [W("w", f32(3, 4, 3, 3))], 13),
    "conv_transpose": ([N("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1],
                          output_padding=[1, 1])], X4, [W("w", f32(4, 6, 3, 3)), W("b", f32(6))], 17),
    "batchnorm": ([N("BatchNormalization", ["x", "s", "bb", "m", "v"], ["y"], epsilon=1e-5)], X4,
                  [W("s", f32(4)), W("bb", f32(4)), W("m", f32(4)), W("v", np.abs(f32(4)) + .5)], 15),
    "activations": ([N("Relu", ["x"], ["a"]), N("LeakyRelu", ["x"], ["b"], alpha=0.1), N("Add", ["a", "b"], ["c"]),
                     N("Sigmoid", ["c"], ["d"]), N("Tanh", ["c"], ["e"]), N("Mul", ["d", "e"], ["f"]),
                     N("HardSigmoid", ["f"], ["g"]), N("HardSwish", ["c"], ["i"]), N("Sub", ["g", "i"], ["y"])],
                    X4, [], 17),
    "clip_prelu": ([N("Clip", ["x", "mn", "mx"], ["a"]), N("PRelu", ["a", "sl"], ["y"])], X4,
                   [W("mn", np.float32(-1)), W("mx", np.float32(6)), W("sl", np.abs(f32(4, 1, 1)))], 17),
    "clip_attrs_opset11": ([N("Clip", ["x"], ["y"], min=0.0, max=6.0)], X4, [], 6),
    "gelu_erf": ([N("Div", ["x", "s2"], ["a"]), N("Erf", ["a"], ["b"]), N("Add", ["b", "one"], ["c"]),
                  N("Mul", ["x", "c"], ["d"]), N("Mul", ["d", "half"], ["e"]), N("Gelu", ["e"], ["y"])], X4,
                 [W("s2", np.float32(1.4142135)), W("one", np.float32(1)), W("half", np.float32(.5))], 20),
    "pow_sqrt_div": ([N("Abs", ["x"], ["a"]), N("Sqrt", ["a"], ["b"]), N("Pow", ["b", "p"], ["c"]),
                      N("Div", ["c", "k"], ["y"])], X4, [W("p", np.float32(3)), W("k", f32(1, 4, 1, 1) + 3)], 17),
    "softmax_logsoftmax": ([N("Softmax", ["x"], ["a"], axis=1), N("LogSoftmax", ["x"], ["b"], axis=-1),
                            N("Add", ["a", "b"], ["y"])], X4, [], 17),
    "pools": ([N("MaxPool", ["x"], ["a"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
               N("AveragePool", ["a"], ["b"], kernel_shape=[2, 2], strides=[1, 1]),
               N("GlobalAveragePool", ["b"], ["c"]), N("Flatten", ["c"], ["y"], axis=1)], X4, [], 17),
    "global_max_mean": ([N("GlobalMaxPool", ["x"], ["a"]), N("GlobalAveragePool", ["x"], ["b"]),
                         N("Sub", ["a", "b"], ["y"])], X4, [], 17),
    "avgpool_pad_exclude": ([N("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                               ceil_mode=1)], X4, [], 17),
    "reduce": ([N("ReduceMean", ["x"], ["a"], axes=[2, 3], keepdims=1), N("ReduceSum", ["x", "ax"], ["b"], keepdims=1),
                N("ReduceMax", ["b"], ["c"], axes=[3], keepdims=1), N("Add", ["a", "c"], ["y"])], X4,
               [W("ax", np.array([2]))], 13),
    "matmul_gemm": ([N("Reshape", ["x", "s"], ["a"]), N("MatMul", ["a", "w"], ["b"]),
                     N("Gemm", ["b", "w2", "c2"], ["y"], transB=1, alpha=0.5, beta=2.0)], X4,
                    [W("s", np.array([4, 64])), W("w", f32(64, 16)), W("w2", f32(5, 16)), W("c2", f32(5))], 17),
    "batched_matmul": ([N("MatMul", ["x", "x2"], ["y"])], [("x", [2, 3, 4]), ("x2", [2, 4, 5])], [], 17),
    "shape_ops": ([N("Reshape", ["x", "shp"], ["a"]), N("Transpose", ["a"], ["b"], perm=[0, 2, 1]),
                   N("Unsqueeze", ["b", "ax"], ["c"]), N("Squeeze", ["c", "ax"], ["d"]),
                   N("Concat", ["d", "d"], ["e"], axis=1), N("Slice", ["e", "st", "en", "axs", "stp"], ["f"]),
                   N("Split", ["f", "spl"], ["g1", "yc"], axis=1), N("Gather", ["g1", "idx"], ["y"], axis=1)], X4,
                  [W("shp", np.array([1, 4, 64])), W("ax", np.array([1])), W("st", np.array([1])),
                   W("en", np.array([100])), W("axs", np.array([1])), W("stp", np.array([2])),
                   W("spl", np.array([20, 30])), W("idx", np.array([[0, -1], [2, 1]]))], 17),
    "flatten_axis2": ([N("Flatten", ["x"], ["y"], axis=2)], X4, [], 17),
    "dynamic_shape": ([N("Shape", ["x"], ["s"]), N("ConstantOfShape", ["s"], ["z"], value=nh.from_array(
        np.array([1.5], "f"))), N("Add", ["x", "z"], ["a"]), N("Expand", ["a", "es"], ["b"]),
        N("Equal", ["b", "a"], ["eq"]), N("Where", ["eq", "b", "a"], ["y"])], X4,
        [W("es", np.array([2, 4, 8, 8]))], 17),
    "cast_constant": ([N("Constant", [], ["k"], value=nh.from_array(np.array([2.0], "f"))),
                       N("Mul", ["x", "k"], ["a"]), N("Cast", ["a"], ["b"], to=TP.INT32),
                       N("Cast", ["b"], ["y"], to=TP.FLOAT)], X4, [], 17),
    "layernorm": ([N("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1, epsilon=1e-5)], [("x", [1, 5, 8])],
                  [W("g", f32(8)), W("b", f32(8))], 17),
    "resize_pad": ([N("Resize", ["x", "", "sc"], ["a"], mode="linear", coordinate_transformation_mode="half_pixel"),
                    N("Resize", ["a", "", "sc"], ["b"], mode="nearest", coordinate_transformation_mode="asymmetric",
                      nearest_mode="floor"),
                    N("Pad", ["b", "pd"], ["y"], mode="constant")], X4,
                   [W("sc", np.array([1, 1, 2, 2], "f")), W("pd", np.array([0, 0, 1, 2, 0, 0, 1, 2]))], 17),
    "resize_sizes_align": ([N("Resize", ["x", "", "", "sz"], ["y"], mode="linear",
                             coordinate_transformation_mode="align_corners")], X4,
                           [W("sz", np.array([1, 4, 13, 11]))], 17),
    "dropout_identity": ([N("Dropout", ["x"], ["a"]), N("Identity", ["a"], ["b"]), N("Relu", ["b"], ["y"])],
                         X4, [], 17),
    "lstm": ([N("LSTM", ["x", "W", "R", "B"], ["y", "yh", "yc"], hidden_size=6)], [("x", [7, 2, 5])],
             [W("W", f32(1, 24, 5)), W("R", f32(1, 24, 6)), W("B", f32(1, 48))], 17),
    "lstm_bidirectional": ([N("LSTM", ["x", "W", "R", "B"], ["y"], hidden_size=6, direction="bidirectional")],
                           [("x", [4, 1, 5])], [W("W", f32(2, 24, 5)), W("R", f32(2, 24, 6)), W("B", f32(2, 48))], 17),
    "gru": ([N("GRU", ["x", "W", "R", "B"], ["y", "yh"], hidden_size=6, linear_before_reset=1)], [("x", [7, 1, 5])],
            [W("W", f32(1, 18, 5)), W("R", f32(1, 18, 6)), W("B", f32(1, 36))], 17),
    "gru_reset_before": ([N("GRU", ["x", "W", "R", "B"], ["y"], hidden_size=6)], [("x", [5, 1, 5])],
                         [W("W", f32(1, 18, 5)), W("R", f32(1, 18, 6)), W("B", f32(1, 36))], 17),
}


def make_model(path, name):
    nodes, inputs, inits, opset = CASES[name]
    outs = sorted({o for n in nodes for o in n.output if o in ("y", "yh", "yc")})
    g = h.make_graph(nodes, name, [vi(n, s) for n, s in inputs], [h.make_empty_tensor_value_info(o) for o in outs], initializer=inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.save(m, path)
    return {n: R.randn(*s).astype(np.float32) for n, s in inputs}


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_matches_onnxruntime_in_mnn(tmp_path, name):
    src, dst = tmp_path / f"{name}.onnx", tmp_path / f"{name}.mnn"
    feeds = make_model(src, name)
    ref = ort_run(src, feeds)
    api.convert(src, dst)
    g = api.load_graph(dst)
    got = mnn_run(dst, g.inputs, g.outputs, feeds)
    for out in g.outputs:
        assert_close(ref[out], got[out])


def test_reverse_sequence_refuses_a_length_mnn_cannot_run(tmp_path):
    """MNN reverses 1..steps elements of each sequence; a zero length is refused in one line at conversion."""
    from mnntool.errors import MnnToolError
    g = h.make_graph([N("ReverseSequence", ["x", "lens"], ["y"])], "rs", [vi("x", [4, 2, 3])], [vi("y", [4, 2, 3])],
                     initializer=[W("lens", np.array([0, 4], np.int64))])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, tmp_path / "rs.onnx")
    with pytest.raises(MnnToolError, match=r"rs.onnx: ReverseSequence '.*': sequence lengths \[0, 4\] outside 1..4"):
        api.convert(tmp_path / "rs.onnx", tmp_path / "rs.mnn")


def test_supported_op_list_covers_the_foundation_list():
    from mnntool.frontends.onnx import supported_ops
    wanted = """Conv ConvTranspose BatchNormalization Relu Clip LeakyRelu PRelu Sigmoid HardSigmoid HardSwish Tanh Gelu
    Erf Softmax LogSoftmax Add Sub Mul Div Pow Sqrt MatMul Gemm MaxPool AveragePool GlobalAveragePool ReduceMean
    ReduceSum ReduceMax Concat Split Slice Gather Reshape Flatten Transpose Squeeze Unsqueeze Shape Expand Cast
    Resize Pad LayerNormalization Dropout Identity Constant ConstantOfShape Where Equal LSTM GRU""".split()
    assert not set(wanted) - set(supported_ops())
