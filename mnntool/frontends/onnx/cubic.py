"""ONNX cubic Resize as gathers and arithmetic, one spatial axis at a time.

Why not MNN's Interp (resizeType 3): MNN 3.6's CPU kernel takes a source coordinate's integer part with
a C cast (toward zero) but its fraction from floor(), so every output whose source coordinate lies in
(-1, 0) - the first rows and columns of a half-pixel upsampling - reads the wrong four neighbours (3.9
off on the node suite's 4x4 -> 8x8 case, measured); it also fixes the coefficient A at -0.75 and has no
exclude_outside, and ONNX's align_corners divides by the unrounded output length. Here each output
position's source coordinate, its four neighbours (clamped to the edge, as ONNX's edge padding does) and
their weights are computed with Range, Floor, GatherV2 and BinaryOps, which MNN and mnntool's runtime
both compute as ONNX means them, with scales or sizes known at convert time or only at run time.

The common case - a half-pixel upsampling by whole factors with A = -0.75 and a known input size - keeps
MNN's Interp (about 3x faster in MNN than the gathers): the input gets one edge-replicated row and column
in front, so every kept source coordinate is positive, and the k rows (columns) the extra one yields at
the front of the output are cut off (interp_on_padded).
"""
from __future__ import annotations

import numpy as np

from .math import binary, unary

MNN_CUBIC_A = -0.75     # the only coefficient MNN's Interp kernel computes (ResizeFunction.cpp)


def needs_decomposition(ctm: str, coeff_a: float, exclude_outside: bool, value=None, is_scales=True,
                        shape=None) -> bool:
    """True where MNN's Interp would not give ONNX's values: a source coordinate that can be negative
    (half-pixel modes upsampling), another A, exclude_outside, align_corners' unrounded length (its
    Interp is right where the output length is the input's times the scale exactly, known now)."""
    if coeff_a != MNN_CUBIC_A or exclude_outside:
        return True
    if ctm in ("asymmetric", "tf_half_pixel_for_nn"):
        return False
    if ctm == "align_corners" and value is not None and shape is not None and \
            all(isinstance(d, int) for d in shape[2:4]):
        v = np.asarray(value, np.float64).reshape(-1)
        return is_scales and any(float(v[a]) * shape[a] != int(float(v[a]) * shape[a]) for a in (2, 3))
    return True


class _Emit:
    """Small helpers naming every tensor after the node."""

    def __init__(self, ctx, name: str):
        self.ctx, self.name, self.k = ctx, name, 0

    def t(self, tag: str) -> str:
        self.k += 1
        return self.ctx.tmp(f"{self.name}_cubic_{tag}{self.k}")

    def f(self, v) -> str:
        self.k += 1
        return self.ctx.float_const(f"{self.name}_cubic_c{self.k}", v)

    def i(self, v) -> str:
        self.k += 1
        return self.ctx.int_const(f"{self.name}_cubic_i{self.k}", v)

    def bin(self, a, b, op: str, tag: str = "b") -> str:
        out = self.t(tag)
        binary(self.ctx, a, b, out, op, out)
        return out

    def un(self, a, op: str, tag: str = "u") -> str:
        out = self.t(tag)
        unary(self.ctx, a, out, op, out)
        return out

    def cast(self, a, dst: str) -> str:
        out = self.t("cast")
        self.ctx.emit("Cast", [a], [out], {"dstT": dst}, out)
        return out

    def pick(self, vec, k: int) -> str:
        """Element k of a 1-D tensor, as shape [1]."""
        out = self.t("pick")
        self.ctx.emit("GatherV2", [vec, self.i([k]), self.i([0])], [out], {}, out)
        return out


def _lengths(e: _Emit, x, axis: int, value, operand, is_scales: bool, in_len):
    """(in as float [1], out as int [1], scale as float [1], out_w: ONNX's unrounded output length)."""
    if in_len is not None:
        in_f = e.f([float(in_len)])
    else:
        shape = e.t("shape")
        e.ctx.emit("Shape", [x], [shape], {}, shape, fmt="NCHW")
        in_f = e.cast(e.pick(shape, axis), "DT_FLOAT")
    if value is not None:
        v = np.asarray(value).reshape(-1)[axis]
        if is_scales:
            scale = float(v)
            n_out = int(np.float64(scale) * in_len) if in_len is not None else None
        else:
            n_out, scale = int(v), (float(v) / in_len if in_len is not None else None)
        if n_out is not None and scale is not None:
            return in_f, e.i([n_out]), e.f([scale]), e.f([scale * in_len])
    src = operand if value is None else (e.f(np.asarray(value, np.float32)) if is_scales else e.i(np.asarray(value)))
    if is_scales:
        scale = e.pick(src, axis)
        out_w = e.bin(in_f, scale, "MUL", "outw")
        n_out = e.cast(e.un(out_w, "FLOOR"), "DT_INT32")
    else:
        n_out = e.cast(e.pick(src, axis), "DT_INT32")
        out_w = e.cast(n_out, "DT_FLOAT")
        scale = e.bin(out_w, in_f, "REALDIV", "scale")
    return in_f, n_out, scale, out_w


def _source(e: _Emit, ctm: str, y, in_f, n_out, scale, out_w):
    """ONNX's source coordinate of each output position y (float [out])."""
    if ctm == "align_corners":      # y * (in - 1) / (out_w - 1); 0 where out_w is 1
        one = e.f([1.0])
        span = e.bin(out_w, one, "SUB")
        single = e.cast(e.bin(span, e.f([0.0]), "EQUAL"), "DT_FLOAT")
        safe = e.bin(span, single, "ADD")                 # 1 where out_w - 1 is 0 (y is 0 there)
        return e.bin(y, e.bin(e.bin(in_f, one, "SUB"), safe, "REALDIV"), "MUL")
    x = e.bin(y, scale, "REALDIV") if ctm == "asymmetric" else \
        e.bin(e.bin(y, e.f([0.5]), "ADD"), scale, "REALDIV")
    if ctm in ("half_pixel", "pytorch_half_pixel"):
        x = e.bin(x, e.f([0.5]), "SUB")
    if ctm == "half_pixel_symmetric":     # offset + (y + 0.5) / scale - 0.5, offset = in/2 (1 - out/out_w)
        adj = e.bin(e.cast(n_out, "DT_FLOAT"), out_w, "REALDIV")
        offset = e.bin(e.bin(in_f, e.f([0.5]), "MUL"), e.bin(e.f([1.0]), adj, "SUB"), "MUL")
        x = e.bin(e.bin(x, offset, "ADD"), e.f([0.5]), "SUB")
    if ctm == "pytorch_half_pixel":        # -0.5 where the output has one position
        one = e.cast(e.bin(n_out, e.i([1]), "EQUAL"), "DT_FLOAT")
        keep = e.bin(e.f([1.0]), one, "SUB")
        x = e.bin(e.bin(x, keep, "MUL"), e.bin(one, e.f([-0.5]), "MUL"), "ADD")
    return x


def _weights(e: _Emit, t, coeff_a: float):
    """The four cubic weights of neighbours floor(x)-1 .. floor(x)+2 at fraction t (ONNX's formulas)."""
    A = coeff_a

    def far(d):       # ((A d - 5A) d + 8A) d - 4A, d in [1, 2]
        p = e.bin(e.bin(d, e.f([A]), "MUL"), e.f([-5 * A]), "ADD")
        p = e.bin(e.bin(p, d, "MUL"), e.f([8 * A]), "ADD")
        return e.bin(e.bin(p, d, "MUL"), e.f([-4 * A]), "ADD")

    def near(d):      # ((A + 2) d - (A + 3)) d d + 1, d in [0, 1]
        p = e.bin(e.bin(d, e.f([A + 2]), "MUL"), e.f([-(A + 3)]), "ADD")
        return e.bin(e.bin(e.bin(p, d, "MUL"), d, "MUL"), e.f([1.0]), "ADD")
    s = e.bin(e.f([1.0]), t, "SUB")
    return [far(e.bin(t, e.f([1.0]), "ADD")), near(t), near(s), far(e.bin(s, e.f([1.0]), "ADD"))]


def resize_axis(ctx, name: str, x, axis: int, rank: int, ctm: str, coeff_a: float, exclude_outside: bool,
                value, operand, is_scales: bool, in_len, out: str) -> None:
    """x resized along `axis` by ONNX's cubic rule into `out` (in_len: the axis' length if known)."""
    e = _Emit(ctx, f"{name}_ax{axis}")
    in_f, n_out, scale, out_w = _lengths(e, x, axis, value, operand, is_scales, in_len)
    count = e.t("n")
    ctx.emit("Reshape", [n_out, e.i([])], [count], {"dimType": "NCHW"}, count)
    pos = e.t("range")
    ctx.emit("Range", [ctx.g.add_const(e.name + "_r0", np.array(0, np.int32)), count,
                       ctx.g.add_const(e.name + "_r1", np.array(1, np.int32))], [pos], {}, pos)
    src = _source(e, ctm, e.cast(pos, "DT_FLOAT"), in_f, n_out, scale, out_w)
    base = e.un(src, "FLOOR")
    weights = _weights(e, e.bin(src, base, "SUB", "frac"), coeff_a)
    last = e.bin(in_f, e.f([1.0]), "SUB")
    taps = []
    for k in range(4):
        idx = e.bin(base, e.f([float(k - 1)]), "ADD", "idx")
        if exclude_outside:      # neighbours outside [0, in) weigh nothing; the rest renormalised
            inside = e.bin(e.cast(e.bin(idx, e.f([0.0]), "GREATER_EQUAL"), "DT_FLOAT"),
                           e.cast(e.bin(idx, last, "LESS_EQUAL"), "DT_FLOAT"), "MUL")
            weights[k] = e.bin(weights[k], inside, "MUL")
        taps.append(e.cast(e.bin(e.bin(idx, e.f([0.0]), "MAXIMUM"), last, "MINIMUM"), "DT_INT32"))
    if exclude_outside:
        total = e.bin(e.bin(weights[0], weights[1], "ADD"), e.bin(weights[2], weights[3], "ADD"), "ADD")
        weights = [e.bin(w, total, "REALDIV") for w in weights]
    trail = [-1] + [1] * (rank - 1 - axis)
    terms = []
    for k in range(4):
        g = e.t("gather")
        ctx.emit("GatherV2", [x, taps[k], e.i([axis])], [g], {}, g)
        w = e.t("w")
        ctx.emit("Reshape", [weights[k], e.i(trail)], [w], {"dimType": "NCHW"}, w)
        terms.append(e.bin(g, w, "MUL", "term"))
    binary(ctx, e.bin(terms[0], terms[1], "ADD", "sum"), e.bin(terms[2], terms[3], "ADD", "sum"), out, "ADD",
           out)


def cubic_resize(ctx, node, x, out, ctm: str, coeff_a: float, exclude_outside: bool, value, operand,
                 is_scales: bool) -> None:
    """Resize of a 4-D x over H then W; an axis left as it is (scale 1, same size) is skipped when known."""
    shape = ctx.shape(x)
    lens = [shape[a] if shape is not None and isinstance(shape[a], int) else None for a in (2, 3)]
    axes = []
    for axis, n in zip((2, 3), lens):
        if value is not None and n is not None:
            v = float(np.asarray(value).reshape(-1)[axis])
            if (is_scales and v == 1.0) or (not is_scales and int(v) == n):
                continue
        axes.append((axis, n))
    if not axes:
        ctx.emit("Identity", [x], [out], {}, node.name)
        return
    cur = x
    for k, (axis, n) in enumerate(axes):
        dst = out if k == len(axes) - 1 else ctx.tmp(f"{out}_h")
        resize_axis(ctx, node.name, cur, axis, 4, ctm, coeff_a, exclude_outside, value, operand, is_scales, n, dst)
        cur = dst


def whole_factors(ctm: str, coeff_a: float, exclude_outside: bool, value, is_scales: bool, shape):
    """(kH, kW), the whole upsampling factors of a half-pixel cubic Resize MNN's Interp computes right on
    an input padded by one row and column in front; None where that does not hold."""
    if ctm not in ("half_pixel", "pytorch_half_pixel") or coeff_a != MNN_CUBIC_A or exclude_outside:
        return None
    if value is None or shape is None or not all(isinstance(d, int) and d > 0 for d in shape[2:4]):
        return None
    v = np.asarray(value, np.float64).reshape(-1)
    if is_scales:
        ks = [float(v[2]), float(v[3])]
    else:
        ks = [float(v[a]) / shape[a] for a in (2, 3)]
    if any(k < 1 or k != int(k) for k in ks) or all(k == 1 for k in ks):
        return None
    return int(ks[0]), int(ks[1])


def interp_on_padded(ctx, node, x, out, param: dict, factors, shape) -> None:
    """MNN's cubic Interp on x with one edge row (column) in front of each upsampled axis, its first k
    output rows (columns) cut: those read the padding, the rest read coordinates >= 0.5."""
    kh, kw = factors
    ph, pw = int(kh > 1), int(kw > 1)
    name = node.name
    padded, resized = ctx.tmp(out + "_edge"), ctx.tmp(out + "_wide")
    ctx.emit("Padding", [x, ctx.int_const(name + "_edge_pads", [0, 0, 0, 0, ph, 0, pw, 0])], [padded],
             {"mode": "EDGE"}, name + "_edge")
    scales = np.array([1, 1, kh, kw], np.float32)
    p = dict(param, heightScale=float(kh), widthScale=float(kw))
    ctx.emit("Interp", [padded, ctx.float_const(name + "_scales", scales)], [resized], p, name, fmt="NCHW")
    h, w = shape[2] * kh, shape[3] * kw
    ins = [resized] + [ctx.int_const(f"{name}_crop_{t}", v) for t, v in
                       (("starts", [ph * kh, pw * kw]), ("ends", [ph * kh + h, pw * kw + w]), ("axes", [2, 3]),
                        ("steps", [1, 1]))]
    ctx.emit("StridedSlice", ins, [out], {"fromType": 1, "T": "DT_FLOAT"}, name + "_crop")
