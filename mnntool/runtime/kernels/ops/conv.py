"""Convolution and deconvolution kernels: int8 layers on the VNNI integer kernel where it applies,
every float layer on the strategy `conv_strategies.pick` chooses for its geometry."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from ..compile.jit import Bound, njit

from ....errors import InvalidModel, MnnToolError
from .. import PLAN_ONLY, Kernel, Scratch, kernel, sized, writes
from ..micro.conv_loops import col2im
from .conv_strategies import Geometry, Layer, build, trimmed
from ..micro.epilogue import NO_GRID, NO_POST, POST, POST_CLIP, POST_LEAKY, activation, apply_act, grid_of, to_grid
from ..micro.float_gemm import OCB, PackedGemm
from ..micro.residual import add_clamped, add_leaky, bounds_of
from .int8_tables import codes_of, looked_up, values_of
from ..weight_cache import node_part
from ....ir.graph import Node
from ....ir.ops.nn import pads_of, same_pads


class _Part(NamedTuple):
    """What a convolution's kernel is built from besides the input shape (kept per node: weight_cache.node_part)."""
    cout: int
    bias: np.ndarray        # float32, (cout,): the kernels' own (read-only to them)
    int8: object            # Int8Grids or None
    window: tuple           # (kh, kw, sh, sw, dh, dw, group, padMode, (t, l, b, r))
    act: int


def _part_of(node) -> _Part:
    param = node.param
    c = param["common"]

    def make():
        cout = c["outputCount"]
        window = (c.get("kernelY", 1), c.get("kernelX", 1), c.get("strideY", 1), c.get("strideX", 1),
                  c.get("dilateY", 1), c.get("dilateX", 1), c.get("group", 1) or 1, c.get("padMode"),
                  (0, 0, 0, 0) if c.get("padMode") in ("SAME", "VALID") else pads_of(c))
        return _Part(cout, np.array(_bias(param, cout), np.float32), int8_scales(node), window, activation(c))
    return node_part("conv", (c, param.get("bias"), param.get("quanParameter"), param.get("symmetricQuan")), make)


def _weight_of(node, cout: int) -> np.ndarray:
    """conv_weight, C-contiguous, kept per node while a session plans (a quantized file's are dequantized once)."""
    param = node.param
    return node_part("conv_weight", (param["common"], param.get("weight"), param.get("quanParameter")),
                     lambda: np.ascontiguousarray(conv_weight(param, cout)))


def _geometry(part: _Part, in_shape, out_shape) -> Geometry:
    """Geometry.of from the part's window: arithmetic only."""
    n, cin, h, w = map(int, in_shape)
    _, cout, oh, ow = map(int, out_shape)
    kh, kw, sh, sw, dh, dw, group, mode, (t, l, b, r) = part.window
    if mode == "SAME":      # from the output size shape inference gave
        (t, b), (l, r) = same_pads(h, oh, kh, sh, dh), same_pads(w, ow, kw, sw, dw)
    return Geometry.made((n, cin, h, w, cout, oh, ow, kh, kw, sh, sw, dh, dw, t, l, b, r, group))


def _tap_live(i: int, k: int, d: int, s: int, pad: int, size: int, out: int) -> bool:
    """Whether some output pixel reads tap i of the axis inside the input (conv_strategies' _live_taps)."""
    lo = pad - i * d
    y0 = max(0, -(-lo // s))
    return y0 < out and y0 * s <= lo + size - 1


def _untrimmed(g: Geometry) -> bool:
    """True where `trimmed` keeps every tap (its first and last taps read the input somewhere), in O(1)."""
    if g.kh == g.kw == 1 and not (g.t or g.l):      # a 1x1 window's one tap reads pixel (0, 0): check held h, w >= 1
        return True
    return (_tap_live(g.kh - 1, g.kh, g.dh, g.sh, g.t, g.h, g.oh) and
            (g.t // g.dh == 0 or _tap_live(0, g.kh, g.dh, g.sh, g.t, g.h, g.oh)) and
            _tap_live(g.kw - 1, g.kw, g.dw, g.sw, g.l, g.w, g.ow) and
            (g.l // g.dw == 0 or _tap_live(0, g.kw, g.dw, g.sw, g.l, g.w, g.ow)))


@kernel("Convolution", "ConvolutionDepthwise")
def convolution(node, ins, outs, settings, scaled=False, affine=None):
    """`scaled` (int8 only: scaled_pointwise): of x * s, ins = [x, s] with s (1, C, 1, 1); `affine` (int8
    only: affine_pointwise): of a Scale's output, (s, b, kind, alpha, beta) as ops.scale runs it."""
    part = _part_of(node)
    cout = part.cout
    geometry = _geometry(part, ins[0].shape, outs[0].shape)
    bias, int8 = part.bias, part.int8
    if int8 is None and node.param.get("quanParameter") is not None and geometry.fully_connected and \
            geometry.n == 1 and (k := _weight_only_matvec(node, geometry, bias, settings)) is not None:
        return k
    weight = _weight_of(node, cout)
    geometry.check(weight.size, f"{node.op} '{node.name}'")
    if int8 is not None:     # an int8 convolution: same arithmetic as MNN on the quantized grid
        grid_in = grid_of(*int8.input)
        grid_out = NO_GRID if int8.output is None else grid_of(*int8.output)
        # a table op fused in (plan stage fuse_int8_tables): its values, and as codes on its grid for the
        # kernels that look them up in their epilogue
        table = None if int8.output is None else values_of(node, grid_out, outs[0])
        codes = None if table is None else codes_of(table, outs[0])
        done = None if int8.output is None else outs[0].grid if table is not None else grid_out
        fn, looks_up = None, False
        if node.op == "ConvolutionDepthwise":
            from ..micro.int8_conv import depthwise_int8
            fn = depthwise_int8(node, ins, outs, bias, int8, settings.threads,
                                lambda plain, w, b: convolution_float(plain, ins, outs, w, b, settings).fn, codes,
                                table if codes is None else None)
            looks_up = fn is not None and table is not None      # the table in its epilogue, codes or values
            bias = bias if fn is not None else depthwise_int8_bias(node, bias, int8)
        fn = fn or _integer(node, ins, outs, bias, int8, settings.threads, codes, scaled, affine)
        if fn is None:
            k = convolution_float(node, ins, outs, weight, bias, settings, grid_out)
            # an input that an int8 kernel already rounded to this grid is used as it is
            fn = k.fn if ins[0].grid == grid_in and not scaled and affine is None else \
                _grid_input(k.fn, ins[0].shape, grid_in, settings.threads, scaled, affine)
            codes = None
        if table is not None and codes is None and not looks_up:      # the op's lookup after the convolution
            fn = looked_up(fn, table, grid_out, outs[0].shape, settings.threads)
        return Kernel(fn, True, done)
    return convolution_float(node, ins, outs, weight, bias, settings, geometry=geometry, act=part.act)


def _bias(param: dict, cout: int) -> np.ndarray:
    """The layer's float bias, zeros when the file has none of the right size."""
    bias = np.asarray(param.get("bias", np.zeros(cout)), np.float32).reshape(-1)
    return bias if bias.size == cout else np.zeros(cout, np.float32)


def _weight_only_matvec(node, g: Geometry, bias, settings) -> Kernel | None:
    """A single row through a weight-only int8/int4 layer on its codes (quant_gemv.QMatVec): a decoder's
    token step reads a quarter (int8) or an eighth (int4) of the float weights' bytes."""
    from .conv_strategies import with_post
    from ..micro.quant_gemv import QMatVec
    mv = QMatVec.of(node.param["quanParameter"], g.cout, bias, activation(node.param["common"]), settings.threads)
    if mv is None or mv.codes.shape[0] != g.cout or mv.codes.shape[1] * (2 if mv.codes.dtype == np.uint8 else 1) != g.cin:
        return None

    def run(inputs, outputs):
        mv(np.ascontiguousarray(inputs[0], np.float32).reshape(g.cin), outputs[0].reshape(g.cout))
    return with_post(writes(run), node.param.get(POST, NO_POST), g.cout, settings.threads)


def _integer(node, ins, outs, bias, grids, threads: int, table=None, scaled=False, affine=None):
    """The integer kernel for a group-1 int8 convolution with 8-bit per-channel weights on a VNNI CPU,
    else None (elsewhere BLAS's sgemm on the int8 grid beats integer loops)."""
    from ....format.idst import int8_values
    from ..micro.int8_conv import int8_convolution
    from ..micro.int8_gemm import HAS_VNNI
    if not HAS_VNNI:
        return None
    c = node.param["common"]
    cout = c["outputCount"]
    values = int8_values(node.param["quanParameter"], cout)
    if values is None or (c.get("group", 1) or 1) != 1 or len(ins[0].shape) != 4:
        return None
    geometry = Geometry.of(c, ins[0].shape, outs[0].shape).window
    return int8_convolution(geometry, *values, bias, activation(c), grids, ins[0].shape, outs[0].shape, threads,
                            table, scaled, ins[0].grid == grid_of(*grids.input), _affine_bounds(affine))


def _affine_bounds(affine):
    """(s, b, lo, hi) for int8_conv's affine packing from (s, b, kind, alpha, beta): ReLU/ReLU6's clamp
    (POST_CLIP), else none, as finite bounds (its fastmath assumes no infinities; the values are finite)."""
    if affine is None:
        return None
    s, b, kind, alpha, beta = affine
    big = np.float32(np.finfo(np.float32).max)
    lo, hi = (alpha, beta) if kind == POST_CLIP else (-big, big)
    return s, b, np.float32(np.clip(lo, -big, big)), np.float32(np.clip(hi, -big, big))


def conv_weight(param: dict, rows: int) -> np.ndarray:
    """Float weights (rows, -1), dequantized when the file stores them quantized or as fp16."""
    if param.get("weight") is not None and len(param["weight"]):
        return np.asarray(param["weight"], np.float32).reshape(rows, -1)
    if param.get("quanParameter") is not None:
        from ....format.idst import dequantize
        return dequantize(param["quanParameter"], rows)
    # weights read at run time (an ONNX Conv whose W is an input): not a fast kernel's case, declined
    raise MnnToolError("convolution without constant weights")


class Int8Grids(NamedTuple):
    """An int8 convolution's input and output grids as (scale, min, max) in steps of the scale from
    zero (real = scale * (q - zero), q in [clampMin, clampMax], so the steps run from clampMin - zero),
    and the input's zero point. `output` is None for a float output (symmetricQuan's outputDataType
    DT_FLOAT: MNN takes the output scale as 1 and its zero point as 0, and rounds nothing)."""
    input: tuple
    output: tuple | None
    zero_in: int
    zero_out: int = 0


def int8_scales(node) -> Int8Grids | None:
    qp, sq = node.param.get("quanParameter"), node.param.get("symmetricQuan")
    if qp is None or sq is None or not qp.get("scaleIn") or not qp.get("scaleOut"):
        return None
    lo, hi = int(sq.get("clampMin", -128)), int(sq.get("clampMax", 127))
    z_in, z_out = int(sq.get("zeroPoint", 0)), int(sq.get("outputZeroPoint", 0))
    if float_output(node):
        return Int8Grids((float(qp["scaleIn"]), lo - z_in, hi - z_in), None, z_in)
    return Int8Grids((float(qp["scaleIn"]), lo - z_in, hi - z_in), (float(qp["scaleOut"]), lo - z_out, hi - z_out),
                     z_in, z_out)


def float_output(node) -> bool:
    """An int8 convolution that writes float: int8 input and weights, no output grid."""
    return (node.param.get("symmetricQuan") or {}).get("outputDataType") in ("DT_FLOAT", 1)


def depthwise_int8_bias(node, bias: np.ndarray, grids: Int8Grids) -> np.ndarray:
    """The float bias that gives what MNN's int8 depthwise convolution adds: it folds the bias into the
    32-bit accumulator truncated toward zero, trunc(b / (s_in * alpha)), and the output zero point as
    trunc(z_out / scale) accumulator units (scale = alpha * (s_in / s_out), float32), so each channel is
    off by a fraction of a step, which moves outputs near half-steps (MobileNetV3's first depthwise
    layer: 738 of 200,704 outputs one step apart without it, none with it). MNN's GEMM convolutions add
    the float bias, so they need nothing, and so does a depthwise layer with a float output."""
    from ....format.idst import int8_values
    values = int8_values(node.param["quanParameter"], bias.size)
    if values is None or grids.output is None:     # a float output adds the float bias (measured)
        return bias
    f32 = np.float32
    s_in, s_out = f32(grids.input[0]), f32(grids.output[0])
    alpha = values[1].astype(f32)
    alpha = np.where(np.abs(alpha) < f32(1e-6), f32(1e-6), alpha)
    scale = alpha * (s_in / s_out)
    units = np.trunc(bias.astype(f32) / (s_in * alpha)).astype(np.float64)
    fused = np.trunc(f32(grids.zero_out) / scale).astype(np.float64)
    # accumulator units -> output steps -> real: (units + fused) * scale - z_out steps, times s_out
    steps = (units + fused) * scale.astype(np.float64) - grids.zero_out
    return (steps * np.float64(s_out)).astype(f32)


def convolution_float(node, ins, outs, weight, bias, settings, grid=NO_GRID, geometry=None, act=None) -> Kernel:
    """Float convolution on the first strategy that suits it; `grid` rounds its output to an int8 grid.
    `geometry`, `act`: the layer's, where the caller has them (else read from the node)."""
    c = node.param["common"]
    g = Geometry.of(c, ins[0].shape, outs[0].shape) if geometry is None else geometry
    if not _untrimmed(g):
        g, weight = trimmed(g, weight)
    if geometry is None:
        # a bias of its own: a read-only one (an ONNX initializer's) is another argument type for the kernels
        # that read it in place, one the ahead-of-time library does not hold (_Part.bias is one already)
        bias = np.array(bias, np.float32)
    return build(g, Layer(weight, bias, activation(c) if act is None else act, grid, settings.threads,
                          node.param.get(POST, NO_POST)))


def _grid_input(fn, shape, grid, threads: int, scaled=False, affine=None):
    """Round the input to its int8 grid before a float kernel that rounds its own output (the layers
    the integer kernel does not cover: depthwise and grouped convolutions, 4-bit weights, no VNNI);
    `scaled`: the input x * s first (ins [x, s], convolution's); `affine`: the Scale first, as ops.scale."""
    xq = np.empty(shape, np.float32)
    rows = xq.reshape(-1, shape[-1])
    rounding = sized(to_grid, xq.size, threads)
    if affine is not None:
        from .scale import scale_rows
        s, b, kind, alpha, beta = affine
        scaling = sized(scale_rows, xq.size, threads)
        xs = np.empty(shape, np.float32)

    def run(inputs, outputs):
        x = np.ascontiguousarray(inputs[0], np.float32)
        if scaled:
            x = x * np.asarray(inputs[1], np.float32)
            inputs = inputs[:1]
        if affine is not None:
            scaling(x.reshape(shape[0] * shape[1], -1), s, b, kind, alpha, beta, xs.reshape(shape[0] * shape[1], -1))
            x = xs
        rounding(x.reshape(rows.shape), grid, rows)
        fn([xq] + list(inputs[1:]), outputs)
    return run


@kernel("Deconvolution", "DeconvolutionDepthwise")
def deconvolution(node, ins, outs, settings):
    c = node.param["common"]
    n, cin, h, w = ins[0].shape
    _, cout, oh, ow = outs[0].shape
    kh, kw, sh, sw, dh, dw, t, l, b, r = Geometry.of(c, ins[0].shape, outs[0].shape).window
    if c.get("padMode") == "SAME":
        total_h = (h - 1) * sh + dh * (kh - 1) + 1 - oh
        total_w = (w - 1) * sw + dw * (kw - 1) + 1 - ow
        t, l = max(total_h, 0) // 2, max(total_w, 0) // 2
    group = c.get("group", 1) or 1
    act = activation(c)
    cg, og = cin // group, cout // group
    weight = conv_weight(node.param, cin)
    if min(kh, kw, sh, sw, dh, dw, group) < 1 or cin % group or cout % group or weight.size != cin * og * kh * kw:
        raise InvalidModel(f"{node.op} '{node.name}': group {group}, kernel {kh}x{kw}, stride {sh}x{sw} and "
                           f"{weight.size} weights do not fit {cin} -> {cout} channels")
    weight = weight.reshape(cin, og * kh * kw)
    wt = [np.ascontiguousarray(weight[k * cg:(k + 1) * cg].T) for k in range(group)]   # (og*kh*kw, cg)
    bias = np.asarray(node.param.get("bias", np.zeros(cout)), np.float32).reshape(cout, 1, 1)
    ch = max((h - 1) * sh + dh * (kh - 1) + 1, t + oh)
    cw = max((w - 1) * sw + dw * (kw - 1) + 1, l + ow)
    # work buffers of the thread, not the plan's: a plan per input shape allocated its own (a text
    # detector's head: ~3 MB a shape, page faults on the first run and holes in malloc's heap)
    canvas_of, cols_of = Scratch("deconv_canvas", (cout, ch, cw)), Scratch("deconv_cols", (cout * kh * kw, h * w))

    def run(inputs, outputs):
        x, y = inputs[0], outputs[0]
        rows = og * kh * kw
        canvas, cols = canvas_of(), cols_of()
        for i in range(n):
            xi = x[i].reshape(cin, h * w)
            for k in range(group):
                np.matmul(wt[k], xi[k * cg:(k + 1) * cg], out=cols[k * rows:(k + 1) * rows])
            canvas[:] = 0
            col2im(cols, kh, kw, sh, sw, dh, dw, h, w, canvas)
            y[i] = canvas[:, t:t + oh, l:l + ow]
            y[i] += bias
            apply_act(y[i], act)
    return writes(run)


@njit(cache=True, fastmath=True)
def scale_packed(base, s, out):
    """out[b, c, :] = base[b, c, :] * s[c] over packed weights [O/8][C][8]: numpy's broadcast of s ran
    its inner loop per 8 floats (672 -> 112 channels: 37.6 us, 11.7 here)."""
    nob, cin, w = base.shape
    for b in range(nob):
        for c in range(cin):
            v = s[c]
            for r in range(w):
                out[b, c, r] = base[b, c, r] * v


def scaled_pointwise(node, ins, outs, settings):
    """fusion.fuse_channel_scale's node: a 1x1 convolution of x * s, s one scale per input channel, as
    the convolution with its packed weights scaled by s on each run ([O/8][C][8]: a broadcast multiply)."""
    part = _part_of(node)
    if part.int8 is not None:       # int8: x * s quantized in the convolution's packing pass
        return convolution(node, ins, outs, settings, scaled=True)
    cout = part.cout
    _, cin, h, w = ins[0].shape
    weight = _weight_of(node, cout)     # (cout, cin) already: the node part itself, which PackedGemm's parts key on
    pg = PackedGemm(weight if weight.shape == (cout, cin) else weight.reshape(cout, cin), part.bias, part.act, NO_GRID,
                    h * w, settings.threads, node.param.get(POST, NO_POST))
    base = pg.wp.reshape(pg.nob, cin, OCB)      # the packed weights, shared with other plans (weight_cache)
    # the scaled copy, rewritten on each run: a buffer of the thread's (a copy per plan was ~1 MB and ~30 us of
    # planning at each new input shape of EfficientNet-B0)
    scaled_of, shape, scale = Scratch("scaled_pointwise", pg.wp.shape), (pg.nob, cin, OCB), Bound(scale_packed)

    def run(i, o):
        scaled = scaled_of()
        scale(base, np.ascontiguousarray(i[1], np.float32).reshape(cin), scaled.reshape(shape))
        pg.wp = scaled
        pg(np.ascontiguousarray(i[0], np.float32).reshape(-1), h * w, o[0].reshape(-1), h * w)
    return writes(run)


PLAN_ONLY["ScaledPointwise"] = scaled_pointwise
AFFINE = "scaleBefore"      # the param of a planner-made AffinePointwise node: (s, b, kind, alpha, beta)


def affine_pointwise(node, ins, outs, settings):
    """fuse_channel_scale's node for a Scale (a BatchNorm left unfolded, its ReLU fused) read only by an
    int8 1x1 convolution: the Scale's values computed in the convolution's packing pass (int8 only)."""
    return convolution(node, ins, outs, settings, affine=node.param[AFFINE])


PLAN_ONLY["AffinePointwise"] = affine_pointwise


def residual_convolution(node, ins, outs, settings):
    """plan.fuse_residual_add's node: a float convolution (inputs: x, the residual r) whose output is
    conv(x) + r, then the clip (ReLU, ReLU6) that followed the Add (its POST). The convolution runs on its
    strategy without that post (its own ReLU, if any, stays before the add, as in the graph), then one
    pass adds r and clips in place: the Add's step and its output tensor are gone."""
    post = node.param.get(POST, NO_POST)
    plain = Node("Convolution", node.inputs[:1], list(node.outputs), node.name,
                 {k: v for k, v in node.param.items() if k != POST}, node.param_type, node.fmt)
    try:
        k = convolution(plain, ins[:1], outs, settings)
    except InvalidModel:
        raise
    except MnnToolError as e:       # declined: the op's definition, counted as plan.kernels counts it
        from ...fallbacks import fell_back
        from .. import by_definition
        fell_back(plain, e, declined=True)
        k = by_definition(plain)
    if k.out_grid:
        raise MnnToolError(f"ResidualConvolution '{node.name}': its convolution rounds to an int8 grid")
    fn, size, into = k.fn, int(np.prod(outs[0].shape)), k.writes_out
    if int(post[0]) == POST_LEAKY:
        leaky, slope = sized(add_leaky, size, settings.threads), np.float32(post[1])
        add = lambda y, r, lo, hi: leaky(y, r, slope)       # noqa: E731
        lo = hi = None
    else:
        lo, hi = bounds_of(post)
        add = sized(add_clamped, size, settings.threads)

    def run(inputs, outputs):
        if into:
            fn(inputs[:1], outputs)
        else:       # a kernel returning its output (the op's definition)
            np.copyto(outputs[0], fn(inputs[:1])[0])
        y, r = outputs[0], np.ascontiguousarray(inputs[1], np.float32)
        if y.flags.c_contiguous:
            add(y.reshape(-1), r.reshape(-1), lo, hi)
        else:       # a view into a Concat's buffer along a later axis
            np.add(y, r.reshape(y.shape), out=y)
            if lo is None:      # the LeakyReLU as the ReLU step computes it
                scaled = y * np.float32(post[1])
                (np.maximum if post[1] < 1 else np.minimum)(y, scaled, out=y)
            else:
                np.clip(y, lo, hi, out=y)
    return writes(run)


PLAN_ONLY["ResidualConvolution"] = residual_convolution
