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
    """ONNX gives shifts outside [0, bits) a meaning (0 to the left; the sign, 0 or -1, to the right) and
    wraps a left shift to the element's width. MNN shifts int32 with C's << and >> (undefined for such
    counts; wrong values in MNN 3.6, measured) on values of every integer type carried as int32. So the count is
    guarded: out of range, a left shift gives 0 and a right shift shifts by bits - 1 (signed) or gives 0
    (unsigned); a left shift of a type narrower than 32 bits is wrapped back to it."""
    d = a.get("direction", b"LEFT")
    left = (d.decode() if isinstance(d, bytes) else d) == "LEFT"
    x, y, out, name = node.input[0], node.input[1], node.output[0], node.name
    dt = np.dtype(ctx.dtype(x))
    bits, signed = dt.itemsize * 8, dt.kind == "i"
    op = "LEFTSHIFT" if left else "RIGHTSHIFT"
    wrap = left and bits < 32
    yc = ctx.const(y)
    shifted = ctx.tmp(out + "_shifted") if wrap else out
    if yc is not None and ((np.asarray(yc) >= 0) & (np.asarray(yc) < bits)).all():
        binary(ctx, x, y, shifted, op, name if not wrap else name + "_shift")
    else:
        neg, wide, oor, keep, count = (ctx.tmp(f"{out}_{t}") for t in ("neg", "wide", "oor", "keep", "count"))
        binary(ctx, y, ctx.int_const(name + "_zero", 0), neg, "LESS", name + "_neg")
        binary(ctx, y, ctx.int_const(name + "_bits", bits), wide, "GREATER_EQUAL", name + "_wide")
        binary(ctx, neg, wide, oor, "LOGICALOR", name + "_oor")
        binary(ctx, ctx.int_const(name + "_one", 1), oor, keep, "SUB", name + "_keep")
        binary(ctx, y, keep, count, "MUL", name + "_count")            # in range: y, else 0
        if not left and signed:                                         # else bits - 1: the sign
            full = ctx.tmp(out + "_full")
            binary(ctx, oor, ctx.int_const(name + "_top", bits - 1), full, "MUL", name + "_top")
            count2 = ctx.tmp(out + "_count2")
            binary(ctx, count, full, count2, "ADD", name + "_count2")
            binary(ctx, x, count2, shifted, op, name if shifted == out else name + "_shift")
        else:
            raw = ctx.tmp(out + "_raw")
            binary(ctx, x, count, raw, op, name + "_shift")
            binary(ctx, raw, keep, shifted, "MUL", name if shifted == out else name + "_guard")
    if wrap:                                                            # back to the element's width
        mask = ctx.int_const(name + "_mask", (1 << bits) - 1)
        if signed:
            half = 1 << (bits - 1)
            up, low = ctx.tmp(out + "_up"), ctx.tmp(out + "_low")
            binary(ctx, shifted, ctx.int_const(name + "_half", half), up, "ADD", name + "_up")
            binary(ctx, up, mask, low, "BITWISE_AND", name + "_low")
            binary(ctx, low, ctx.int_const(name + "_half2", half), out, "SUB", name)
        else:
            binary(ctx, shifted, mask, out, "BITWISE_AND", name)


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
