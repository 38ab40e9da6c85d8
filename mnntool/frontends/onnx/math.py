"""ONNX activations and elementwise arithmetic -> IR."""
from __future__ import annotations

import numpy as np

from ...errors import MnnToolError
from .nn import converts

UNARY = {"Sigmoid": "SIGMOID", "Tanh": "TANH", "Sqrt": "SQRT", "Exp": "EXP", "Log": "LOG", "Abs": "ABS",
         "Neg": "NEG", "Reciprocal": "RECIPROCAL", "Floor": "FLOOR", "Ceil": "CEIL", "Erf": "ERF",
         "HardSwish": "HARDSWISH", "Sin": "SIN", "Cos": "COS", "Round": "ROUND", "Sign": "SIGN"}
BINARY = {"Add": "ADD", "Sub": "SUB", "Mul": "MUL", "Div": "REALDIV", "Pow": "POW", "Equal": "EQUAL",
          "Greater": "GREATER", "Less": "LESS", "GreaterOrEqual": "GREATER_EQUAL", "LessOrEqual": "LESS_EQUAL",
          "Max": "MAXIMUM", "Min": "MINIMUM", "Mod": "MOD"}
FLT_MAX = 3.4028234663852886e38


def unary(ctx, x, out, op_type, name):
    ctx.emit("UnaryOp", [x], [out], {"opType": op_type, "T": "DT_FLOAT"}, name)


def binary(ctx, a, b, out, op_type, name):
    ctx.emit("BinaryOp", [a, b], [out], {"opType": op_type, "T": "DT_FLOAT", "activationType": 0}, name)


@converts(*UNARY)
def unary_op(ctx, node, a):
    unary(ctx, node.input[0], node.output[0], UNARY[node.op_type], node.name)


@converts(*BINARY)
def binary_op(ctx, node, a):
    if node.op_type in ("Max", "Min") and len(node.input) != 2:
        raise MnnToolError(f"{ctx.path}: {node.op_type} '{node.name}': only two inputs are supported")
    op = BINARY[node.op_type]
    if node.op_type == "Mod":
        # MNN's MOD and FLOORMOD swap meaning between floats and integers (ir/ops/elementwise)
        integer = ctx.dtype(node.input[0]).startswith(("int", "uint"))
        c_fmod = bool(a.get("fmod", 0))
        op = "FLOORMOD" if c_fmod == integer else "MOD"
    binary(ctx, node.input[0], node.input[1], node.output[0], op, node.name)


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
    lo, hi = a.get("min", -FLT_MAX), a.get("max", FLT_MAX)
    if len(node.input) > 1 and node.input[1]:
        lo = float(ctx.need_const(node, 1, "min"))
    if len(node.input) > 2 and node.input[2]:
        hi = float(ctx.need_const(node, 2, "max"))
    ctx.emit("ReLU6", [node.input[0]], [node.output[0]], {"minValue": float(lo), "maxValue": float(hi)}, node.name)


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


@converts("Softmax")
def softmax(ctx, node, a):
    ctx.emit("Softmax", [node.input[0]], [node.output[0]], {"axis": int(a.get("axis", -1))}, node.name)


@converts("LogSoftmax")
def log_softmax(ctx, node, a):
    axis = int(a.get("axis", -1))
    x, out = node.input[0], node.output[0]
    mx, sub, ex, sm, lg = (ctx.tmp(out + s) for s in ("_max", "_sub", "_exp", "_sum", "_log"))
    ctx.emit("Reduction", [x], [mx], {"operation": "MAXIMUM", "dim": [axis], "keepDims": True}, node.name + "_max")
    binary(ctx, x, mx, sub, "SUB", node.name + "_sub")
    unary(ctx, sub, ex, "EXP", node.name + "_exp")
    ctx.emit("Reduction", [ex], [sm], {"operation": "SUM", "dim": [axis], "keepDims": True}, node.name + "_sum")
    unary(ctx, sm, lg, "LOG", node.name + "_log")
    binary(ctx, sub, lg, out, "SUB", node.name)


@converts("Where")
def where(ctx, node, a):
    ctx.emit("Select", list(node.input), [node.output[0]], {}, node.name)


REDUCE = {"ReduceMean": "MEAN", "ReduceSum": "SUM", "ReduceMax": "MAXIMUM", "ReduceMin": "MINIMUM",
          "ReduceProd": "PROD", "ReduceSumSquare": "SUMSQ"}


@converts(*REDUCE)
def reduce(ctx, node, a):
    axes = a.get("axes")
    if axes is None and len(node.input) > 1 and node.input[1]:
        axes = ctx.need_const(node, 1, "axes").reshape(-1).tolist()
    param = {"operation": REDUCE[node.op_type], "keepDims": bool(a.get("keepdims", 1)), "dType": "DT_FLOAT"}
    if axes:
        param["dim"] = [int(x) for x in axes]
    elif a.get("noop_with_empty_axes", 0):
        ctx.emit("Identity", [node.input[0]], [node.output[0]], {}, node.name)
        return
    ctx.emit("Reduction", [node.input[0]], [node.output[0]], param, node.name)
