"""aten's elementwise functions, activations, logical ops and simple reductions/rearrangements beyond the
basic set, each lowered by the ONNX frontend's converter of the same meaning (onnx_op)."""
from __future__ import annotations

import numpy as np

from ..shape_tracking import T, emit_onnx, reverse_axes
from .context import aten, is_bool
from .control import like_tensor
from .onnx_like import onnx_op

UNARY = {"aten::acos": "Acos", "aten::asin": "Asin", "aten::atan": "Atan", "aten::cosh": "Cosh",
         "aten::sinh": "Sinh", "aten::tan": "Tan", "aten::asinh": "Asinh", "aten::acosh": "Acosh",
         "aten::atanh": "Atanh", "aten::logical_not": "Not", "aten::bitwise_not": "Not", "aten::isnan": "IsNaN",
         "aten::isinf": "IsInf", "aten::selu": "Selu", "aten::mish": "Mish"}


def _tmp(ctx, node, tag):
    return ctx.tmp(f"{ctx.out(node)}_{tag}")


@aten(*UNARY)
def unary(ctx, node, args):
    return onnx_op(ctx, node, UNARY[node.kind()], [args[0]])


@aten("aten::log2", "aten::log10", "aten::log1p", "aten::expm1", "aten::square", "aten::erfc", "aten::log_sigmoid")
def unary_composite(ctx, node, args):
    x, k = args[0], node.kind()

    def e(op, ins, tag):
        return emit_onnx(ctx, op, ins, [_tmp(ctx, node, tag)])[0]
    if k in ("aten::log2", "aten::log10"):
        return onnx_op(ctx, node, "Mul", [e("Log", [x], "ln"), np.float32(1 / np.log(2 if k == "aten::log2" else 10))])
    if k == "aten::log1p":
        return onnx_op(ctx, node, "Log", [e("Add", [x, np.float32(1)], "p1")])
    if k == "aten::expm1":
        return onnx_op(ctx, node, "Sub", [e("Exp", [x], "e"), np.float32(1)])
    if k == "aten::square":
        return onnx_op(ctx, node, "Mul", [x, x])
    if k == "aten::erfc":
        return onnx_op(ctx, node, "Sub", [np.float32(1), e("Erf", [x], "erf")])
    # log_sigmoid: -softplus(-x), stable for large |x|
    return onnx_op(ctx, node, "Neg", [e("Softplus", [e("Neg", [x], "neg")], "sp")])


@aten("aten::softplus")
def softplus(ctx, node, args):
    """(1/beta) log(1 + exp(beta x)), and x itself where beta x > threshold."""
    x, beta, threshold = args[0], float(args[1]), float(args[2])
    bx = emit_onnx(ctx, "Mul", [x, np.float32(beta)], [_tmp(ctx, node, "bx")])[0]
    sp = emit_onnx(ctx, "Mul", [emit_onnx(ctx, "Softplus", [bx], [_tmp(ctx, node, "sp")])[0], np.float32(1 / beta)],
                   [_tmp(ctx, node, "spb")])[0]
    big = emit_onnx(ctx, "Greater", [bx, np.float32(threshold)], [_tmp(ctx, node, "big")])[0]
    return onnx_op(ctx, node, "Where", [big, x, sp])


@aten("aten::elu", "aten::celu")
def elu(ctx, node, args):
    x, alpha = args[0], float(args[1])
    if node.kind() == "aten::celu":
        return onnx_op(ctx, node, "Celu", [x], {"alpha": alpha})
    scale, in_scale = float(args[2]), float(args[3])
    if scale != 1 or in_scale != 1:
        raise ValueError("elu with scale or input_scale other than 1")
    return onnx_op(ctx, node, "Elu", [x], {"alpha": alpha})


@aten("aten::hardshrink", "aten::softshrink")
def shrink(ctx, node, args):
    lam = float(args[1])
    return onnx_op(ctx, node, "Shrink", [args[0]], {"lambd": lam, "bias": lam if node.kind() == "aten::softshrink"
                                                    else 0.0})


@aten("aten::prelu")
def prelu(ctx, node, args):
    x, w = args
    w = np.asarray(w, np.float32).reshape(-1)
    rank = len(ctx.shape_of(x))
    slope = w.reshape((-1,) + (1,) * (rank - 2)) if w.size > 1 else w.reshape(())
    return onnx_op(ctx, node, "PRelu", [x, slope])


@aten("aten::glu")
def glu(ctx, node, args):
    x, dim = args[0], int(args[1])
    shape = ctx.shape_of(x)
    dim %= len(shape)
    half = shape[dim] // 2
    a, b = emit_onnx(ctx, "Split", [x, np.asarray([half, half], np.int64)], [_tmp(ctx, node, "a"),
                                                                              _tmp(ctx, node, "b")], {"axis": dim})
    return onnx_op(ctx, node, "Mul", [a, emit_onnx(ctx, "Sigmoid", [b], [_tmp(ctx, node, "sig")])[0]])


BINARY = {"aten::maximum": "Max", "aten::minimum": "Min", "aten::logical_and": "And", "aten::logical_or": "Or",
          "aten::logical_xor": "Xor", "aten::remainder": "Mod", "aten::fmod": "Mod"}


@aten(*BINARY)
def binary(ctx, node, args):
    a, b = like_tensor(ctx, args[0], args[1]), like_tensor(ctx, args[1], args[0])
    attrs = {"fmod": int(node.kind() == "aten::fmod")} if BINARY[node.kind()] == "Mod" else {}
    return onnx_op(ctx, node, BINARY[node.kind()], [a, b], attrs)


BITWISE = {"aten::__and__": ("BitwiseAnd", "__and__"), "aten::bitwise_and": ("BitwiseAnd", "__and__"),
           "aten::__or__": ("BitwiseOr", "__or__"), "aten::bitwise_or": ("BitwiseOr", "__or__"),
           "aten::__xor__": ("BitwiseXor", "__xor__"), "aten::bitwise_xor": ("BitwiseXor", "__xor__")}


@aten(*BITWISE)
def bitwise(ctx, node, args):
    """a & b (| ^): on booleans (carried as 0/1 integers) the logical meaning, on integers the bitwise one;
    on Python values (scripted conditions) Python's."""
    a, b = args[0], args[1]
    op, py = BITWISE[node.kind()]
    if not isinstance(a, T) and not isinstance(b, T):
        return [getattr(a if not isinstance(a, bool) or isinstance(b, bool) else np.bool_(a), py)(b)]
    a, b = (x if isinstance(x, T) else np.asarray(x).astype(np.int32) for x in (a, b))
    return onnx_op(ctx, node, op, [a, b])


@aten("aten::min", "aten::max")
def min_max(ctx, node, args):
    """torch.min/max in its three forms: of everything, of two tensors elementwise, or along a dim with
    the index of the first extreme (values, indices)."""
    x, low = args[0], node.kind() == "aten::min"
    if len(args) == 1:
        if not isinstance(x, T):
            return [(min if low else max)(x) if isinstance(x, (list, tuple)) else np.asarray(x).min() if low
                    else np.asarray(x).max()]
        return onnx_op(ctx, node, "ReduceMin" if low else "ReduceMax", [x, _dims(ctx, x, None)], {"keepdims": 0})
    if len(args) == 2 or isinstance(args[1], T) or isinstance(args[1], np.ndarray):
        a, b = like_tensor(ctx, args[0], args[1]), like_tensor(ctx, args[1], args[0])
        if not isinstance(a, T) and not isinstance(b, T):
            return [(np.minimum if low else np.maximum)(a, b)]
        return onnx_op(ctx, node, "Min" if low else "Max", [a, b])
    dim, keep = int(args[1]), int(bool(args[2]))
    vals = onnx_op(ctx, node, "ReduceMin" if low else "ReduceMax", [x, _dims(ctx, x, [dim])], {"keepdims": keep})[0]
    idx = emit_onnx(ctx, "ArgMin" if low else "ArgMax", [x], [_tmp(ctx, node, "i")],
                    {"axis": dim, "keepdims": keep, "select_last_index": 0})[0]
    return [vals, emit_onnx(ctx, "Cast", [idx], [_tmp(ctx, node, "i64")], {"to": 7})[0]]


@aten("aten::clamp_min", "aten::clamp_max")
def clamp_side(ctx, node, args):
    return onnx_op(ctx, node, "Max" if node.kind() == "aten::clamp_min" else "Min",
                   [args[0], like_tensor(ctx, args[1], args[0])])


@aten("aten::where")
def where(ctx, node, args):
    c, a, b = args[0], args[1], args[2]
    a, b = like_tensor(ctx, a, b), like_tensor(ctx, b, a)
    return onnx_op(ctx, node, "Where", [c, a, b])


@aten("aten::masked_fill")
def masked_fill(ctx, node, args):
    x, mask, value = args
    return onnx_op(ctx, node, "Where", [mask, like_tensor(ctx, value, x), x])


# ---- reductions and rearrangements ---------------------------------------------------------------------

def _dims(ctx, x, dims):
    rank = len(ctx.shape_of(x))
    dims = [dims] if isinstance(dims, int) else list(dims or range(rank))
    return np.asarray(sorted(int(d) % rank for d in dims), np.int64)


@aten("aten::amin", "aten::prod", "aten::logsumexp")
def reduce(ctx, node, args):
    x = args[0]
    op = {"aten::amin": "ReduceMin", "aten::prod": "ReduceProd", "aten::logsumexp": "ReduceLogSumExp"}[node.kind()]
    if node.kind() == "aten::prod" and len(args) <= 2:       # prod(x, dtype): everything
        dims, keep = _dims(ctx, x, None), False
    else:
        dims, keep = _dims(ctx, x, args[1]), bool(args[2])
    return onnx_op(ctx, node, op, [x, dims], {"keepdims": int(keep)})


@aten("aten::linalg_vector_norm", "aten::norm")
def vector_norm(ctx, node, args):
    """(sum |x|^ord)^(1/ord) over dims (all when None): ord 2, 1, inf, -inf and 0 (the count of non-zeros)
    by their own reductions, any other p by the formula."""
    x, order = args[0], args[1]
    order = 2.0 if order is None else float(order)
    dims, keep = _dims(ctx, x, args[2] if len(args) > 2 else None), int(bool(args[3]) if len(args) > 3 else False)
    attrs = {"keepdims": keep}
    if order == 2:
        return onnx_op(ctx, node, "ReduceL2", [x, dims], attrs)
    if order == 1:
        return onnx_op(ctx, node, "ReduceL1", [x, dims], attrs)
    ax = emit_onnx(ctx, "Abs", [x], [_tmp(ctx, node, "abs")])[0]
    if np.isinf(order):
        return onnx_op(ctx, node, "ReduceMax" if order > 0 else "ReduceMin", [ax, dims], attrs)
    if order == 0:
        nz = emit_onnx(ctx, "Cast", [emit_onnx(ctx, "Greater", [ax, np.float32(0)], [_tmp(ctx, node, "nz")])[0]],
                       [_tmp(ctx, node, "nzf")], {"to": 1})[0]
        return onnx_op(ctx, node, "ReduceSum", [nz, dims], attrs)
    p = emit_onnx(ctx, "Pow", [ax, np.float32(order)], [_tmp(ctx, node, "pow")])[0]
    total = emit_onnx(ctx, "ReduceSum", [p, dims], [_tmp(ctx, node, "sum")], attrs)[0]
    return onnx_op(ctx, node, "Pow", [total, np.float32(1 / order)])


@aten("aten::diff")
def diff(ctx, node, args):
    """The n-th forward difference along dim, after `prepend` and before `append` are joined on; booleans
    differ where they are unequal (torch's meaning for them)."""
    x, n, dim, prepend, append = args
    shape = ctx.shape_of(x)
    dim = int(dim) % len(shape)
    boolean = is_bool(node.inputsAt(0)) if hasattr(node, "inputsAt") else False
    parts = [p for p in (prepend, x, append) if p is not None]
    if len(parts) > 1:
        x = emit_onnx(ctx, "Concat", parts, [_tmp(ctx, node, "joined")], {"axis": dim})[0]
    for k in range(int(n)):
        size = ctx.shape_of(x)[dim]
        later = emit_onnx(ctx, "Slice", [x, np.asarray([1]), np.asarray([size]), np.asarray([dim])],
                          [_tmp(ctx, node, f"hi{k}")])[0]
        earlier = emit_onnx(ctx, "Slice", [x, np.asarray([0]), np.asarray([size - 1]), np.asarray([dim])],
                            [_tmp(ctx, node, f"lo{k}")])[0]
        last = k == int(n) - 1
        out = ctx.out(node) if last else _tmp(ctx, node, f"d{k}")
        if boolean:
            ne = emit_onnx(ctx, "Equal", [later, earlier], [_tmp(ctx, node, f"eq{k}")])[0]
            x = emit_onnx(ctx, "Not", [ne], [out])[0]
        else:
            x = emit_onnx(ctx, "Sub", [later, earlier], [out])[0]
    return [x]


@aten("aten::argmax", "aten::argmin")
def arg(ctx, node, args):
    x, dim, keep = args[0], args[1], bool(args[2])
    if dim is None:
        x = ctx.reshape(x, [-1], _tmp(ctx, node, "flat"))[0]
        dim, keep = 0, False
    y = emit_onnx(ctx, "ArgMax" if node.kind() == "aten::argmax" else "ArgMin", [x], [_tmp(ctx, node, "i")],
                  {"axis": int(dim), "keepdims": int(keep)})
    return onnx_op(ctx, node, "Cast", y, {"to": 7})


@aten("aten::var", "aten::std")
def var(ctx, node, args):
    """var/std(x, dim, correction, keepdim) (the traced overload): mean squared deviation over n - correction."""
    x, dims, correction, keep = args[0], args[1], args[2], bool(args[3])
    dims = _dims(ctx, x, dims)
    n = int(np.prod([ctx.shape_of(x)[d] for d in dims]))
    corr = 1 if correction is None else float(correction)
    mean = emit_onnx(ctx, "ReduceMean", [x, dims], [_tmp(ctx, node, "mean")], {"keepdims": 1})[0]
    d = emit_onnx(ctx, "Sub", [x, mean], [_tmp(ctx, node, "d")])[0]
    ss = emit_onnx(ctx, "ReduceSumSquare", [d, dims], [_tmp(ctx, node, "ss")], {"keepdims": int(keep)})[0]
    if node.kind() == "aten::var":
        return onnx_op(ctx, node, "Mul", [ss, np.float32(1 / (n - corr))])
    v = emit_onnx(ctx, "Mul", [ss, np.float32(1 / (n - corr))], [_tmp(ctx, node, "var")])[0]
    return onnx_op(ctx, node, "Sqrt", [v])


@aten("aten::flip")
def flip(ctx, node, args):
    return [reverse_axes(ctx, args[0], _dims(ctx, args[0], args[1]), ctx.out(node))]


@aten("aten::roll")
def roll(ctx, node, args):
    x, shifts, dims = args
    shifts = [shifts] if isinstance(shifts, int) else list(shifts)
    dims = [dims] if isinstance(dims, int) else list(dims)
    if not dims:
        raise ValueError("roll without dims")
    y = x
    for k, (s, d) in enumerate(zip(shifts, dims)):
        size = ctx.shape_of(y)[d]
        s %= size
        if not s:
            continue
        head = emit_onnx(ctx, "Slice", [y, np.asarray([size - s]), np.asarray([size]), np.asarray([d])],
                         [_tmp(ctx, node, f"h{k}")])[0]
        tail = emit_onnx(ctx, "Slice", [y, np.asarray([0]), np.asarray([size - s]), np.asarray([d])],
                         [_tmp(ctx, node, f"t{k}")])[0]
        y = emit_onnx(ctx, "Concat", [head, tail], [_tmp(ctx, node, f"r{k}")], {"axis": int(d)})[0]
    return onnx_op(ctx, node, "Identity", [y])


@aten("aten::repeat")
def repeat(ctx, node, args):
    x, reps = args[0], [int(r) for r in args[1]]
    shape = ctx.shape_of(x)
    if len(reps) > len(shape):
        x = ctx.reshape(x, [1] * (len(reps) - len(shape)) + list(shape), _tmp(ctx, node, "nd"))[0]
    return onnx_op(ctx, node, "Tile", [x, np.asarray(reps, np.int64)])


@aten("aten::tril", "aten::triu")
def tri(ctx, node, args):
    return onnx_op(ctx, node, "Trilu", [args[0], np.asarray(int(args[1]), np.int64)],
                   {"upper": int(node.kind() == "aten::triu")})


@aten("aten::index_select")
def index_select(ctx, node, args):
    x, dim, idx = args
    return onnx_op(ctx, node, "Gather", [x, idx], {"axis": int(dim)})


@aten("aten::narrow")
def narrow(ctx, node, args):
    x, dim, start, length = args
    return onnx_op(ctx, node, "Slice", [x, np.asarray([start]), np.asarray([int(start) + int(length)]),
                                        np.asarray([dim])])


@aten("aten::pixel_shuffle", "aten::pixel_unshuffle")
def pixel_shuffle(ctx, node, args):
    """Channels (c, dy, dx) to and from pixels, as reshape / transpose / reshape."""
    x, r = args[0], int(args[1])
    n, c, h, w = ctx.shape_of(x)
    if node.kind() == "aten::pixel_shuffle":
        six, perm, out = [n, c // (r * r), r, r, h, w], [0, 1, 4, 2, 5, 3], [n, c // (r * r), h * r, w * r]
    else:
        six, perm, out = [n, c, h // r, r, w // r, r], [0, 1, 3, 5, 2, 4], [n, c * r * r, h // r, w // r]
    y = ctx.reshape(x, six, _tmp(ctx, node, "6d"))[0]
    y = emit_onnx(ctx, "Transpose", [y], [_tmp(ctx, node, "t")], {"perm": perm})[0]
    return ctx.reshape(y, out, ctx.out(node))


@aten("aten::full_like", "aten::zeros_like", "aten::ones_like")
def full_like(ctx, node, args):
    """Shapes are static here: a constant."""
    x = args[0]
    value = {"aten::zeros_like": 0, "aten::ones_like": 1}.get(node.kind(), args[1] if len(args) > 1 else 0)
    dtype = ctx.val(x).dtype if isinstance(x, T) else np.asarray(x).dtype
    return [np.full(ctx.shape_of(x), value, np.dtype(dtype or "float32"))]


@aten("aten::topk")
def topk(ctx, node, args):
    x, k, dim, largest, _sorted = args
    vals, idx = onnx_op(ctx, node, "TopK", [x, np.asarray([int(k)], np.int64)],
                        {"axis": int(dim), "largest": int(bool(largest)), "sorted": 1}, outputs=2)
    return [vals, emit_onnx(ctx, "Cast", [idx], [_tmp(ctx, node, "i64")], {"to": 7})[0]]
