"""aten convolution, normalization, pooling, linear layers and LSTM -> IR."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from ...errors import MnnToolError
from ..shape_tracking import T
from .context import ATEN, aten
from ...ir.ops.nn import pool_param
from ...ir.ops.norm import batch_norm_param


def _pair(v, n):
    v = list(v) if isinstance(v, (list, tuple)) else [v] * n
    return [int(x) for x in (v * n if len(v) == 1 else v)]


@aten("aten::_convolution", "aten::conv2d", "aten::conv1d", "aten::_convolution_mode")
def convolution(ctx, node, args):
    """2-D, and 1-D as 2-D with a height of 1 (as MNN's converter does)."""
    x, w, b = args[0], args[1], args[2]
    if isinstance(w, T):
        raise MnnToolError(f"{ctx.path}: {node.kind()}: the weight must be a constant (freeze the model)")
    if node.kind() in ("aten::conv2d", "aten::conv1d", "aten::_convolution_mode"):
        stride, padding, dilation, groups = args[3], args[4], args[5], args[6]
        transposed, out_pad = False, [0]
    else:
        stride, padding, dilation, transposed, out_pad, groups = args[3], args[4], args[5], args[6], args[7], args[8]
    w = np.asarray(w, np.float32)
    if w.ndim not in (3, 4):
        raise MnnToolError(f"{ctx.path}: {node.kind()}: only 1-D and 2-D convolutions are supported")
    n = w.ndim - 2
    stride, dilation, out_pad = _pair(stride, n), _pair(dilation, n), _pair(out_pad, n)
    if isinstance(padding, str):    # 'valid', or 'same' (stride 1: the extra pad goes after)
        total = [0] * n if padding == "valid" else [d * (k - 1) for d, k in zip(dilation, w.shape[2:])]
        before, after = [t // 2 for t in total], [t - t // 2 for t in total]
    else:
        before = after = _pair(padding, n)
    one_d = n == 1
    if one_d:       # [N, C, L] -> [N, C, 1, L]
        w = w[:, :, None, :]
        stride, dilation, out_pad = [1] + stride, [1] + dilation, [0] + out_pad
        before, after = [0] + before, [0] + after
        x = ctx.emit("Unsqueeze", [x], [ctx.tmp(ctx.out(node) + "_2d")], {"squeezeDims": [2]})[0]
    if transposed:
        cin, cout_g, kh, kw = w.shape
        cout = cout_g * groups
    else:
        cout, cin_g, kh, kw = w.shape
        cin = cin_g * groups
    bias = np.zeros(cout, np.float32) if b is None else np.asarray(b, np.float32)
    common = {"padX": before[1], "padY": before[0], "kernelX": kw, "kernelY": kh,
              "strideX": stride[1], "strideY": stride[0], "dilateX": dilation[1],
              "dilateY": dilation[0], "padMode": "CAFFE", "group": int(groups), "outputCount": cout,
              "inputCount": cin, "relu": False, "relu6": False, "pads": [before[0], before[1], after[0], after[1]]}
    depthwise = groups > 1 and groups == cin == cout
    if transposed:
        common["outPads"] = out_pad
        op = "DeconvolutionDepthwise" if depthwise else "Deconvolution"
    else:
        op = "ConvolutionDepthwise" if depthwise else "Convolution"
    out = ctx.out(node)
    y = ctx.emit(op, [x], [ctx.tmp(out + "_2d_out") if one_d else out],
                 {"common": common, "weight": w.reshape(-1), "bias": bias})
    if one_d:
        return ctx.emit("Squeeze", y, [out], {"squeezeDims": [2]})
    return y


@aten("aten::_weight_norm")
def weight_norm(ctx, node, args):
    """v * g / |v| over every dim but `dim`: weights, computed once here."""
    v, g, dim = args
    if isinstance(v, T) or isinstance(g, T):
        raise MnnToolError(f"{ctx.path}: aten::_weight_norm on a computed tensor is not supported")
    v, g = np.asarray(v, np.float32), np.asarray(g, np.float32)
    axes = tuple(a for a in range(v.ndim) if a != int(dim) % v.ndim)
    return [v * (g / np.sqrt((v * v).sum(axis=axes, keepdims=True)))]


@aten("aten::batch_norm")
def batch_norm(ctx, node, args):
    x, w, b, mean, var, eps = args[0], args[1], args[2], args[3], args[4], args[7]
    return ctx.emit("BatchNorm", [x], [ctx.out(node)], batch_norm_param(mean, var, eps, w, b))


def _pool(ctx, node, args, kind):
    x, k = args[0], list(args[1])
    stride = list(args[2]) or k
    pad = list(args[3]) if len(args) > 3 else [0, 0]
    ceil = bool(args[5] if kind == "MAXPOOL" else args[4]) if len(args) > 5 else False
    include = bool(args[5]) if kind == "AVEPOOL" and len(args) > 5 else True
    param = pool_param(kind, k, stride, [pad[0], pad[1]] * 2, ceil, "INCLUDE_PADDING" if include else "EXCLUDE_PADDING")
    return ctx.emit("Pooling", [x], [ctx.out(node)], param, node.kind())


ATEN["aten::max_pool2d"] = lambda ctx, node, args: _pool(ctx, node, args, "MAXPOOL")
ATEN["aten::avg_pool2d"] = lambda ctx, node, args: _pool(ctx, node, args, "AVEPOOL")


@aten("aten::adaptive_avg_pool2d", "aten::adaptive_max_pool2d")
def adaptive_pool(ctx, node, args):
    if list(args[1]) != [1, 1]:
        raise MnnToolError(f"{ctx.path}: {node.kind()}: only output size 1x1 is supported")
    kind = "AVEPOOL" if "avg" in node.kind() else "MAXPOOL"
    return ctx.emit("Pooling", [args[0]], [ctx.out(node)], pool_param(kind, is_global=True))


@aten("aten::linear")
def linear(ctx, node, args):
    x, w, b = args
    out = ctx.out(node)
    mm = T(ctx.tmp(out + "_mm")) if b is not None else out
    ctx.emit("MatMul", [x, ctx.tensor(np.ascontiguousarray(np.asarray(w, np.float32).T), "weight")], [mm],
             {"T": "DT_FLOAT", "transposeA": False, "transposeB": False}, node.kind())
    if b is None:
        return [T(mm)]
    return ctx.emit("BinaryOp", [mm, ctx.tensor(b, "bias")], [out], {"opType": "ADD", "T": "DT_FLOAT"})


@aten("aten::matmul", "aten::mm", "aten::bmm")
def matmul(ctx, node, args):
    return ctx.emit("MatMul", [ctx.tensor(args[0]), ctx.tensor(args[1])], [ctx.out(node)],
                    {"T": "DT_FLOAT", "transposeA": False, "transposeB": False}, node.kind())


@aten("aten::addmm")
def addmm(ctx, node, args):
    bias, a, b = args[0], args[1], args[2]
    out = ctx.out(node)
    mm = T(ctx.tmp(out + "_mm"))
    ctx.emit("MatMul", [ctx.tensor(a), ctx.tensor(b)], [mm], {"T": "DT_FLOAT", "transposeA": False,
                                                             "transposeB": False})
    return ctx.emit("BinaryOp", [mm, ctx.tensor(bias)], [out], {"opType": "ADD", "T": "DT_FLOAT"})


@aten("aten::layer_norm")
def layer_norm(ctx, node, args):
    x, shape, w, b, eps = args[0], list(args[1]), args[2], args[3], args[4]
    param = {"axis": list(range(-len(shape), 0)), "epsilon": float(eps), "group": 1, "useRMSNorm": False}
    if w is not None:
        param["gamma"] = np.asarray(w, np.float32).reshape(-1)
        param["beta"] = (np.zeros_like(param["gamma"]) if b is None else np.asarray(b, np.float32)).reshape(-1)
    return ctx.emit("LayerNorm", [x], [ctx.out(node)], param)


@aten("aten::embedding")
def embedding(ctx, node, args):
    weight, ids = args[0], args[1]
    return ctx.emit("GatherV2", [ctx.tensor(weight, "embedding"), ids, ctx.tensor(np.array([0], np.int32))],
                    [ctx.out(node)], {})


# torch's gate order -> ONNX's: LSTM i,f,g,o -> i,o,f,c; GRU r,z,n -> z,r,h
_GATES = {"LSTM": (4, (0, 3, 1, 2)), "GRU": (3, (1, 0, 2))}


def _initial(ctx, state, layer, dirs, name):
    """This layer's slice of an initial state: a constant, or sliced at run time from an input."""
    if not isinstance(state, T):
        return ctx.g.add_const(name, np.asarray(state, np.float32)[layer * dirs:(layer + 1) * dirs])
    out = T(ctx.tmp(name))
    ctx.emit("StridedSlice", [state] + [ctx.tensor(np.array([v], np.int32)) for v in (layer * dirs, (layer + 1) * dirs, 0)],
             [out], {"fromType": 1})
    return out


@aten("aten::lstm", "aten::gru")
def recurrent(ctx, node, args):
    """aten::lstm / aten::gru -> the ONNX LSTM/GRU lowering, one call per layer; initial states may be
    inputs of the model (sliced per layer at run time)."""
    from ..onnx.rnn import gru as onnx_gru, lstm as onnx_lstm
    kind = "LSTM" if node.kind() == "aten::lstm" else "GRU"
    x, hx, params, has_bias, layers, _, _, bidir, batch_first = args[:9]
    dirs = 2 if bidir else 1
    gates, perm = _GATES[kind]
    if batch_first:
        xt = T(ctx.tmp(ctx.out(node) + "_seqfirst"))
        ctx.emit("Permute", [x], [xt], {"dims": [1, 0, 2]})
        x = xt
    per = 4 if has_bias else 2
    states = list(hx) if kind == "LSTM" else [hx]
    finals: list[list] = [[] for _ in states]
    for layer in range(layers):
        ws, rs, bs = [], [], []
        for d in range(dirs):
            p = params[(layer * dirs + d) * per:(layer * dirs + d + 1) * per]

            def order(a):
                parts = np.split(np.asarray(a, np.float32), gates)
                return np.concatenate([parts[i] for i in perm])
            ws.append(order(p[0]))
            rs.append(order(p[1]))
            bs.append(np.concatenate([order(p[2]), order(p[3])]) if has_bias else np.zeros(2 * gates * rs[-1].shape[1]))
        hidden = rs[0].shape[1]
        names = {k: ctx.g.add_const(f"{kind.lower()}{layer}_{k}", v) for k, v in
                 (("W", np.stack(ws)), ("R", np.stack(rs)), ("B", np.stack(bs).astype(np.float32)))}
        init = [_initial(ctx, st, layer, dirs, f"{kind.lower()}{layer}_init{k}") for k, st in enumerate(states)]
        outs = [ctx.tmp(f"{kind.lower()}{layer}_{k}") for k in ("Y", "Yh", "Yc")[:1 + len(states)]]
        fake = SimpleNamespace(op_type=kind, name=f"{kind.lower()}{layer}",
                               input=[x, names["W"], names["R"], names["B"], ""] + init, output=outs)
        attrs = {"hidden_size": hidden, "direction": b"bidirectional" if bidir else b"forward"}
        if kind == "GRU":
            attrs["linear_before_reset"] = 1       # torch applies r to (W_hn h + b_hn)
        (onnx_lstm if kind == "LSTM" else onnx_gru)(ctx, fake, attrs)
        seq, batch = ctx.shape_of(T(x))[:2]
        moved = T(ctx.tmp(f"{kind.lower()}{layer}_perm"))
        ctx.emit("Permute", [outs[0]], [moved], {"dims": [0, 2, 1, 3]})
        x = ctx.reshape(moved, [seq, batch, dirs * hidden], ctx.tmp(f"{kind.lower()}{layer}_out"))[0]
        for k, o in enumerate(outs[1:]):
            finals[k].append(o)
    out = x
    if batch_first:
        o2 = T(ctx.tmp(ctx.out(node) + "_batchfirst"))
        ctx.emit("Permute", [out], [o2], {"dims": [1, 0, 2]})
        out = o2
    result = [out]
    for k, parts in enumerate(finals):
        joined = T(ctx.tmp(("h_n", "c_n")[k]))
        ctx.emit("Concat", [T(h) for h in parts], [joined], {"axis": 0})
        result.append(joined)
    return result


@aten("aten::pad", "aten::constant_pad_nd", "aten::reflection_pad1d", "aten::reflection_pad2d",
      "aten::replication_pad1d", "aten::replication_pad2d")
def pad(ctx, node, args):
    """torch's pad list runs from the last dim backwards in (before, after) pairs; ONNX Pad's lists every
    dim's befores then every dim's afters."""
    from ..shape_tracking import emit_onnx
    x, widths = args[0], [int(p) for p in args[1]]
    k = node.kind()
    mode = args[2] if k == "aten::pad" else ("constant" if "constant" in k else "reflect" if "reflection" in k
                                             else "replicate")
    value = (args[3] if k == "aten::pad" else (args[2] if k == "aten::constant_pad_nd" else None)) or 0.0
    rank = len(ctx.shape_of(x))
    before, after = [0] * rank, [0] * rank
    for j in range(len(widths) // 2):
        before[rank - 1 - j], after[rank - 1 - j] = widths[2 * j], widths[2 * j + 1]
    onnx_mode = {"constant": "constant", "reflect": "reflect", "reflection": "reflect", "replicate": "edge",
                 "replication": "edge", "circular": "wrap"}.get(mode)
    if onnx_mode is None:
        raise MnnToolError(f"{ctx.path}: {k}: padding mode '{mode}' is not supported")
    ins = [x, np.asarray(before + after, np.int64)]
    if onnx_mode == "constant":
        ins.append(np.asarray(value, np.float32 if ctx.val(x).dtype == "float32" else np.int32))
    return emit_onnx(ctx, "Pad", ins, [ctx.out(node)], {"mode": onnx_mode})


@aten("aten::lstm_cell")
def lstm_cell(ctx, node, args):
    """One LSTM step (nn.LSTMCell): gates = x W_ih^T + b_ih + h W_hh^T + b_hh in torch's i, f, g, o order;
    c' = sigmoid(f) c + sigmoid(i) tanh(g), h' = sigmoid(o) tanh(c')."""
    from ..shape_tracking import emit_onnx
    x, (h, c), w_ih, w_hh = args[0], args[1], args[2], args[3]
    b_ih, b_hh = (args[4], args[5]) if len(args) > 5 else (None, None)
    base = ctx.out(node)

    def e(op, ins, tag, attrs=None):
        return emit_onnx(ctx, op, ins, [ctx.tmp(f"{base}_{tag}")], attrs)[0]
    mm = {"T": "DT_FLOAT", "transposeA": False, "transposeB": False}
    wi = ctx.tensor(np.ascontiguousarray(np.asarray(w_ih, np.float32).T), "weight")
    wh = ctx.tensor(np.ascontiguousarray(np.asarray(w_hh, np.float32).T), "weight")
    gx = ctx.emit("MatMul", [x, wi], [ctx.tmp(base + "_gx")], mm)[0]
    gh = ctx.emit("MatMul", [ctx.tensor(h), wh], [ctx.tmp(base + "_gh")], mm)[0]
    gates = e("Add", [gx, gh], "g")
    if b_ih is not None:
        gates = e("Add", [gates, np.asarray(b_ih, np.float32) + np.asarray(b_hh, np.float32)], "gb")
    hidden = np.asarray(w_hh).shape[1]
    parts = emit_onnx(ctx, "Split", [gates, np.asarray([hidden] * 4, np.int64)],
                      [ctx.tmp(f"{base}_{t}") for t in "ifgo"], {"axis": -1})
    i, f, o = (e("Sigmoid", [parts[k]], f"s{k}") for k in (0, 1, 3))
    g = e("Tanh", [parts[2]], "tg")
    c2 = e("Add", [e("Mul", [f, c], "fc"), e("Mul", [i, g], "ig")], "c")
    h2 = emit_onnx(ctx, "Mul", [o, e("Tanh", [c2], "tc")], [base])[0]
    return [h2, c2]
