"""Caffe's activation, normalisation and data-arrangement layers beyond the basic set, lowered by the
ONNX frontend's converters (frontends.shape_tracking.emit_onnx) so each meaning has one lowering."""
from __future__ import annotations

import numpy as np

from ..shape_tracking import emit_onnx
from .layers import _blob, _fail, caffe_pool_param, layer


def _tmp(ctx, lay, tag):
    return ctx.tmp(f"{lay.name}_{tag}")


def _e(ctx, lay, op_type, ins, tag, **attrs):
    return emit_onnx(ctx, op_type, ins, [_tmp(ctx, lay, tag)], attrs)[0]


# ---- activations ---------------------------------------------------------------------------------------

@layer("BNLL")
def bnll(ctx, lay, blobs, bottoms, tops):
    return emit_onnx(ctx, "Softplus", [bottoms[0]], [tops[0]])


@layer("Exp", "Log")
def exp_log(ctx, lay, blobs, bottoms, tops):
    """Exp: base^(shift + scale x); Log: log_base(shift + scale x); base -1 means e."""
    p = lay.exp_param if lay.type == "Exp" else lay.log_param
    ln_base = 1.0 if p.base == -1 else float(np.log(p.base))
    x = bottoms[0]
    if lay.type == "Exp":
        inner = x if p.scale * ln_base == 1 else _e(ctx, lay, "Mul", [x, np.float32(p.scale * ln_base)], "scale")
        if p.shift:
            inner = _e(ctx, lay, "Add", [inner, np.float32(p.shift * ln_base)], "shift")
        return emit_onnx(ctx, "Exp", [inner], [tops[0]])
    inner = x if p.scale == 1 else _e(ctx, lay, "Mul", [x, np.float32(p.scale)], "scale")
    if p.shift:
        inner = _e(ctx, lay, "Add", [inner, np.float32(p.shift)], "shift")
    if ln_base == 1.0:
        return emit_onnx(ctx, "Log", [inner], [tops[0]])
    return emit_onnx(ctx, "Mul", [_e(ctx, lay, "Log", [inner], "ln"), np.float32(1 / ln_base)], [tops[0]])


@layer("Threshold")
def threshold(ctx, lay, blobs, bottoms, tops):
    above = _e(ctx, lay, "Greater", [bottoms[0], np.float32(lay.threshold_param.threshold)], "gt")
    return emit_onnx(ctx, "Cast", [above], [tops[0]], {"to": 1})


@layer("Swish")
def swish(ctx, lay, blobs, bottoms, tops):
    x = bottoms[0]
    return emit_onnx(ctx, "Mul", [x, _e(ctx, lay, "Sigmoid", [x], "sig")], [tops[0]])


@layer("Mish")
def mish(ctx, lay, blobs, bottoms, tops):
    return emit_onnx(ctx, "Mish", [bottoms[0]], [tops[0]])


# ---- normalisations ------------------------------------------------------------------------------------

@layer("LRN")
def lrn(ctx, lay, blobs, bottoms, tops):
    p = lay.lrn_param
    x = bottoms[0]
    size = int(p.local_size)
    if p.norm_region == 0:          # ACROSS_CHANNELS: Caffe's alpha is per window, as ONNX's
        return emit_onnx(ctx, "LRN", [x], [tops[0]], {"size": size, "alpha": float(p.alpha), "beta": float(p.beta),
                                                      "bias": float(p.k)})
    # WITHIN_CHANNEL: x / (1 + alpha * mean of x^2 over a size x size window, zero-padded)^beta
    pad = (size - 1) // 2
    sq = _e(ctx, lay, "Mul", [x, x], "sq")
    avg = _e(ctx, lay, "AveragePool", [sq], "avg", kernel_shape=[size, size], pads=[pad, pad, size - 1 - pad,
                                                                                    size - 1 - pad],
             count_include_pad=1)
    d = _e(ctx, lay, "Pow", [_e(ctx, lay, "Add", [_e(ctx, lay, "Mul", [avg, np.float32(p.alpha)], "a"), np.float32(1)],
                                "b"), np.float32(p.beta)], "d")
    return emit_onnx(ctx, "Div", [x, d], [tops[0]])


@layer("MVN")
def mvn(ctx, lay, blobs, bottoms, tops):
    """x - mean, and divided by (std + eps) with normalize_variance, over H, W (and C across channels)."""
    p = lay.mvn_param
    x = bottoms[0]
    rank = len(ctx.shape_of(x))
    axes = np.arange(1 if p.across_channels else 2, rank, dtype=np.int64)
    mean = _e(ctx, lay, "ReduceMean", [x, axes], "mean", keepdims=1)
    centered = emit_onnx(ctx, "Sub", [x, mean], [tops[0] if not p.normalize_variance else _tmp(ctx, lay, "c")])[0]
    if not p.normalize_variance:
        return [centered]
    var = _e(ctx, lay, "ReduceMean", [_e(ctx, lay, "Mul", [centered, centered], "sq"), axes], "var", keepdims=1)
    std = _e(ctx, lay, "Add", [_e(ctx, lay, "Sqrt", [var], "std"), np.float32(p.eps)], "eps")
    return emit_onnx(ctx, "Div", [centered, std], [tops[0]])


@layer("Normalize")
def normalize(ctx, lay, blobs, bottoms, tops):
    """SSD's L2 normalisation over C (per position) or C, H, W (per sample), then a learned scale."""
    p = lay.norm_param
    x = bottoms[0]
    rank = len(ctx.shape_of(x))
    axes = np.arange(1, rank, dtype=np.int64) if p.across_spatial else np.asarray([1], np.int64)
    ss = _e(ctx, lay, "ReduceSumSquare", [x, axes], "ss", keepdims=1)
    norm = _e(ctx, lay, "Sqrt", [_e(ctx, lay, "Add", [ss, np.float32(p.eps)], "eps")], "norm")
    y = _e(ctx, lay, "Div", [x, norm], "y")
    scale = _blob(ctx, lay, blobs, 0, "scale").reshape(-1).astype(np.float32)
    if p.channel_shared or scale.size == 1:
        return emit_onnx(ctx, "Mul", [y, np.float32(scale[0])], [tops[0]])
    return emit_onnx(ctx, "Mul", [y, scale.reshape((1, -1) + (1,) * (rank - 2))], [tops[0]])


# ---- data arrangement ----------------------------------------------------------------------------------

@layer("Crop")
def crop(ctx, lay, blobs, bottoms, tops):
    x, ref = bottoms[:2]
    shape, target = ctx.shape_of(x), ctx.shape_of(ref)
    p = lay.crop_param
    axis = p.axis % len(shape)
    offsets = [int(o) for o in p.offset]
    n = len(shape) - axis
    if len(offsets) not in (0, 1, n):
        _fail(ctx, lay, f"{len(offsets)} offsets for {n} cropped axes")
    offsets = offsets * n if len(offsets) == 1 else (offsets or [0] * n)
    starts = np.asarray(offsets, np.int64)
    ends = starts + np.asarray(target[axis:], np.int64)
    if (ends > np.asarray(shape[axis:])).any():
        _fail(ctx, lay, f"crop of {tuple(shape)} to {tuple(target)} at offsets {offsets} runs past the input")
    return emit_onnx(ctx, "Slice", [x, starts, ends, np.arange(axis, len(shape), dtype=np.int64)], [tops[0]])


@layer("Tile")
def tile(ctx, lay, blobs, bottoms, tops):
    shape = ctx.shape_of(bottoms[0])
    reps = np.ones(len(shape), np.int64)
    reps[lay.tile_param.axis % len(shape)] = int(lay.tile_param.tiles)
    return emit_onnx(ctx, "Tile", [bottoms[0], reps], [tops[0]])


@layer("ShuffleChannel")
def shuffle_channel(ctx, lay, blobs, bottoms, tops):
    x = bottoms[0]
    n, c, h, w = ctx.shape_of(x)
    g = int(lay.shuffle_channel_param.group)
    if c % g:
        _fail(ctx, lay, f"{c} channels do not split into {g} groups")
    y = ctx.reshape(x, [n, g, c // g, h, w], _tmp(ctx, lay, "5d"))[0]
    y = _e(ctx, lay, "Transpose", [y], "t", perm=[0, 2, 1, 3, 4])
    return ctx.reshape(y, [n, c, h, w], tops[0])


@layer("Axpy")
def axpy(ctx, lay, blobs, bottoms, tops):
    """SENet's a * x + y with a per-channel a (N, C, 1, 1)."""
    a, x, y = bottoms[:3]
    return emit_onnx(ctx, "Add", [_e(ctx, lay, "Mul", [a, x], "ax"), y], [tops[0]])


REDUCTION = {1: "ReduceSum", 2: "ReduceL1", 3: "ReduceSumSquare", 4: "ReduceMean"}


@layer("Reduction")
def reduction(ctx, lay, blobs, bottoms, tops):
    """Every axis from `axis` on, reduced away, times coeff."""
    p = lay.reduction_param
    rank = len(ctx.shape_of(bottoms[0]))
    axes = np.arange(p.axis % rank, rank, dtype=np.int64)
    r = emit_onnx(ctx, REDUCTION[p.operation], [bottoms[0], axes],
                  [tops[0] if p.coeff == 1 else _tmp(ctx, lay, "r")], {"keepdims": 0})
    return r if p.coeff == 1 else emit_onnx(ctx, "Mul", [r[0], np.float32(p.coeff)], [tops[0]])


@layer("ArgMax")
def argmax(ctx, lay, blobs, bottoms, tops):
    """Top-k indices (or values with out_max_val) along `axis`; without an axis over each sample's
    flattened values, as (N, 1 or 2, k) with indices then values."""
    p = lay.argmax_param
    x = bottoms[0]
    shape = ctx.shape_of(x)
    k = np.asarray([int(p.top_k)], np.int64)
    if p.HasField("axis"):
        axis = p.axis % len(shape)
        vals, idx = emit_onnx(ctx, "TopK", [x, k], [_tmp(ctx, lay, "v"), _tmp(ctx, lay, "i")], {"axis": axis})
        if p.out_max_val:
            return emit_onnx(ctx, "Identity", [vals], [tops[0]])
        return emit_onnx(ctx, "Cast", [idx], [tops[0]], {"to": 1})
    flat = ctx.reshape(x, [shape[0], 1, -1], _tmp(ctx, lay, "flat"))[0]
    vals, idx = emit_onnx(ctx, "TopK", [flat, k], [_tmp(ctx, lay, "v"), _tmp(ctx, lay, "i")], {"axis": -1})
    y = _e(ctx, lay, "Cast", [idx], "fi", to=1)
    if p.out_max_val:
        y = _e(ctx, lay, "Concat", [y, vals], "iv", axis=1)
    # Caffe's top keeps the bottom's rank: (N, 1 or 2, k, 1, ...)
    return ctx.reshape(y, [shape[0], 2 if p.out_max_val else 1, int(p.top_k)] + [1] * (len(shape) - 3), tops[0])


@layer("SPP")
def spp(ctx, lay, blobs, bottoms, tops):
    """Spatial pyramid pooling as Caffe builds it: per level 2^l bins, a pooling with kernel
    ceil(size / bins), the pad that centres it and stride = kernel, flattened and concatenated."""
    from ...ir.ops.nn import pool_param
    x = bottoms[0]
    n, c, h, w = ctx.shape_of(x)
    levels = int(lay.spp_param.pyramid_height)
    if lay.spp_param.pool not in (0, 1):
        _fail(ctx, lay, "only MAX and AVE pooling are supported")
    kind = "MAXPOOL" if lay.spp_param.pool == 0 else "AVEPOOL"
    parts = []
    for lv in range(levels):
        bins = 2 ** lv
        kh, kw = -(-h // bins), -(-w // bins)
        ph, pw = (kh * bins - h + 1) // 2, (kw * bins - w + 1) // 2
        if lv == 0:                 # one bin: the whole map
            param = pool_param(kind, is_global=True)
        else:
            param = caffe_pool_param(kind, (h, w), (kh, kw), (kh, kw), (ph, pw), True)
        pooled = ctx.emit("Pooling", [x], [_tmp(ctx, lay, f"pool{lv}")], param, f"{lay.name}_pool{lv}")[0]
        parts.append(ctx.reshape(pooled, [n, -1], _tmp(ctx, lay, f"flat{lv}"))[0])
    if len(parts) == 1:
        return emit_onnx(ctx, "Identity", parts, [tops[0]])
    return emit_onnx(ctx, "Concat", parts, [tops[0]], {"axis": 1})


@layer("Embed")
def embed(ctx, lay, blobs, bottoms, tops):
    p = lay.embed_param
    w = _blob(ctx, lay, blobs, 0, "weight").reshape(int(p.input_dim), int(p.num_output)).astype(np.float32)
    idx = _e(ctx, lay, "Cast", [bottoms[0]], "idx", to=6)
    if not p.bias_term:
        return emit_onnx(ctx, "Gather", [w, idx], [tops[0]], {"axis": 0})
    rows = _e(ctx, lay, "Gather", [w, idx], "rows", axis=0)
    return emit_onnx(ctx, "Add", [rows, _blob(ctx, lay, blobs, 1, "bias").reshape(-1).astype(np.float32)], [tops[0]])


@layer("BatchReindex")
def batch_reindex(ctx, lay, blobs, bottoms, tops):
    idx = _e(ctx, lay, "Cast", [bottoms[1]], "idx", to=6)
    return emit_onnx(ctx, "Gather", [bottoms[0], idx], [tops[0]], {"axis": 0})


@layer("Parameter")
def parameter(ctx, lay, blobs, bottoms, tops):
    """A learned blob as the layer's output: a constant."""
    v = _blob(ctx, lay, blobs, 0, "parameter").astype(np.float32)
    dims = [int(d) for d in lay.parameter_param.shape.dim]
    if dims and int(np.prod(dims)) == v.size:
        v = v.reshape(dims)
    return [ctx.tensor(v, lay.name)]


@layer("DummyData")
def dummy_data(ctx, lay, blobs, bottoms, tops):
    """Constant-filled blobs (a random filler would differ run to run: refused)."""
    p = lay.dummy_data_param
    outs = []
    for k in range(len(tops)):
        if len(p.shape):
            dims = [int(d) for d in p.shape[k if len(p.shape) > 1 else 0].dim]
        else:
            dims = [int(getattr(p, f)[k if len(getattr(p, f)) > 1 else 0]) for f in ("num", "channels", "height",
                                                                                    "width")]
        filler = p.data_filler[k if len(p.data_filler) > 1 else 0] if len(p.data_filler) else None
        if filler is not None and filler.type != "constant":
            _fail(ctx, lay, f"the '{filler.type}' filler is random; only constant fillers convert")
        outs.append(ctx.tensor(np.full(dims, filler.value if filler is not None else 0.0, np.float32), lay.name))
    return outs
