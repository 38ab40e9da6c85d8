"""ONNX normalizations -> IR: LayerNorm where MNN's op fits (constant scale and bias over the trailing
axes), else its parts; instance and group norm as a LayerNorm over the right axes plus a per-channel
affine; LRN; Lp and mean-variance normalization from reductions."""
from __future__ import annotations

import numpy as np

from ...errors import MnnToolError
from .math import binary, unary
from .registry import converts


def _opt(node, k):
    return node.input[k] if len(node.input) > k and node.input[k] else None


def _rank(ctx, node):
    rank = ctx.rank(node.input[0])
    if rank is None:
        raise MnnToolError(f"{ctx.path}: {node.op_type} '{node.name}': the input's rank is unknown")
    return rank


def _tail_value(ctx, name, tail):
    """A constant broadcast to the normalized dims, flattened; None when not constant or not broadcastable."""
    v = ctx.const(name) if name else None
    if v is None or tail is None or not all(isinstance(d, int) for d in tail):
        return None
    try:
        return np.broadcast_to(np.asarray(v, np.float32), tuple(tail)).reshape(-1).copy()
    except ValueError:
        return None


def _affine(ctx, node, y, scale, bias, out):
    """out = y * scale + bias with the tensors as given (broadcasting)."""
    if scale and bias:
        mid = ctx.tmp(out + "_scaled")
        binary(ctx, y, scale, mid, "MUL", node.name + "_scale")
        binary(ctx, mid, bias, out, "ADD", node.name + "_bias")
    elif scale:
        binary(ctx, y, scale, out, "MUL", node.name + "_scale")
    elif bias:
        binary(ctx, y, bias, out, "ADD", node.name + "_bias")
    else:
        ctx.emit("Identity", [y], [out], {}, node.name + "_id")


def _moments_norm(ctx, node, x, axes, eps, out, rms=False, mean_out=None, inv_out=None):
    """(x - mean) * rsqrt(var + eps) over axes from Reduction/BinaryOp/UnaryOp, for the cases MNN's
    LayerNorm does not cover (its Mean and InvStdDev outputs)."""
    name = node.name
    if rms:
        centred = x
    else:
        mean = mean_out or ctx.tmp(out + "_mean")
        ctx.emit("Reduction", [x], [mean], {"operation": "MEAN", "dim": axes, "keepDims": True}, name + "_mean")
        centred = ctx.tmp(out + "_centred")
        binary(ctx, x, mean, centred, "SUB", name + "_centred")
    sq, var, ve, inv = (ctx.tmp(out + s) for s in ("_sq", "_var", "_ve", "_inv"))
    unary(ctx, centred, sq, "SQUARE", name + "_sq")
    ctx.emit("Reduction", [sq], [var], {"operation": "MEAN", "dim": axes, "keepDims": True}, name + "_var")
    binary(ctx, var, ctx.float_const(name + "_eps", eps), ve, "ADD", name + "_ve")
    inv = inv_out or inv
    unary(ctx, ve, inv, "RSQRT", name + "_rsqrt")
    binary(ctx, centred, inv, out, "MUL", name + "_norm")


@converts("LayerNormalization", "RMSNormalization")
def layer_norm(ctx, node, a):
    rank = _rank(ctx, node)
    axis = int(a.get("axis", -1)) % rank
    axes = list(range(axis - rank, 0))
    eps = float(a.get("epsilon", 1e-5))
    rms = node.op_type == "RMSNormalization"
    shape = ctx.shape(node.input[0])
    tail = shape[axis:] if shape is not None else None
    scale, bias = _opt(node, 1), (_opt(node, 2) if not rms else None)
    x, out = node.input[0], node.output[0]
    extra = [o for o in node.output[1:] if o]
    gamma, beta = _tail_value(ctx, scale, tail), _tail_value(ctx, bias, tail)
    fits = not extra and (scale is None or gamma is not None) and (bias is None or beta is not None)
    if fits:
        param = {"axis": axes, "epsilon": eps, "group": 1, "useRMSNorm": rms}
        if gamma is not None:
            param["gamma"] = gamma
            param["beta"] = beta if beta is not None else np.zeros_like(gamma)
        ctx.emit("LayerNorm", [x], [out], param, node.name)
        return
    y = ctx.tmp(out + "_norm")
    if extra:
        mean = node.output[1] if len(node.output) > 1 and node.output[1] else None
        inv = node.output[2] if len(node.output) > 2 and node.output[2] else None
        _moments_norm(ctx, node, x, axes, eps, y, rms, mean, inv)
    else:
        ctx.emit("LayerNorm", [x], [y], {"axis": axes, "epsilon": eps, "group": 1, "useRMSNorm": rms}, node.name + "_ln")
    _affine(ctx, node, y, scale, bias, out)


def _per_channel(ctx, node, k, rank, channels_hint=None):
    """Input k (shape [C]) reshaped to [C, 1, ...] for broadcasting over NC..., as a constant when it is one."""
    name = _opt(node, k)
    if name is None:
        return None
    v = ctx.const(name)
    if v is not None:
        return ctx.float_const(f"{node.name}_{k}_c", np.asarray(v, np.float32).reshape((-1,) + (1,) * (rank - 2)))
    r = ctx.tmp(f"{node.name}_{k}_r")
    ctx.emit("Reshape", [name, ctx.int_const(f"{node.name}_{k}_shape", [-1] + [1] * (rank - 2))], [r],
             {"dimType": "NCHW"}, f"{node.name}_{k}_r")
    return r


@converts("InstanceNormalization")
def instance_norm(ctx, node, a):
    rank = _rank(ctx, node)
    y = ctx.tmp(node.output[0] + "_norm")
    ctx.emit("LayerNorm", [node.input[0]], [y], {"axis": list(range(2 - rank, 0)), "epsilon": float(a.get("epsilon", 1e-5)),
                                                 "group": 1}, node.name + "_ln")
    _affine(ctx, node, y, _per_channel(ctx, node, 1, rank), _per_channel(ctx, node, 2, rank), node.output[0])


@converts("GroupNormalization")
def group_norm(ctx, node, a):
    """x as [N, G, -1], a LayerNorm over the last axis, back to x's shape, then the per-channel affine
    (opset 18's per-group scale and bias are repeated over each group's channels)."""
    rank = _rank(ctx, node)
    groups = int(a["num_groups"])
    shape = ctx.shape(node.input[0])
    if shape is None or not isinstance(shape[1], int):
        raise MnnToolError(f"{ctx.path}: GroupNormalization '{node.name}': needs a known channel count")
    x, out, name = node.input[0], node.output[0], node.name
    grouped, normed, back = (ctx.tmp(out + s) for s in ("_g", "_n", "_b"))
    ctx.emit("Reshape", [x, ctx.int_const(name + "_gshape", [0, groups, -1])], [grouped], {"dimType": "NCHW"}, name + "_g")
    ctx.emit("LayerNorm", [grouped], [normed], {"axis": [-1], "epsilon": float(a.get("epsilon", 1e-5)), "group": 1},
             name + "_ln")
    full = ctx.tmp(out + "_shape")
    ctx.emit("Shape", [x], [full], {}, name + "_shape", fmt="NCHW")
    ctx.emit("Reshape", [normed, full], [back], {"dimType": "NCHW"}, name + "_back")
    params = []
    for k in (1, 2):
        v = ctx.const(node.input[k])
        if v is not None:
            v = np.asarray(v, np.float32).reshape(-1)
            if v.size == groups and groups != shape[1]:
                v = np.repeat(v, shape[1] // groups)
            params.append(ctx.float_const(f"{name}_{k}_c", v.reshape((-1,) + (1,) * (rank - 2))))
            continue
        src = node.input[k]
        per_group = ctx.shape(src) == (groups,) and groups != shape[1]
        if per_group:       # opset 18: one value per group, repeated over the group's channels
            col, wide = ctx.tmp(f"{out}_{k}_col"), ctx.tmp(f"{out}_{k}_wide")
            ctx.emit("Reshape", [src, ctx.int_const(f"{name}_{k}_colshape", [groups, 1])], [col], {"dimType": "NCHW"}, col)
            ctx.emit("BroadcastTo", [col, ctx.int_const(f"{name}_{k}_wshape", [groups, shape[1] // groups])], [wide], {},
                     wide)
            src = wide
        r = ctx.tmp(f"{out}_{k}_r")
        ctx.emit("Reshape", [src, ctx.int_const(f"{name}_{k}_rshape", [-1] + [1] * (rank - 2))], [r],
                 {"dimType": "NCHW"}, r)
        params.append(r)
    _affine(ctx, node, back, params[0], params[1], out)


@converts("LRN")
def lrn(ctx, node, a):
    ctx.emit("LRN", [node.input[0]], [node.output[0]],
             {"regionType": 0, "localSize": int(a["size"]), "alpha": float(a.get("alpha", 1e-4)),
              "beta": float(a.get("beta", 0.75)), "bias": float(a.get("bias", 1.0))}, node.name)


@converts("LpNormalization")
def lp_norm(ctx, node, a):
    """x / ||x||_p along the axis; a zero norm gives 0 (the divisor is at least 1e-30)."""
    axis = int(a.get("axis", -1))
    p = int(a.get("p", 2))
    x, out, name = node.input[0], node.output[0], node.name
    norm, safe = ctx.tmp(out + "_norm"), ctx.tmp(out + "_safe")
    if p not in (1, 2):
        raise MnnToolError(f"{ctx.path}: LpNormalization '{name}': p={p} (only 1 and 2 are defined)")
    pre, total = ctx.tmp(out + "_pre"), ctx.tmp(out + "_sum")
    unary(ctx, x, pre, "SQUARE" if p == 2 else "ABS", name + "_pre")
    ctx.emit("Reduction", [pre], [total] if p == 2 else [norm], {"operation": "SUM", "dim": [axis], "keepDims": True},
             name + "_sum")
    if p == 2:
        unary(ctx, total, norm, "SQRT", name + "_sqrt")
    binary(ctx, norm, ctx.float_const(name + "_tiny", 1e-30), safe, "MAXIMUM", name + "_safe")
    binary(ctx, x, safe, out, "REALDIV", name)


@converts("MeanVarianceNormalization")
def mvn(ctx, node, a):
    axes = [int(v) for v in a.get("axes", [0, 2, 3])]
    _moments_norm(ctx, node, node.input[0], axes, 1e-9, node.output[0])
