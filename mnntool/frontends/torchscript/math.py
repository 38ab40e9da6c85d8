"""aten arithmetic, activations, softmax and reductions -> IR."""
from __future__ import annotations

import numpy as np

from ..shape_tracking import T
from .context import ATEN, aten


def _binary_op(op_type):
    def fn(ctx, node, args):
        a, b = args[0], args[1]
        if op_type == "REALDIV" and len(args) > 2 and args[2] in ("floor", "trunc"):
            return _rounded_div(ctx, node, a, b, args[2])
        if not isinstance(a, T) and not isinstance(b, T):
            import operator
            return [{"ADD": operator.add, "SUB": operator.sub, "MUL": operator.mul,
                     "REALDIV": operator.truediv}[op_type](a, b)]
        if op_type in ("ADD", "SUB") and len(args) > 2 and args[2] not in (None, 1):
            b = ctx.tensor(np.asarray(b, np.float32) * args[2]) if not isinstance(b, T) else b
        from .control import like_tensor
        a, b = like_tensor(ctx, a, b), like_tensor(ctx, b, a)
        return ctx.emit("BinaryOp", [ctx.tensor(a), ctx.tensor(b)], [ctx.out(node)],
                        {"opType": op_type, "T": "DT_FLOAT"}, node.kind())
    return fn


def _rounded_div(ctx, node, a, b, mode):
    """torch.div(a, b, rounding_mode='floor' | 'trunc'): the quotient rounded down or toward zero."""
    from .control import like_tensor
    from .onnx_like import onnx_op
    from ..shape_tracking import emit_onnx
    if not isinstance(a, T) and not isinstance(b, T):
        q = np.asarray(a) / np.asarray(b)
        r = np.floor(q) if mode == "floor" else np.trunc(q)
        return [type(a)(r) if isinstance(a, (int, float)) and isinstance(b, (int, float)) else r]
    a, b = like_tensor(ctx, a, b), like_tensor(ctx, b, a)
    if mode == "floor":
        return ctx.emit("BinaryOp", [ctx.tensor(a), ctx.tensor(b)], [ctx.out(node)], {"opType": "FLOORDIV"})
    integer = ctx.val(a if isinstance(a, T) else b).dtype != "float32"
    base = ctx.out(node)
    fa, fb = (emit_onnx(ctx, "Cast", [x], [ctx.tmp(f"{base}_{t}")], {"to": 1})[0] if integer else x
              for x, t in ((a, "fa"), (b, "fb")))
    q = emit_onnx(ctx, "Div", [fa, fb], [ctx.tmp(base + "_q")])[0]
    if integer:             # a float to integer cast rounds toward zero
        return onnx_op(ctx, node, "Cast", [q], {"to": 6})
    neg = emit_onnx(ctx, "Less", [q, np.float32(0)], [ctx.tmp(base + "_neg")])[0]
    up, down = (emit_onnx(ctx, op, [q], [ctx.tmp(f"{base}_{op}")])[0] for op in ("Ceil", "Floor"))
    return onnx_op(ctx, node, "Where", [neg, up, down])


for _k, _v in {"aten::add": "ADD", "aten::sub": "SUB", "aten::mul": "MUL", "aten::div": "REALDIV"}.items():
    ATEN[_k] = _binary_op(_v)


@aten("aten::floor_divide", "aten::floordiv")
def floor_divide(ctx, node, args):
    a, b = args
    if not isinstance(a, T) and not isinstance(b, T):
        return [a // b]
    from .control import like_tensor
    a, b = like_tensor(ctx, a, b), like_tensor(ctx, b, a)
    return ctx.emit("BinaryOp", [ctx.tensor(a), ctx.tensor(b)], [ctx.out(node)], {"opType": "FLOORDIV"})


@aten("aten::pow")
def pow_(ctx, node, args):
    if not isinstance(args[0], T) and not isinstance(args[1], T):
        return [args[0] ** args[1]]
    from .control import like_tensor       # x ** 2: the number as the tensor's type (MNN refuses a mix)
    a, b = like_tensor(ctx, args[0], args[1]), like_tensor(ctx, args[1], args[0])
    return ctx.emit("BinaryOp", [ctx.tensor(a), ctx.tensor(b)], [ctx.out(node)], {"opType": "POW"})


def _unary(op_type):
    return lambda ctx, node, args: ctx.emit("UnaryOp", [args[0]], [ctx.out(node)], {"opType": op_type, "T": "DT_FLOAT"},
                                            node.kind())


for _k, _v in {"aten::sigmoid": "SIGMOID", "aten::tanh": "TANH", "aten::sqrt": "SQRT", "aten::exp": "EXP",
               "aten::log": "LOG", "aten::hardswish": "HARDSWISH", "aten::silu": "SILU", "aten::abs": "ABS",
               "aten::neg": "NEG", "aten::erf": "ERF"}.items():
    ATEN[_k] = _unary(_v)


@aten("aten::gelu")
def gelu(ctx, node, args):
    approx = args[1] if len(args) > 1 else "none"
    return ctx.emit("UnaryOp", [args[0]], [ctx.out(node)], {"opType": "GELU" if approx == "tanh" else "GELU_STANDARD"})


@aten("aten::relu")
def relu(ctx, node, args):
    return ctx.emit("ReLU", [args[0]], [ctx.out(node)], {"slope": 0.0}, node.kind())


@aten("aten::leaky_relu")
def leaky_relu(ctx, node, args):
    return ctx.emit("ReLU", [args[0]], [ctx.out(node)], {"slope": float(args[1])})


@aten("aten::hardtanh", "aten::relu6", "aten::clamp")
def hardtanh(ctx, node, args):
    lo, hi = (0.0, 6.0) if node.kind() == "aten::relu6" else (args[1], args[2])
    lo = -3.4e38 if lo is None else float(lo)
    hi = 3.4e38 if hi is None else float(hi)
    return ctx.emit("ReLU6", [args[0]], [ctx.out(node)], {"minValue": lo, "maxValue": hi}, node.kind())


@aten("aten::softmax", "aten::log_softmax")
def softmax(ctx, node, args):
    out = ctx.out(node)
    if node.kind() == "aten::softmax":
        return ctx.emit("Softmax", [args[0]], [out], {"axis": int(args[1])})
    sm = T(ctx.tmp(out + "_sm"))
    ctx.emit("Softmax", [args[0]], [sm], {"axis": int(args[1])})
    return ctx.emit("UnaryOp", [sm], [out], {"opType": "LOG", "T": "DT_FLOAT"})


@aten("aten::mean", "aten::sum", "aten::amax")
def reduce(ctx, node, args):
    x = args[0]
    dims = args[1] if len(args) > 1 and args[1] is not None else list(range(len(ctx.shape_of(x))))
    keep = bool(args[2]) if len(args) > 2 else False
    op = {"aten::mean": "MEAN", "aten::sum": "SUM", "aten::amax": "MAXIMUM"}[node.kind()]
    return ctx.emit("Reduction", [x], [ctx.out(node)], {"operation": op, "dim": [int(d) for d in dims],
                                                        "keepDims": keep, "dType": "DT_FLOAT"})
