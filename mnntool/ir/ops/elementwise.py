"""Elementwise ops: one output shaped like the (broadcast) inputs."""
from __future__ import annotations

import math

import numpy as np

from . import Val, define, out_size, params, same

COMPARE = {"GREATER", "GREATER_EQUAL", "LESS", "LESS_EQUAL", "EQUAL", "NOTEQUAL"}
LOGICAL = {"LOGICALOR", "LOGICALXOR"}


def broadcast(*shapes):
    if any(s is None for s in shapes):
        return None
    rank = max(len(s) for s in shapes)
    out = []
    for i in range(rank):
        dims = [s[i - rank + len(s)] for s in shapes if i - rank + len(s) >= 0]
        known = [d for d in dims if d != 1]
        if not known:
            out.append(1)
            continue
        ints = {d for d in known if isinstance(d, int)}
        if len(ints) > 1:
            raise ValueError(f"shapes {shapes} do not broadcast")
        out.append(ints.pop() if ints else known[0])
    return tuple(out)


def _f32(fn):
    """A float function applied in float32 to any input type, the result cast back (MNN computes unary
    math on floats)."""
    def run(x):
        if x.dtype.kind == "f":
            return fn(x)
        return fn(x.astype(np.float32)).astype(x.dtype)
    return run


def _sigmoid(x):
    with np.errstate(over="ignore"):
        return (1.0 / (1.0 + np.exp(-x.astype(np.float64)))).astype(x.dtype)


def _erf(x):
    return np.vectorize(math.erf, otypes=[np.float64])(x).astype(x.dtype) if x.size else x


def _gelu_erf(x):
    return (0.5 * x * (1.0 + _erf(x.astype(np.float64) / math.sqrt(2.0)))).astype(x.dtype)


def _gelu_tanh(x):
    return (0.5 * x * (1 + np.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))).astype(x.dtype)


# ROUND is MNN's: halves away from zero (measured in MNN 3.6.1); frontends lower half-to-even rounding
UNARY = {
    "ABS": np.abs, "NEG": np.negative, "FLOOR": np.floor, "CEIL": np.ceil, "SQUARE": np.square,
    "SQRT": np.sqrt, "RSQRT": lambda x: 1 / np.sqrt(x), "EXP": np.exp, "LOG": np.log, "SIN": np.sin,
    "COS": np.cos, "TAN": np.tan, "ASIN": np.arcsin, "ACOS": np.arccos, "ATAN": np.arctan,
    "RECIPROCAL": np.reciprocal, "LOG1P": np.log1p, "BNLL": lambda x: np.logaddexp(0, x), "ACOSH": np.arccosh,
    "SINH": np.sinh, "ASINH": np.arcsinh, "ATANH": np.arctanh, "SIGN": np.sign, "ROUND": lambda x: np.sign(x) * np.floor(np.abs(x) + 0.5),
    "COSH": np.cosh, "ERF": _erf, "ERFC": lambda x: 1 - _erf(x), "EXPM1": np.expm1, "SIGMOID": _sigmoid,
    "TANH": np.tanh, "HARDSWISH": lambda x: x * np.clip(x + 3, 0, 6) / 6, "GELU": _gelu_tanh,
    "GELU_STANDARD": _gelu_erf, "SILU": lambda x: x * _sigmoid(x),
}
KEEP_TYPE = {"ABS", "NEG", "SQUARE", "SIGN"}   # exact on integers, no float round trip


def _int_div(a, b):
    """Integer division truncating toward zero (C, ONNX and MNN), 0 where b is 0."""
    safe = np.where(b == 0, 1, b)
    q = np.abs(a) // np.abs(safe)
    return np.where((a < 0) != (safe < 0), -q, q).astype(np.result_type(a, b))


def _by_kind(int_fn, float_fn):
    """One binary function from its integer form (both operands integers) and its float form."""
    def run(a, b):
        if a.dtype.kind in "iu" and b.dtype.kind in "iu":
            return int_fn(a, b)
        with np.errstate(invalid="ignore", divide="ignore"):
            return float_fn(a, b)
    return run


def _int_fmod(a, b):
    safe = np.where(b == 0, 1, b)
    return (a - _int_div(a, safe) * safe).astype(np.result_type(a, b))


_div = _by_kind(_int_div, np.true_divide)
_floordiv = _by_kind(lambda a, b: np.floor_divide(a, np.where(b == 0, 1, b)), lambda a, b: np.floor(a / b))
_c_fmod = _by_kind(_int_fmod, np.fmod)                                     # the dividend's sign (C fmod)
_py_mod = _by_kind(lambda a, b: np.mod(a, np.where(b == 0, 1, b)), np.mod)  # the divisor's sign (Python %)


def _mnn_mod(a, b):
    """MNN's MOD (measured in MNN 3.6): C fmod on floats, but Python's floor mod on integers."""
    return _py_mod(a, b) if a.dtype.kind in "iu" else _c_fmod(a, b)


def _mnn_floormod(a, b):
    """MNN's FLOORMOD: floor mod on floats, C fmod on integers (MOD's mirror image)."""
    return _c_fmod(a, b) if a.dtype.kind in "iu" else _py_mod(a, b)


def _pow(a, b):
    if a.dtype.kind in "iu" and b.dtype.kind in "iu":
        return np.power(a.astype(np.float64), b).astype(a.dtype)
    with np.errstate(all="ignore"):
        return np.power(a, b.astype(a.dtype) if a.dtype.kind == "f" else b)


def _shift(left):
    def run(a, b):
        b = np.asarray(b).astype(a.dtype)
        return np.left_shift(a, b) if left else np.right_shift(a, b)
    return run


BINARY = {
    "ADD": np.add, "SUB": np.subtract, "MUL": np.multiply, "REALDIV": _div, "DIV": _div, "POW": _pow,
    "MAXIMUM": np.maximum, "MINIMUM": np.minimum, "MAX_TEMP": np.maximum, "MIN_TEMP": np.minimum,
    "EQUAL": np.equal, "NOTEQUAL": np.not_equal, "GREATER": np.greater, "GREATER_EQUAL": np.greater_equal,
    "LESS": np.less, "LESS_EQUAL": np.less_equal, "FLOORDIV": _floordiv, "FLOORMOD": _mnn_floormod, "MOD": _mnn_mod,
    "SquaredDifference": lambda a, b: np.square(a - b), "ATAN2": np.arctan2,
    "LOGICALOR": lambda a, b: np.logical_or(a, b).astype(np.int32),
    "LOGICALXOR": lambda a, b: np.logical_xor(a, b).astype(np.int32),
    "BITWISE_AND": np.bitwise_and, "BITWISE_OR": np.bitwise_or, "BITWISE_XOR": np.bitwise_xor,
    "LEFTSHIFT": _shift(True), "RIGHTSHIFT": _shift(False),
}


def operand_dtypes(op: str, da, db) -> tuple[np.dtype, np.dtype]:
    """The dtypes `binary_value` computes `op` in for operands of dtypes da and db: a comparison's
    result beside a number as int32 (0/1), and one common type where they differ (shifts keep theirs)."""
    da, db = np.dtype(da), np.dtype(db)
    if (da == np.bool_) != (db == np.bool_):
        da, db = (np.dtype(np.int32) if d == np.bool_ else d for d in (da, db))
    if da != db and op not in ("LEFTSHIFT", "RIGHTSHIFT"):
        da = db = np.result_type(da, db) if da.kind == db.kind else (da if da.kind == "f" else db)
    return da, db


def binary_value(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """MNN's BinaryOp on numpy arrays; comparisons give bool, everything else the inputs' type."""
    a, b = np.asarray(a), np.asarray(b)
    ta, tb = operand_dtypes(op, a.dtype, b.dtype)
    a, b = a.astype(ta, copy=False), b.astype(tb, copy=False)
    with np.errstate(all="ignore"):
        out = BINARY[op](a, b)
    return out if out.dtype == np.bool_ or op in LOGICAL else out.astype(a.dtype, copy=False)


@define("ReLU", param="Relu", int8="values", layout="either", spreads_grid=True)
class ReLU:
    """x, or x times `slope` where x < 0 (LeakyReLU)."""
    infer = same
    flops = out_size

    def compute(node, xs):
        x, slope = xs[0], params(node)["slope"]
        return np.where(x > 0, x, x * np.asarray(slope, x.dtype)) if slope else np.maximum(x, 0)


@define("ReLU6", param="Relu6", int8="values", layout="either", spreads_grid=True)
class ReLU6:
    """x clipped to [minValue, maxValue] (ONNX Clip with constant bounds)."""
    infer = same
    flops = out_size

    def compute(node, xs):
        lo, hi = params(node)["minValue"], params(node)["maxValue"]
        x = xs[0]
        if x.dtype.kind in "iu":
            info = np.iinfo(x.dtype)
            lo, hi = max(math.ceil(lo), info.min), min(math.floor(hi), info.max)
        return np.clip(x, np.asarray(lo).astype(x.dtype), np.asarray(hi).astype(x.dtype))


@define("PReLU", param="PRelu", layout="NC4HW4")
class PReLU:
    """x, or x times its channel's slope where x < 0."""
    infer = same
    flops = out_size

    def compute(node, xs):
        x = xs[0]
        s = np.asarray(node.param["slope"], np.float32).reshape(-1)
        s = s.reshape((1, -1) + (1,) * (x.ndim - 2)) if s.size > 1 else s.reshape(())
        return np.where(x > 0, x, x * s).astype(x.dtype)


@define("Sigmoid", layout="either")
class Sigmoid:
    infer = same
    flops = out_size

    def compute(node, xs):
        return _sigmoid(xs[0])


@define("TanH", layout="either")
class TanH:
    infer = same
    flops = out_size

    def compute(node, xs):
        return np.tanh(xs[0])


@define("ELU", param="ELU")
class ELU:
    infer = same
    flops = out_size

    def compute(node, xs):
        x = xs[0]
        return np.where(x > 0, x, np.float32(params(node)["alpha"]) * np.expm1(np.minimum(x, 0))).astype(x.dtype)


@define("Selu", param="Selu")
class Selu:
    infer = same
    flops = out_size

    def compute(node, xs):
        x, p = xs[0], params(node)
        scale, alpha = np.float32(p["scale"]), np.float32(p["alpha"])
        return (scale * np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0)))).astype(x.dtype)


@define("UnaryOp", param="UnaryOp", int8="float", layout="either")
class UnaryOp:
    """opType names the function (UnaryOpOperation)."""
    infer = same
    flops = out_size

    def compute(node, xs):
        op, x = params(node)["opType"], xs[0]
        fn = UNARY[op]
        with np.errstate(all="ignore"):
            return fn(x) if op in KEEP_TYPE else _f32(fn)(x)


@define("BinaryOp", param="BinaryOp", int8="float", inputs=("a", "b"))
class BinaryOp:
    """opType names the operation (BinaryOpOperation); activationType 1 applies ReLU after it."""
    flops = out_size

    def infer(node, ins):
        op = params(node)["opType"]
        a, b = ins[0].dtype, ins[1].dtype
        if (a == "bool") != (b == "bool"):      # as binary_value: a comparison's result beside a number is 0/1
            a, b = ("int32" if a == "bool" else a), ("int32" if b == "bool" else b)
        dtype = "bool" if op in COMPARE else ("int32" if op in LOGICAL else a)
        if op not in COMPARE | LOGICAL and a != b and b.startswith("float"):
            dtype = b
        return [Val(broadcast(ins[0].shape, ins[1].shape), dtype)]

    def compute(node, xs):
        out = binary_value(params(node)["opType"], xs[0], xs[1])
        if int(params(node)["activationType"]) == 1:
            out = np.maximum(out, 0)
        return out


@define("Select", inputs=("condition", "a", "b"))
class Select:
    flops = out_size

    def infer(node, ins):
        return [Val(broadcast(ins[0].shape, ins[1].shape, ins[2].shape), ins[1].dtype)]

    def compute(node, xs):
        return np.where(xs[0].astype(bool), xs[1], xs[2])


@define("Cast", param="CastParam")
class Cast:
    """To dstT; MNN has no int64 or bool tensors, so those are int32 here."""
    def infer(node, ins):
        from ..dtypes import from_mnn
        return [Val(ins[0].shape, from_mnn(params(node)["dstT"]))]

    def compute(node, xs):
        from ..dtypes import from_mnn
        dtype = np.dtype(from_mnn(params(node)["dstT"]))
        x = xs[0]
        if dtype.kind in "iu" and x.dtype.kind == "f":
            with np.errstate(invalid="ignore"):
                x = np.trunc(np.nan_to_num(x, nan=0.0, posinf=np.iinfo(dtype).max, neginf=np.iinfo(dtype).min))
                x = np.clip(x, np.iinfo(dtype).min, np.iinfo(dtype).max)
        return x.astype(dtype)


@define("Identity", "Dropout", kind="movement", moves="view")
class Identity:
    infer = same

    def compute(node, xs):
        return xs[0]


@define("ConvertTensor", param="TensorConvertInfo", kind="movement", moves="view")
class ConvertTensor:
    """A layout change (NCHW <-> NC4HW4) for MNN; the values, and so this runtime's arrays, are the same."""
    infer = same

    def compute(node, xs):
        return xs[0]


@define("Scale", param="Scale", layout="NC4HW4")
class Scale:
    """x times scaleData plus biasData, per channel (axis 1): folded BatchNorm."""
    infer = same
    flops = out_size

    def compute(node, xs):
        x = xs[0]
        shape = (1, -1) + (1,) * (x.ndim - 2)
        s = np.asarray(node.param["scaleData"], np.float32).reshape(shape)
        b = node.param.get("biasData")
        out = x * s
        return (out + np.asarray(b, np.float32).reshape(shape) if b is not None and len(b) else out).astype(x.dtype)


@define("Softmax", param="Axis", kind="normalization")
class Softmax:
    infer = same
    flops = out_size

    def compute(node, xs):
        x = xs[0].astype(np.float64)
        axis = params(node)["axis"]
        e = np.exp(x - x.max(axis=axis, keepdims=True)) if x.size else x
        return (e / e.sum(axis=axis, keepdims=True)).astype(xs[0].dtype) if x.size else xs[0]
