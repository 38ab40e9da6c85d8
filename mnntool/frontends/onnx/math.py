"""ONNX activations and elementwise arithmetic -> IR."""
from __future__ import annotations

import numpy as np

from ...errors import MnnToolError
from .registry import converts

UNARY = {"Sigmoid": "SIGMOID", "Tanh": "TANH", "Sqrt": "SQRT", "Exp": "EXP", "Log": "LOG", "Abs": "ABS",
         "Neg": "NEG", "Reciprocal": "RECIPROCAL", "Floor": "FLOOR", "Ceil": "CEIL", "Erf": "ERF",
         "HardSwish": "HARDSWISH", "Sin": "SIN", "Cos": "COS", "Sign": "SIGN", "Tan": "TAN",
         "Asin": "ASIN", "Acos": "ACOS", "Atan": "ATAN", "Sinh": "SINH", "Cosh": "COSH", "Asinh": "ASINH",
         "Acosh": "ACOSH", "Atanh": "ATANH"}
BINARY = {"Add": "ADD", "Sub": "SUB", "Mul": "MUL", "Div": "REALDIV", "Pow": "POW", "Equal": "EQUAL",
          "Greater": "GREATER", "Less": "LESS", "GreaterOrEqual": "GREATER_EQUAL", "LessOrEqual": "LESS_EQUAL",
          "Max": "MAXIMUM", "Min": "MINIMUM", "Mod": "MOD", "Sum": "ADD", "Mean": "ADD"}
FLT_MAX = 3.4028234663852886e38


def unary(ctx, x, out, op_type, name):
    ctx.emit("UnaryOp", [x], [out], {"opType": op_type, "T": "DT_FLOAT"}, name)


def binary(ctx, a, b, out, op_type, name):
    ctx.emit("BinaryOp", [a, b], [out], {"opType": op_type, "T": "DT_FLOAT", "activationType": 0}, name)


@converts(*UNARY)
def unary_op(ctx, node, a):
    unary(ctx, node.input[0], node.output[0], UNARY[node.op_type], node.name)


def _variadic(ctx, node, op):
    """Sum/Mean/Max/Min of N inputs as a chain of broadcasting BinaryOps (Mean: the sum times 1/N)."""
    ins = [i for i in node.input if i]
    out = node.output[0]
    if len(ins) == 1:
        ctx.emit("Identity", ins, [out], {}, node.name)
        return
    acc = ins[0]
    last = len(ins) - 1 if node.op_type != "Mean" else len(ins)
    for k, x in enumerate(ins[1:], 1):
        dst = out if k == last else ctx.tmp(f"{out}_{k}")
        binary(ctx, acc, x, dst, op, f"{node.name}_{k}" if dst != out else node.name)
        acc = dst
    if node.op_type == "Mean":
        binary(ctx, acc, ctx.float_const(node.name + "_inv", 1.0 / len(ins)), out, "MUL", node.name)


@converts(*BINARY)
def binary_op(ctx, node, a):
    op = BINARY[node.op_type]
    if node.op_type in ("Max", "Min", "Sum", "Mean") and len([i for i in node.input if i]) != 2 or \
            node.op_type == "Mean":
        _variadic(ctx, node, op)
        return
    if node.op_type == "Pow" and not (ctx.dtype(node.input[0]).startswith("float") and
                                      ctx.dtype(node.input[1]).startswith("float")):
        _pow_through_float(ctx, node)
        return
    if node.op_type == "Mod":
        # MNN's MOD and FLOORMOD swap meaning between floats and integers (ir/ops/elementwise)
        integer = ctx.dtype(node.input[0]).startswith(("int", "uint"))
        c_fmod = bool(a.get("fmod", 0))
        op = "FLOORMOD" if c_fmod == integer else "MOD"
        divisor = ctx.const(node.input[1])
        if not integer and not c_fmod and (divisor is None or not np.isfinite(divisor).all()):
            _floor_mod_through_fmod(ctx, node)
            return
    binary(ctx, node.input[0], node.input[1], node.output[0], op, node.name)


def _floor_mod_through_fmod(ctx, node):
    """Float Mod with fmod=0 (the divisor's sign) as C fmod, plus the divisor where the remainder is
    nonzero and its sign differs from the divisor's. MNN's FLOORMOD is x - floor(x / y) * y, which gives
    NaN for an infinite divisor where ONNX gives x (same signs) or y (measured, MNN 3.6); C fmod keeps x.
    Used where the divisor is computed at run time or holds infinities."""
    x, y, out, name = node.input[0], node.input[1], node.output[0], node.name
    r, rneg, yneg, differ, nonzero, fix, shifted = (
        ctx.tmp(f"{out}_{t}") for t in ("fmod", "rneg", "yneg", "differ", "nonzero", "fix", "shifted"))
    zero = ctx.float_const(name + "_zero", 0.0)
    binary(ctx, x, y, r, "MOD", name + "_fmod")
    binary(ctx, r, zero, rneg, "LESS", name + "_rneg")
    binary(ctx, y, zero, yneg, "LESS", name + "_yneg")
    binary(ctx, rneg, yneg, differ, "NOTEQUAL", name + "_differ")
    binary(ctx, r, zero, nonzero, "NOTEQUAL", name + "_nonzero")
    binary(ctx, differ, nonzero, fix, "MUL", name + "_fix")
    binary(ctx, r, y, shifted, "ADD", name + "_shifted")
    ctx.emit("Select", [fix, shifted, r], [out], {}, name)


def _pow_through_float(ctx, node):
    """MNN's POW runs on float32 operands of one type only: integer operands go through float, and an
    integer base gets its result back as int32."""
    fl = []
    for k, v in enumerate(node.input[:2]):
        if ctx.dtype(v).startswith("float"):
            fl.append(v)
            continue
        t = ctx.tmp(f"{node.output[0]}_f{k}")
        ctx.emit("Cast", [v], [t], {"dstT": "DT_FLOAT"}, t)
        fl.append(t)
    if ctx.dtype(node.input[0]).startswith("float"):
        binary(ctx, fl[0], fl[1], node.output[0], "POW", node.name)
        return
    pf = ctx.tmp(node.output[0] + "_pf")
    binary(ctx, fl[0], fl[1], pf, "POW", pf)
    ctx.g.info(node.output[0]).dtype = "int32"
    ctx.emit("Cast", [pf], [node.output[0]], {"dstT": "DT_INT32"}, node.name)


@converts("Gelu")
def gelu(ctx, node, a):
    approx = a.get("approximate", b"none")
    approx = approx.decode() if isinstance(approx, bytes) else approx
    unary(ctx, node.input[0], node.output[0], "GELU" if approx == "tanh" else "GELU_STANDARD", node.name)


@converts("Relu")
def relu(ctx, node, a):
    ctx.emit("ReLU", [node.input[0]], [node.output[0]], {"slope": 0.0}, node.name)


@converts("LeakyRelu")
def leaky_relu(ctx, node, a):
    ctx.emit("ReLU", [node.input[0]], [node.output[0]], {"slope": float(a.get("alpha", 0.01))}, node.name)


@converts("Clip")
def clip(ctx, node, a):
    """ReLU6 with the bounds when they are float constants; else MAXIMUM/MINIMUM with the bound tensors
    (run-time bounds, integer inputs), as MNN's converter does."""
    x, out = node.input[0], node.output[0]
    bounds = [node.input[k] if len(node.input) > k and node.input[k] else None for k in (1, 2)]
    values = [ctx.const(b) if b else None for b in bounds]
    integer = ctx.dtype(x).startswith(("int", "uint"))
    if not integer and all(b is None or v is not None for b, v in zip(bounds, values)):
        lo = float(values[0]) if bounds[0] else a.get("min", -FLT_MAX)
        hi = float(values[1]) if bounds[1] else a.get("max", FLT_MAX)
        ctx.emit("ReLU6", [x], [out], {"minValue": float(lo), "maxValue": float(hi)}, node.name)
        return
    if bounds == [None, None] and ("min" in a or "max" in a):    # opset 6 attributes on an integer input
        bounds = [ctx.float_const(node.name + "_min", a["min"]) if "min" in a else None,
                  ctx.float_const(node.name + "_max", a["max"]) if "max" in a else None]
    steps = [(b, op) for b, op in zip(bounds, ("MAXIMUM", "MINIMUM")) if b]
    if not steps:
        ctx.emit("Identity", [x], [out], {}, node.name)
        return
    acc = x
    for k, (b, op) in enumerate(steps):
        dst = out if k == len(steps) - 1 else ctx.tmp(out + "_lo")
        binary(ctx, acc, b, dst, op, node.name if dst == out else node.name + "_lo")
        acc = dst


@converts("HardSigmoid")
def hard_sigmoid(ctx, node, a):
    alpha, beta = float(a.get("alpha", 0.2)), float(a.get("beta", 0.5))
    t1, t2 = ctx.tmp(node.output[0] + "_mul"), ctx.tmp(node.output[0] + "_add")
    binary(ctx, node.input[0], ctx.float_const(node.name + "_alpha", alpha), t1, "MUL", node.name + "_mul")
    binary(ctx, t1, ctx.float_const(node.name + "_beta", beta), t2, "ADD", node.name + "_add")
    ctx.emit("ReLU6", [t2], [node.output[0]], {"minValue": 0.0, "maxValue": 1.0}, node.name)


@converts("PRelu")
def prelu(ctx, node, a):
    slope = ctx.const(node.input[1])
    rank = ctx.rank(node.input[0])
    if slope is not None and ctx.opset < 7 and slope.ndim == 1 and slope.size > 1 and rank and rank > 2:
        # before opset 7 a 1-D slope is per channel (axis 1), not broadcast from the right
        slope = slope.reshape((-1,) + (1,) * (rank - 2))
        node.input[1] = ctx.float_const(node.name + "_slope", slope)
    if slope is not None and ctx.rank(node.input[0]) == 4 and slope.size in (1,) + tuple(
            [s for s in [ctx.shape(node.input[0])[1]] if isinstance(s, int)]):
        channels = ctx.shape(node.input[0])[1]
        s = np.broadcast_to(slope.reshape(-1), (channels,)).astype(np.float32)
        ctx.emit("PReLU", [node.input[0]], [node.output[0]], {"slopeCount": int(channels), "slope": s.copy()},
                 node.name)
        return
    # general form: x < 0 ? x * slope : x
    neg, prod = ctx.tmp(node.output[0] + "_neg"), ctx.tmp(node.output[0] + "_prod")
    binary(ctx, node.input[0], ctx.float_const(node.name + "_zero", 0.0), neg, "LESS", node.name + "_less")
    binary(ctx, node.input[0], node.input[1], prod, "MUL", node.name + "_mul")
    ctx.emit("Select", [neg, prod, node.input[0]], [node.output[0]], {}, node.name)


def coerced_2d(ctx, node, a):
    """Before opset 13, Softmax, LogSoftmax and Hardmax (default axis 1) work on the input flattened to
    [prod(dims before axis), prod(dims from axis)]. Returns (input to use, axis, output to restore or None):
    the flattening is a Reshape, undone after, unless the axis is already the last."""
    rank = ctx.rank(node.input[0])
    if ctx.opset >= 13:
        return node.input[0], int(a.get("axis", -1)), None
    axis = int(a.get("axis", 1))
    if rank is None and axis < 0 and axis != -1:
        raise MnnToolError(f"{ctx.path}: {node.op_type} '{node.name}': opset {ctx.opset} needs the input's rank")
    if rank is not None:
        axis %= rank
    if axis == -1 or (rank is not None and axis == rank - 1):
        return node.input[0], -1, None
    flat = ctx.tmp(node.output[0] + "_2d")
    ctx.emit("Reshape", [node.input[0], ctx.int_const(node.name + "_2d", [0] * axis + [-1] if axis else [1, -1])],
             [flat], {"dimType": "NCHW"}, node.name + "_2d")
    return flat, -1, node.input[0]


def _restore(ctx, node, y, like):
    shape = ctx.tmp(node.output[0] + "_shape")
    ctx.emit("Shape", [like], [shape], {}, node.name + "_shape", fmt="NCHW")
    ctx.emit("Reshape", [y, shape], [node.output[0]], {"dimType": "NCHW"}, node.name + "_back")


@converts("Softmax")
def softmax(ctx, node, a):
    x, axis, like = coerced_2d(ctx, node, a)
    y = ctx.tmp(node.output[0] + "_sm") if like else node.output[0]
    ctx.emit("Softmax", [x], [y], {"axis": axis}, node.name)
    if like:
        _restore(ctx, node, y, like)


@converts("LogSoftmax")
def log_softmax(ctx, node, a):
    x, axis, like = coerced_2d(ctx, node, a)
    out = ctx.tmp(node.output[0] + "_lsm") if like else node.output[0]
    _log_softmax(ctx, node, x, axis, out)
    if like:
        _restore(ctx, node, out, like)


def _log_softmax(ctx, node, x, axis, out):
    mx, sub, ex, sm, lg = (ctx.tmp(out + s) for s in ("_max", "_sub", "_exp", "_sum", "_log"))
    ctx.emit("Reduction", [x], [mx], {"operation": "MAXIMUM", "dim": [axis], "keepDims": True}, node.name + "_max")
    binary(ctx, x, mx, sub, "SUB", node.name + "_sub")
    unary(ctx, sub, ex, "EXP", node.name + "_exp")
    ctx.emit("Reduction", [ex], [sm], {"operation": "SUM", "dim": [axis], "keepDims": True}, node.name + "_sum")
    unary(ctx, sm, lg, "LOG", node.name + "_log")
    binary(ctx, sub, lg, out, "SUB", node.name)


@converts("Where")
def where(ctx, node, a):
    """MNN's Select broadcasts only single elements: operands of other shapes are expanded first (when
    the shapes are known)."""
    ins = list(node.input)
    shapes = [ctx.shape(i) if ctx.shape(i) is not None else
              (tuple(ctx.g.constants[i].shape) if i in ctx.g.constants else None) for i in ins]
    if all(s is not None and all(isinstance(d, (int, np.integer)) for d in s) for s in shapes):
        full = tuple(np.broadcast_shapes(*[tuple(int(d) for d in s) for s in shapes]))
        for k, (i, s) in enumerate(zip(ins, shapes)):
            if tuple(s) != full and int(np.prod(s)) != 1:
                wide = ctx.tmp(f"{node.output[0]}_in{k}")
                ctx.emit("BroadcastTo", [i, ctx.int_const(f"{wide}_shape", list(full))], [wide], {}, wide)
                ins[k] = wide
    ctx.emit("Select", ins, [node.output[0]], {}, node.name)


REDUCE = {"ReduceMean": "MEAN", "ReduceSum": "SUM", "ReduceMax": "MAXIMUM", "ReduceMin": "MINIMUM",
          "ReduceProd": "PROD", "ReduceSumSquare": "SUM", "ReduceL1": "SUM", "ReduceL2": "SUM",
          "ReduceLogSum": "SUM", "ReduceLogSumExp": "SUM"}
# MNN's CPU Reduction has no ASUM/SUMSQ kernels ("Create execution error"): |x| and x^2 go first
REDUCE_PRE = {"ReduceL1": "ABS", "ReduceL2": "SQUARE", "ReduceSumSquare": "SQUARE", "ReduceLogSumExp": "EXP"}


@converts(*REDUCE)
def reduce(ctx, node, a):
    """Reduction with constant axes in the table, or the axes tensor as a 2nd input (MNN reads it at run
    time); L2, LogSum and LogSumExp add their square root, log and exp around it."""
    x, out = node.input[0], node.output[0]
    axes_in = node.input[1] if len(node.input) > 1 and node.input[1] else None
    axes = a.get("axes")
    if axes is None and axes_in is not None and ctx.shape(axes_in) == (0,):   # statically empty
        axes, axes_in = [], None
    if axes is None and axes_in is not None and ctx.const(axes_in) is not None:
        axes = ctx.const(axes_in).reshape(-1).tolist()
        axes_in = None
    keep = bool(a.get("keepdims", 1))
    noop = a.get("noop_with_empty_axes", 0)
    if axes is not None and len(axes) == 0 and axes_in is None and noop:
        axes = None
        if node.op_type in ("ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"):
            pre = {"ReduceL1": "ABS", "ReduceL2": "ABS", "ReduceSumSquare": "SQUARE", "ReduceLogSum": None,
                   "ReduceLogSumExp": None}[node.op_type]
            if node.op_type == "ReduceLogSum":
                unary(ctx, x, out, "LOG", node.name)
            elif pre:
                unary(ctx, x, out, pre, node.name)
            else:
                ctx.emit("Identity", [x], [out], {}, node.name)
            return
        ctx.emit("Identity", [x], [out], {}, node.name)
        return
    param = {"operation": REDUCE[node.op_type], "keepDims": keep, "dType": "DT_FLOAT"}
    if axes:
        param["dim"] = [int(v) for v in axes]
    elif axes_in is None and ctx.rank(x) is not None:     # every axis, spelled out (MNN reduces none without)
        param["dim"] = list(range(ctx.rank(x)))
    src = x
    if node.op_type in REDUCE_PRE:
        src = ctx.tmp(out + "_pre")
        unary(ctx, x, src, REDUCE_PRE[node.op_type], node.name + "_pre")
    post = {"ReduceL2": "SQRT", "ReduceLogSum": "LOG", "ReduceLogSumExp": "LOG"}.get(node.op_type)
    red = ctx.tmp(out + "_red") if post else out
    ins = [src] + ([axes_in] if axes_in else [])
    ctx.emit("Reduction", ins, [red], param, node.name if not post else node.name + "_red")
    if post:
        unary(ctx, red, out, post, node.name)

class _Out:
    """Stands for a node in _chain: where the chain writes and how its ops are named."""
    def __init__(self, out, name):
        self.output, self.name = [out], name


def _chain(ctx, node, steps):
    """Emit ops given as (op, inputs, param) with inputs naming earlier results by index ('$0') or
    tensors; the last writes the node's output."""
    names = []
    for k, (op, ins, param) in enumerate(steps):
        out = node.output[0] if k == len(steps) - 1 else ctx.tmp(f"{node.output[0]}_{k}")
        ins = [names[int(i[1:])] if isinstance(i, str) and i.startswith("$") else i for i in ins]
        ctx.emit(op, ins, [out], param, node.name if out == node.output[0] else f"{node.name}_{k}")
        names.append(out)


def _u(op):
    return {"opType": op, "T": "DT_FLOAT"}


def _b(op):
    return {"opType": op, "T": "DT_FLOAT", "activationType": 0}


@converts("Softplus")
def softplus(ctx, node, a):
    _chain(ctx, node, [("UnaryOp", [node.input[0]], _u("EXP")),
                       ("BinaryOp", ["$0", ctx.float_const(node.name + "_one", 1.0)], _b("ADD")),
                       ("UnaryOp", ["$1"], _u("LOG"))])


@converts("Softsign")
def softsign(ctx, node, a):
    _chain(ctx, node, [("UnaryOp", [node.input[0]], _u("ABS")),
                       ("BinaryOp", ["$0", ctx.float_const(node.name + "_one", 1.0)], _b("ADD")),
                       ("BinaryOp", [node.input[0], "$1"], _b("REALDIV"))])


@converts("Mish")
def mish(ctx, node, a):
    _chain(ctx, node, [("UnaryOp", [node.input[0]], _u("EXP")),
                       ("BinaryOp", ["$0", ctx.float_const(node.name + "_one", 1.0)], _b("ADD")),
                       ("UnaryOp", ["$1"], _u("LOG")), ("UnaryOp", ["$2"], _u("TANH")),
                       ("BinaryOp", [node.input[0], "$3"], _b("MUL"))])


@converts("Swish")
def swish(ctx, node, a):
    x = node.input[0]
    alpha = float(a.get("alpha", 1.0))
    if alpha == 1.0:
        _chain(ctx, node, [("Sigmoid", [x], {}), ("BinaryOp", [x, "$0"], _b("MUL"))])
        return
    _chain(ctx, node, [("BinaryOp", [x, ctx.float_const(node.name + "_alpha", alpha)], _b("MUL")),
                       ("Sigmoid", ["$0"], {}), ("BinaryOp", [x, "$1"], _b("MUL"))])


@converts("Elu")
def elu(ctx, node, a):
    ctx.emit("ELU", [node.input[0]], [node.output[0]], {"alpha": float(a.get("alpha", 1.0))}, node.name)


@converts("Selu")
def selu(ctx, node, a):
    ctx.emit("Selu", [node.input[0]], [node.output[0]],
             {"scale": float(a.get("gamma", 1.0507009873554805)), "alpha": float(a.get("alpha", 1.6732632423543772))},
             node.name)


@converts("Celu")
def celu(ctx, node, a):
    x = node.input[0]
    alpha = float(a.get("alpha", 1.0))
    _chain(ctx, node, [("BinaryOp", [x, ctx.float_const(node.name + "_zero", 0.0)], _b("LESS")),
                       ("BinaryOp", [x, ctx.float_const(node.name + "_inv", 1.0 / alpha)], _b("MUL")),
                       ("UnaryOp", ["$1"], _u("EXP")),
                       ("BinaryOp", ["$2", ctx.float_const(node.name + "_one", 1.0)], _b("SUB")),
                       ("BinaryOp", ["$3", ctx.float_const(node.name + "_alpha", alpha)], _b("MUL")),
                       ("Select", ["$0", "$4", x], {})])


@converts("ThresholdedRelu")
def thresholded_relu(ctx, node, a):
    x = node.input[0]
    _chain(ctx, node, [("BinaryOp", [x, ctx.float_const(node.name + "_alpha", float(a.get("alpha", 1.0)))], _b("GREATER")),
                       ("Select", ["$0", x, ctx.float_const(node.name + "_zero", 0.0)], {})])


@converts("Shrink")
def shrink(ctx, node, a):
    x = node.input[0]
    lambd, bias = float(a.get("lambd", 0.5)), float(a.get("bias", 0.0))
    integer = ctx.dtype(x).startswith(("int", "uint"))
    c = ctx.int_const if integer else ctx.float_const
    _chain(ctx, node, [("BinaryOp", [x, c(node.name + "_l", lambd)], _b("GREATER")),
                       ("BinaryOp", [x, c(node.name + "_nl", -lambd)], _b("LESS")),
                       ("BinaryOp", [x, c(node.name + "_b", bias)], _b("SUB")),
                       ("BinaryOp", [x, c(node.name + "_b2", bias)], _b("ADD")),
                       ("Select", ["$1", "$3", c(node.name + "_zero", 0)], {}),
                       ("Select", ["$0", "$2", "$4"], {})])


@converts("Round")
def round_even_op(ctx, node, a):
    round_half_even(ctx, node.input[0], node.output[0], node.name)


def round_half_even(ctx, x, out, name):
    """Halves to even (ONNX, numpy) from MNN's ROUND, which rounds them away from zero: where x is a tie
    and the rounded value is odd, step back toward zero."""
    half, two, one = (ctx.float_const(f"{name}_{k}", v) for k, v in (("half", 0.5), ("two", 2.0), ("one", 1.0)))
    _chain(ctx, _Out(out, name), [("UnaryOp", [x], _u("ROUND")),                      # $0
                       ("UnaryOp", [x], _u("FLOOR")),                      # $1
                       ("BinaryOp", [x, "$1"], _b("SUB")),                 # $2 fraction
                       ("BinaryOp", ["$2", half], _b("EQUAL")),            # $3 tie
                       ("BinaryOp", ["$0", two], _b("FLOORMOD")),          # $4 1 where odd
                       ("BinaryOp", ["$4", one], _b("EQUAL")),             # $5 odd
                       ("BinaryOp", ["$3", "$5"], _b("MUL")),              # $6 tie and odd
                       ("UnaryOp", [x], _u("SIGN")),                       # $7
                       ("BinaryOp", ["$0", "$7"], _b("SUB")),              # $8
                       ("Select", ["$6", "$8", "$0"], {})])
