"""TensorFlow ops one at a time: each case is a tf.function saved as a GraphDef (.pb) that holds the op
(checked), converted, and run in mnntool's runtime and in MNN, against TensorFlow running the same .pb.
Floats: cosine >= 0.9999 and max abs <= 1e-3 x the output's scale; integers and booleans exactly."""
import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
tf = pytest.importorskip("tensorflow")

import mnntool  # noqa: E402
from mnntool import api  # noqa: E402
from tests.conftest import assert_close, mnn_run  # noqa: E402

R = np.random.default_rng(11)


def u(*shape, lo=-2.0, hi=2.0):
    return R.uniform(lo, hi, shape).astype(np.float32)


def ints(*shape, lo=-20, hi=20):
    return R.integers(lo, hi, shape).astype(np.int32)


def with_zeros(a):
    a = a.copy()
    a.reshape(-1)[::3] = 0
    return a


RAW = tf.raw_ops
C = tf.constant

# op name -> (function, inputs); every input is a placeholder named x, y, z in that order
CASES = {
    "Acos": (lambda x: tf.math.acos(x), [u(2, 3, 4, lo=-0.9, hi=0.9)]),
    "Acosh": (lambda x: tf.math.acosh(x), [u(2, 3, 4, lo=1.1, hi=3)]),
    "Asin": (lambda x: tf.math.asin(x), [u(2, 3, 4, lo=-0.9, hi=0.9)]),
    "Asinh": (lambda x: tf.math.asinh(x), [u(2, 3, 4)]),
    "Atan": (lambda x: tf.math.atan(x), [u(2, 3, 4)]),
    "Atanh": (lambda x: tf.math.atanh(x), [u(2, 3, 4, lo=-0.9, hi=0.9)]),
    "Cosh": (lambda x: tf.math.cosh(x), [u(2, 3, 4)]),
    "Sinh": (lambda x: tf.math.sinh(x), [u(2, 3, 4)]),
    "Tan": (lambda x: tf.math.tan(x), [u(2, 3, 4, lo=-1, hi=1)]),
    "Round": (lambda x: tf.math.round(x), [np.asarray([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.3, -0.7], np.float32)]),
    "Rint": (lambda x: tf.math.rint(x), [np.asarray([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.3, -0.7], np.float32)]),
    "Sign": (lambda x: tf.math.sign(x), [with_zeros(u(3, 4))]),
    "Selu": (lambda x: tf.nn.selu(x), [u(2, 3, 4)]),
    "Softsign": (lambda x: tf.nn.softsign(x), [u(2, 3, 4)]),
    "IsNan": (lambda x: tf.math.is_nan(tf.math.sqrt(x)), [u(3, 4)]),
    "IsInf": (lambda x: tf.math.is_inf(1.0 / x), [with_zeros(u(3, 4))]),
    "IsFinite": (lambda x: tf.math.is_finite(1.0 / x), [with_zeros(u(3, 4))]),
    "LogicalNot": (lambda x: tf.math.logical_not(x > 0), [u(3, 4)]),
    "Inv": (lambda x: RAW.Inv(x=x), [u(3, 4, lo=0.5, hi=2)]),
    "Invert": (lambda x: tf.bitwise.invert(x), [ints(3, 4)]),
    "Expm1": (lambda x: tf.math.expm1(x), [u(3, 4)]),
    "Erfc": (lambda x: tf.math.erfc(x), [u(3, 4)]),
    "ZerosLike": (lambda x: x + RAW.ZerosLike(x=x), [u(3, 4)]),
    "OnesLike": (lambda x: x * RAW.OnesLike(x=x), [u(3, 4)]),
    "LogSoftmax": (lambda x: tf.nn.log_softmax(x), [u(3, 7)]),
    "GreaterEqual": (lambda x, y: x >= y, [u(3, 4), u(4)]),
    "LessEqual": (lambda x, y: x <= y, [u(3, 4), u(3, 1)]),
    "NotEqual": (lambda x, y: tf.math.not_equal(x, y), [np.asarray([1, 2, 3], np.float32),
                                                        np.asarray([1, 0, 3], np.float32)]),
    "LogicalAnd": (lambda x, y: tf.math.logical_and(x > 0, y > 0), [u(3, 4), u(3, 4)]),
    "LogicalOr": (lambda x, y: tf.math.logical_or(x > 0, y > 0), [u(3, 4), u(3, 4)]),
    "BitwiseAnd": (lambda x, y: tf.bitwise.bitwise_and(x, y), [ints(3, 4, lo=0, hi=255), ints(3, 4, lo=0, hi=255)]),
    "BitwiseOr": (lambda x, y: tf.bitwise.bitwise_or(x, y), [ints(3, 4, lo=0, hi=255), ints(3, 4, lo=0, hi=255)]),
    "BitwiseXor": (lambda x, y: tf.bitwise.bitwise_xor(x, y), [ints(3, 4, lo=0, hi=255), ints(3, 4, lo=0, hi=255)]),
    "FloorMod": (lambda x, y: tf.math.floormod(x, y), [u(3, 4, lo=-5, hi=5), u(3, 4, lo=0.5, hi=2) * np.sign(u(3, 4))]),
    "Mod": (lambda x, y: RAW.Mod(x=x, y=y), [ints(3, 4), ints(3, 4, lo=1, hi=6)]),
    "TruncateMod": (lambda x, y: tf.truncatemod(x, y), [u(3, 4, lo=-5, hi=5), u(3, 4, lo=0.5, hi=2)]),
    "TruncateDiv": (lambda x, y: tf.truncatediv(x, y), [ints(3, 4), ints(3, 4, lo=1, hi=6) * np.sign(ints(3, 4))
                                                        .clip(-1, 1).astype(np.int32) | 1]),
    "DivNoNan": (lambda x, y: tf.math.divide_no_nan(x, y), [u(3, 4), with_zeros(u(3, 4))]),
    "MulNoNan": (lambda x, y: tf.math.multiply_no_nan(x, y), [u(3, 4), with_zeros(u(3, 4))]),
    "Xdivy": (lambda x, y: tf.math.xdivy(x, y), [with_zeros(u(3, 4)), u(3, 4, lo=0.5, hi=2)]),
    "Xlogy": (lambda x, y: tf.math.xlogy(x, y), [with_zeros(u(3, 4)), u(3, 4, lo=0.5, hi=2)]),
    "ApproximateEqual": (lambda x, y: RAW.ApproximateEqual(x=x, y=y, tolerance=0.5), [u(3, 4), u(3, 4)]),
    "Atan2": (lambda x, y: tf.math.atan2(x, y), [u(4, 5), with_zeros(u(4, 5))]),
    "ClipByValue": (lambda x, y: RAW.ClipByValue(t=x, clip_value_min=y, clip_value_max=y + 1.0), [u(3, 4), u(3, 4)]),
    "Select": (lambda x, y: RAW.Select(condition=x[:, 0] > 0, x=x, y=y), [u(3, 4), u(3, 4)]),
    "SelectV2": (lambda x, y: tf.where(x > 0, x, y[0]), [u(3, 4), u(2, 4)]),
    "BiasAddV1": (lambda x: RAW.BiasAddV1(value=x, bias=C(u(4))), [u(2, 3, 4)]),
    "All": (lambda x: tf.reduce_all(x > -1, axis=1), [u(3, 4)]),
    "Any": (lambda x: tf.reduce_any(x > 1, axis=[0], keepdims=True), [u(3, 4)]),
    "ArgMax": (lambda x: tf.math.argmax(x, axis=1, output_type=tf.int32), [u(3, 5)]),
    "ArgMin": (lambda x: tf.math.argmin(x, axis=0), [u(3, 5)]),
    "EuclideanNorm": (lambda x: RAW.EuclideanNorm(input=x, axis=C([1]), keep_dims=False), [u(3, 5)]),
    "Cumsum": (lambda x: tf.math.cumsum(x, axis=1, exclusive=True, reverse=True), [u(3, 5)]),
    "Cumprod": (lambda x: tf.math.cumprod(x, axis=0), [u(3, 5, lo=0.5, hi=1.5)]),
    "L2Loss": (lambda x: tf.nn.l2_loss(x), [u(3, 5)]),
    "FakeQuantWithMinMaxArgs": (lambda x: tf.quantization.fake_quant_with_min_max_args(x, -1.3, 2.2), [u(3, 50, lo=-2, hi=3)]),
    "FakeQuantWithMinMaxVars": (lambda x: tf.quantization.fake_quant_with_min_max_vars(x, C(-1.0), C(1.5), num_bits=4,
                                                                                       narrow_range=True),
                                [u(3, 50)]),
    "Tile": (lambda x: tf.tile(x, [2, 1, 3]), [u(2, 3, 4)]),
    "BroadcastTo": (lambda x: tf.broadcast_to(x, [2, 3, 4]), [u(3, 1)]),
    "Fill": (lambda x: tf.fill([2, 3], tf.reduce_sum(x)), [u(4)]),
    "Slice": (lambda x: tf.slice(x, [0, 1, 1], [2, -1, 2]), [u(2, 3, 4)]),
    "Split": (lambda x: tf.split(x, 2, axis=2), [u(2, 3, 4)]),
    "SplitV": (lambda x: tf.split(x, [1, -1], axis=1), [u(2, 3, 4)]),
    "Unpack": (lambda x: tf.unstack(x, axis=1), [u(2, 3, 4)]),
    "GatherV2": (lambda x: tf.gather(x, [2, 0, 2], axis=1), [u(2, 3, 4)]),
    "Gather": (lambda x: RAW.Gather(params=x, indices=C([[1, 0], [1, 1]])), [u(2, 3)]),
    "GatherNd": (lambda x: tf.gather_nd(x, [[0, 1], [1, 2]]), [u(2, 3, 4)]),
    "ScatterNd": (lambda x: tf.scatter_nd(C([[0], [2], [0]]), x, [4, 3]), [u(3, 3)]),
    "OneHot": (lambda x: tf.one_hot(x, 5, on_value=2.0, off_value=-1.0), [ints(2, 3, lo=0, hi=5)]),
    "ReverseV2": (lambda x: tf.reverse(x, [0, 2]), [u(2, 3, 4)]),
    "TopKV2": (lambda x: tf.math.top_k(x, 3), [u(2, 7)]),
    "MatrixBandPart": (lambda x: tf.linalg.band_part(x, 1, -1), [u(2, 4, 5)]),
    "PlaceholderWithDefault": (lambda x: x + tf.compat.v1.placeholder_with_default(C(u(3)), [3]), [u(2, 3)]),
    "LinSpace": (lambda x: x * RAW.LinSpace(start=C(0.0), stop=C(1.0), num=C(4)), [u(3, 4)]),
    "InvertPermutation": (lambda x: tf.transpose(x, tf.math.invert_permutation(C([2, 0, 1]))), [u(2, 3, 4)]),
    "BroadcastArgs": (lambda x: tf.broadcast_to(x, RAW.BroadcastArgs(s0=C([3, 1]), s1=C([1, 4]))), [u(3, 1)]),
    "Einsum": (lambda x, y: tf.einsum("bqhd,bkhd->bhqk", x, y), [u(2, 5, 3, 4), u(2, 6, 3, 4)]),
    "Conv2DBackpropInput": (lambda x: tf.nn.conv2d_transpose(x, C(u(3, 3, 4, 6, lo=-0.3, hi=0.3)), [1, 9, 11, 4], 2,
                                                             "SAME"), [u(1, 5, 6, 6)]),
    "Conv3D": (lambda x: tf.nn.conv3d(x, C(u(3, 2, 3, 3, 5, lo=-0.3, hi=0.3)), [1, 2, 1, 2, 1], "SAME"),
               [u(1, 5, 6, 7, 3)]),
    "MaxPool3D": (lambda x: tf.nn.max_pool3d(x, 2, 2, "VALID"), [u(1, 4, 6, 6, 3)]),
    "AvgPool3D": (lambda x: tf.nn.avg_pool3d(x, 3, 2, "SAME"), [u(1, 5, 6, 7, 3)]),
    "MaxPoolV2": (lambda x: RAW.MaxPoolV2(input=x, ksize=C([1, 3, 3, 1]), strides=C([1, 2, 2, 1]), padding="SAME"),
                  [u(1, 7, 8, 3)]),
    "LRN": (lambda x: tf.nn.local_response_normalization(x, 2, 1.5, 0.7, 0.5), [u(1, 4, 5, 8)]),
    "ResizeBicubic": (lambda x: tf.compat.v1.image.resize_bicubic(x, [9, 7], half_pixel_centers=True), [u(1, 5, 4, 3)]),
    "DepthToSpace": (lambda x: tf.nn.depth_to_space(x, 2), [u(1, 3, 4, 8)]),
    "SpaceToDepth": (lambda x: tf.nn.space_to_depth(x, 2), [u(1, 4, 6, 3)]),
    "SpaceToBatchND": (lambda x: tf.space_to_batch_nd(x, [2, 2], [[1, 1], [0, 2]]), [u(1, 6, 6, 3)]),
    "BatchToSpaceND": (lambda x: tf.batch_to_space(x, [2, 2], [[1, 0], [0, 1]]), [u(4, 3, 4, 2)]),
}

# more than one case for an op: name -> (op it holds, function, inputs)
EXTRA = {
    "ResizeBicubic_legacy": ("ResizeBicubic", lambda x: tf.compat.v1.image.resize_bicubic(x, [9, 7]), [u(1, 5, 4, 3)]),
    "Conv2DBackpropInput_valid": ("Conv2DBackpropInput", lambda x: tf.nn.conv2d_transpose(
        x, C(u(2, 3, 2, 4, lo=-0.3, hi=0.3)), [1, 6, 9, 2], [1, 2, 3, 1], "VALID"), [u(1, 3, 3, 4)]),
    "Einsum_dense": ("Einsum", lambda x: tf.einsum("abc,cde->abde", x, C(u(4, 2, 3))), [u(2, 5, 4)]),
    "Einsum_attention_out": ("Einsum", lambda x, y: tf.einsum("acbe,aecd->abcd", x, y), [u(2, 3, 4, 5), u(2, 5, 3, 6)]),
    "Einsum_one_operand": ("Einsum", lambda x: tf.einsum("ijk->ki", x), [u(2, 3, 4)]),
    "OneHot_axis0": ("OneHot", lambda x: tf.one_hot(x, 4, axis=0), [ints(3, lo=0, hi=4)]),
    "FloorMod_int": ("FloorMod", lambda x, y: tf.math.floormod(x, y), [ints(3, 4), ints(3, 4, lo=1, hi=5) * -1]),
    "Cumsum_plain": ("Cumsum", lambda x: tf.math.cumsum(x, axis=-1), [u(3, 5)]),
    "Tile_nchw": ("Tile", lambda x: tf.tile(tf.nn.relu(tf.nn.conv2d(x, C(u(1, 1, 3, 4)), 1, "VALID")), [1, 2, 1, 1]),
                  [u(1, 3, 4, 3)]),
    "Atan2_conv": ("Atan2", lambda x: tf.math.atan2(tf.nn.conv2d(x, C(u(1, 1, 3, 4)), 1, "VALID"), C(u(4))),
                   [u(1, 3, 4, 3)]),
}


def _ops_in(gd) -> set:
    return {n.op for n in gd.node} | {n.op for f in gd.library.function for n in f.node_def}


def save_pb(tmp_path, fn, inputs, rename=None):
    names = "xyz"[:len(inputs)]
    sig = [tf.TensorSpec(a.shape, tf.as_dtype(a.dtype), name=n) for a, n in zip(inputs, names)]
    gd = tf.function(fn, input_signature=sig).get_concrete_function().graph.as_graph_def()
    for a, b in (rename or {}).items():          # an op's twin (While for StatelessWhile, ...)
        for n in list(gd.node) + [n for f in gd.library.function for n in f.node_def]:
            if n.op == a:
                n.op = b
    path = tmp_path / "op.pb"
    path.write_bytes(gd.SerializeToString())
    return path, gd


_RUNS = iter(range(1 << 30))


def _renamed_functions(gd):
    """A copy whose library functions have fresh names: TensorFlow keeps every imported function in one
    process-wide registry, and a twin-renamed graph would clash with an earlier one of the same name."""
    gd = type(gd).FromString(gd.SerializeToString())
    tag = f"_run{next(_RUNS)}"
    names = {f.signature.name for f in gd.library.function}
    for f in gd.library.function:
        f.signature.name += tag
    for n in list(gd.node) + [n for f in gd.library.function for n in f.node_def]:
        for key in n.attr:
            a = n.attr[key]
            if a.HasField("func") and a.func.name in names:
                a.func.name += tag
            for f in a.list.func:
                if f.name in names:
                    f.name += tag
    return gd


def tf_run(gd, feeds: dict, outputs: list) -> dict:
    gd = _renamed_functions(gd)
    fn = tf.compat.v1.wrap_function(lambda: tf.graph_util.import_graph_def(gd, name=""), [])
    ins = [fn.graph.get_tensor_by_name(k + ":0") for k in feeds]
    outs = [fn.graph.get_tensor_by_name(o + ":0") for o in outputs]
    return {o: v.numpy() for o, v in zip(outputs, fn.prune(ins, outs)(*[tf.constant(v) for v in feeds.values()]))}


def check(ref, got, name):
    got = np.asarray(got)
    if ref.dtype.kind in "biu":
        assert got.shape == ref.shape, name
        np.testing.assert_array_equal(got.astype(ref.dtype), ref, err_msg=name)
    else:
        assert_close(ref, got.reshape(ref.shape))


def convert_and_compare(tmp_path, op_name, fn, inputs, rename=None):
    path, gd = save_pb(tmp_path, fn, inputs, rename)
    assert op_name in _ops_in(gd), f"the graph holds no {op_name}: {sorted(_ops_in(gd))}"
    dst = tmp_path / "op.mnn"
    api.convert(path, dst)
    g = api.load_graph(dst)
    feeds = dict(zip("xyz", inputs))
    ref = tf_run(gd, feeds, list(g.outputs))
    ours = mnntool.load(dst).run(feeds)
    theirs = mnn_run(dst, list(feeds), list(g.outputs), feeds)
    for o in g.outputs:
        check(ref[o], ours[o], f"{op_name} {o} (mnntool)")
        check(ref[o], theirs[o], f"{op_name} {o} (MNN)")


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_matches_tensorflow_in_both_runtimes(tmp_path, name):
    fn, inputs = CASES[name]
    convert_and_compare(tmp_path, name, fn, inputs)


@pytest.mark.parametrize("name", sorted(EXTRA))
def test_op_variant_matches_tensorflow(tmp_path, name):
    op_name, fn, inputs = EXTRA[name]
    convert_and_compare(tmp_path, op_name, fn, inputs)


# ---- control flow: TF2 functional ops, each tested as itself and as its stateful/stateless twin ----------

def _loop(x):
    def body(i, acc):
        return i + 1, tf.nn.tanh(acc * 1.1 + tf.cast(i, tf.float32))
    return tf.while_loop(lambda i, acc: i < 5, body, [tf.constant(0), x])[1]


def _cond(x):
    return tf.cond(tf.reduce_sum(x) > 0, lambda: x * 2.0, lambda: tf.nn.relu(x) - 1.0)


def _const_cond(x):
    return tf.cond(tf.constant(3) > 2, lambda: x * 2.0, lambda: x - 1.0)


def _case(x):
    k = tf.cast(tf.reduce_sum(x) > 0, tf.int32) + tf.cast(tf.reduce_max(x) > 1.5, tf.int32)
    return tf.switch_case(k, [lambda: x + 1.0, lambda: x * 3.0, lambda: -x])


@tf.function
def _inner(v):
    return tf.nn.sigmoid(v) * 2.0


def _loop_with_call(x):
    return tf.while_loop(lambda i, a: i < 3, lambda i, a: (i + 1, _inner(a) + a), [tf.constant(0), x])[1]


def _tensor_array(x):
    """Keras-RNN-style: a TensorArray read per step, written per step, stacked at the end."""
    steps = tf.TensorArray(tf.float32, size=4).unstack(x)
    out = tf.TensorArray(tf.float32, size=4)

    def body(t, h, out):
        h = tf.nn.tanh(steps.read(t) + 0.5 * h)
        return t + 1, h, out.write(t, h)
    _, _, out = tf.while_loop(lambda t, h, o: t < 4, body, [tf.constant(0), tf.zeros([3]), out])
    return out.stack()


def _list_ops(x):
    lst = RAW.EmptyTensorList(element_shape=C([3]), max_num_elements=-1, element_dtype=tf.float32)
    lst = RAW.TensorListPushBack(input_handle=lst, tensor=x[0])
    lst = RAW.TensorListPushBack(input_handle=lst, tensor=x[1] * 2.0)
    n = tf.cast(RAW.TensorListLength(input_handle=lst), tf.float32)
    return RAW.TensorListStack(input_handle=lst, element_shape=C([3]), element_dtype=tf.float32) * n


def _assert(x):
    with tf.control_dependencies([tf.debugging.Assert(tf.reduce_all(x > -100.0), [x])]):
        return tf.identity(x) + 1.0


def _run_time_loop(x):
    return tf.while_loop(lambda a: tf.reduce_sum(a) < 100.0, lambda a: a * 2.0 + 1.0, [x])[0]


def _run_time_count(x):
    """A counter against a count computed from the input, a convolution (its weights a loop constant) and
    the counter cast to float in the body."""
    n = tf.cast(tf.reduce_max(x) * 3.0, tf.int32)
    w = tf.constant(np.random.default_rng(0).standard_normal((3, 3, 4, 4)).astype(np.float32) * 0.2)

    def body(i, a):
        return i + 1, tf.nn.relu(tf.nn.conv2d(a, w, 1, "SAME")) + tf.cast(i, tf.float32) * 0.1
    return tf.while_loop(lambda i, a: i < n, body, [tf.constant(0), x])[1]


X34 = u(3, 4)
CONTROL = {
    "While_run_time": ("StatelessWhile", _run_time_loop, [np.abs(u(2, 3))], None),
    "While_run_time_stateful": ("While", _run_time_loop, [np.abs(u(2, 3))], {"StatelessWhile": "While"}),
    "While_run_time_count": ("StatelessWhile", _run_time_count, [np.abs(u(1, 5, 6, 4))], None),
    "StatelessWhile": ("StatelessWhile", _loop, [u(2, 3)], None),
    "While": ("While", _loop, [u(2, 3)], {"StatelessWhile": "While"}),
    "StatelessIf_true": ("StatelessIf", _cond, [np.abs(X34)], None),
    "StatelessIf_false": ("StatelessIf", _cond, [-np.abs(X34)], None),
    "If": ("If", _cond, [X34], {"StatelessIf": "If"}),
    "If_constant_predicate": ("StatelessIf", _const_cond, [X34], None),
    "StatelessCase": ("StatelessCase", _case, [X34], None),
    "Case": ("Case", _case, [np.abs(X34) + 1.0], {"StatelessCase": "Case"}),
    "PartitionedCall": ("PartitionedCall", _loop_with_call, [u(2, 3)], None),
    "StatefulPartitionedCall": ("StatefulPartitionedCall", _loop_with_call, [u(2, 3)],
                                {"PartitionedCall": "StatefulPartitionedCall"}),
    "TensorArray_loop": ("TensorListSetItem", _tensor_array, [u(4, 3)], None),
    "TensorList_push": ("TensorListPushBack", _list_ops, [u(2, 3)], None),
    "Assert": ("Assert", _assert, [X34], None),
}
TENSOR_LIST_OPS = ["TensorListReserve", "TensorListFromTensor", "TensorListGetItem", "TensorListSetItem",
                   "TensorListStack", "EmptyTensorList", "TensorListPushBack", "TensorListLength"]


@pytest.mark.parametrize("name", sorted(CONTROL))
def test_control_flow_matches_tensorflow(tmp_path, name):
    op_name, fn, inputs, rename = CONTROL[name]
    convert_and_compare(tmp_path, op_name, fn, inputs, rename)


def test_tensor_list_ops_are_all_exercised(tmp_path):
    held = set()
    for fn, inputs in ((_tensor_array, [u(4, 3)]), (_list_ops, [u(2, 3)])):
        held |= _ops_in(save_pb(tmp_path, fn, inputs)[1])
    assert set(TENSOR_LIST_OPS) <= held, sorted(set(TENSOR_LIST_OPS) - held)


def test_loop_variable_changing_shape_at_run_time_is_refused(tmp_path):
    from mnntool.errors import MnnToolError

    def fn(x):
        return tf.while_loop(lambda a: tf.reduce_sum(a) < 100.0, lambda a: tf.concat([a, a + 1.0], 0), [x],
                             shape_invariants=[tf.TensorShape([None, 3])])[0]
    path, _ = save_pb(tmp_path, fn, [u(2, 3)])
    with pytest.raises(MnnToolError, match=r"loop variable 2 changes shape from \(2, 3\) to \(4, 3\)"):
        api.convert(path, tmp_path / "o.mnn")
    assert not (tmp_path / "o.mnn").exists()
