"""ONNX logic and bit ops -> IR. MNN carries booleans as int32 0/1, so And is a product and Not is 1 - x
(as MNN's own converter writes them); comparisons give 0/1 too."""
from __future__ import annotations

import numpy as np

from .math import binary
from .registry import converts

LOGIC = {"And": "MUL", "Or": "LOGICALOR", "Xor": "NOTEQUAL", "BitwiseAnd": "BITWISE_AND",
         "BitwiseOr": "BITWISE_OR", "BitwiseXor": "BITWISE_XOR"}
INT_MAX = {"uint8": 255, "uint16": 65535, "uint32": 2**32 - 1, "uint64": 2**64 - 1}


@converts(*LOGIC)
def logic(ctx, node, a):
    binary(ctx, node.input[0], node.input[1], node.output[0], LOGIC[node.op_type], node.name)


@converts("Not")
def not_(ctx, node, a):
    binary(ctx, ctx.int_const(node.name + "_one", 1), node.input[0], node.output[0], "SUB", node.name)


@converts("BitwiseNot")
def bitwise_not(ctx, node, a):
    """x XOR all-ones of the source type: -1 for signed types, 2^bits - 1 for unsigned ones (carried in
    int32, so uint8's 255 - x comes out right)."""
    ones = INT_MAX.get(ctx.dtype(node.input[0]), -1)
    binary(ctx, node.input[0], ctx.int_const(node.name + "_ones", np.int64(ones).astype(np.int32)),
           node.output[0], "BITWISE_XOR", node.name)


@converts("BitShift")
def bit_shift(ctx, node, a):
    d = a.get("direction", b"LEFT")
    d = d.decode() if isinstance(d, bytes) else d
    binary(ctx, node.input[0], node.input[1], node.output[0], "LEFTSHIFT" if d == "LEFT" else "RIGHTSHIFT",
           node.name)


@converts("IsNaN")
def is_nan(ctx, node, a):
    binary(ctx, node.input[0], node.input[0], node.output[0], "NOTEQUAL", node.name)


@converts("IsInf")
def is_inf(ctx, node, a):
    pos, neg = int(a.get("detect_positive", 1)), int(a.get("detect_negative", 1))
    x, out = node.input[0], node.output[0]
    if pos and neg:
        absx = ctx.tmp(out + "_abs")
        ctx.emit("UnaryOp", [x], [absx], {"opType": "ABS", "T": "DT_FLOAT"}, node.name + "_abs")
        binary(ctx, absx, ctx.float_const(node.name + "_inf", np.inf), out, "EQUAL", node.name)
    elif pos or neg:
        binary(ctx, x, ctx.float_const(node.name + "_inf", np.inf if pos else -np.inf), out, "EQUAL", node.name)
    else:
        binary(ctx, x, x, out, "NOTEQUAL", node.name)      # nothing detected: all false (NaN aside... x!=x)
