"""TorchScript (.pt/.torchscript from torch.jit.trace or torch.jit.script) -> IR, walking the frozen,
inlined aten graph directly (not through torch's ONNX exporter).

Values are either IR tensors or Python values (ints, floats, lists, constant tensors). Shape arithmetic
(aten::size and the integer math on it) is evaluated at conversion time from the shapes inferred so
far, which is why --input-shape is required.
"""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np

from ..errors import MnnToolError
from ..ir.ops.nn import pool_param
from ..ir.ops.norm import batch_norm_param
from ..registry import registrar
from ..ir.graph import Graph
from .shaped import ShapedCtx, T

ATEN = {}


aten = registrar(ATEN)


class TorchCtx(ShapedCtx):
    def out(self, node, k=0) -> str:
        name = node.outputsAt(k).debugName()
        return self.g.fresh_name(name.replace(".", "_"))


def _ivalue(node):
    v = node.output().toIValue()
    try:
        import torch
        if isinstance(v, torch.Tensor):
            return v.detach().cpu().numpy()
    except ImportError:
        pass
    return v


def _binary_op(op_type):
    def fn(ctx, node, args):
        a, b = args[0], args[1]
        if not isinstance(a, T) and not isinstance(b, T):
            return [{"ADD": a + b, "SUB": a - b, "MUL": a * b, "REALDIV": a / b}[op_type]]
        if op_type in ("ADD", "SUB") and len(args) > 2 and args[2] not in (None, 1):
            b = ctx.tensor(np.asarray(b, np.float32) * args[2]) if not isinstance(b, T) else b
        return ctx.emit("BinaryOp", [ctx.tensor(a), ctx.tensor(b)], [ctx.out(node)],
                        {"opType": op_type, "T": "DT_FLOAT"}, node.kind())
    return fn


for _k, _v in {"aten::add": "ADD", "aten::sub": "SUB", "aten::mul": "MUL", "aten::div": "REALDIV"}.items():
    ATEN[_k] = _binary_op(_v)


@aten("aten::floor_divide")
def floor_divide(ctx, node, args):
    a, b = args
    if not isinstance(a, T) and not isinstance(b, T):
        return [a // b]
    return ctx.emit("BinaryOp", [ctx.tensor(a), ctx.tensor(b)], [ctx.out(node)], {"opType": "FLOORDIV"})


@aten("aten::pow")
def pow_(ctx, node, args):
    if not isinstance(args[0], T) and not isinstance(args[1], T):
        return [args[0] ** args[1]]
    return ctx.emit("BinaryOp", [ctx.tensor(args[0]), ctx.tensor(args[1])], [ctx.out(node)], {"opType": "POW"})


@aten("prim::NumToTensor", "aten::Int", "aten::Float", "aten::contiguous", "aten::dropout", "aten::detach",
      "aten::clone", "aten::to")
def passthrough(ctx, node, args):
    return [args[0]]


def _py(fn):
    def conv(ctx, node, args):
        if any(isinstance(a, T) for a in args):
            raise MnnToolError(f"{ctx.path}: {node.kind()} on tensors is not supported")
        return [fn(*args)]
    return conv


for _k, _f in {"aten::len": len, "aten::gt": lambda a, b: a > b, "aten::lt": lambda a, b: a < b,
               "aten::ge": lambda a, b: a >= b, "aten::le": lambda a, b: a <= b, "aten::eq": lambda a, b: a == b,
               "aten::ne": lambda a, b: a != b, "aten::__not__": lambda a: not a, "aten::__is__": lambda a, b: a is b,
               "aten::__isnot__": lambda a, b: a is not b, "prim::unchecked_cast": lambda a: a}.items():
    ATEN[_k] = _py(_f)


@aten("aten::dim")
def dim(ctx, node, args):
    return [len(ctx.shape_of(args[0]))]


@aten("prim::If")
def if_(ctx, node, args):
    """Conditions known at conversion time (shape checks in scripted code) select one branch, inlined."""
    cond = args[0]
    if isinstance(cond, T):
        raise MnnToolError(f"{ctx.path}: prim::If on a run-time tensor is not supported")
    block = list(node.blocks())[0 if cond else 1]
    env = ctx.env
    _walk(ctx, block.nodes(), env)
    return [env[o.unique()] for o in block.outputs()]


@aten("aten::size")
def size(ctx, node, args):
    shape = ctx.shape_of(args[0])
    return [shape[args[1]] if len(args) > 1 and args[1] is not None else list(shape)]


@aten("aten::zeros", "aten::ones")
def zeros(ctx, node, args):
    fill = 0.0 if node.kind() == "aten::zeros" else 1.0
    return [np.full([int(d) for d in args[0]], fill, np.float32)]


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


@aten("aten::_convolution", "aten::conv2d")
def convolution(ctx, node, args):
    x, w, b = args[0], args[1], args[2]
    if isinstance(w, T):
        raise MnnToolError(f"{ctx.path}: {node.kind()}: the weight must be a constant (freeze the model)")
    if node.kind() == "aten::conv2d":
        stride, padding, dilation, groups = args[3], args[4], args[5], args[6]
        transposed, out_pad = False, [0, 0]
    else:
        stride, padding, dilation, transposed, out_pad, groups = args[3], args[4], args[5], args[6], args[7], args[8]
    if isinstance(padding, str) or w.ndim != 4:
        raise MnnToolError(f"{ctx.path}: {node.kind()}: only 2-D convolutions with numeric padding are supported")
    w = np.asarray(w, np.float32)
    if transposed:
        cin, cout_g, kh, kw = w.shape
        cout = cout_g * groups
    else:
        cout, cin_g, kh, kw = w.shape
        cin = cin_g * groups
    bias = np.zeros(cout, np.float32) if b is None else np.asarray(b, np.float32)
    common = {"padX": int(padding[1]), "padY": int(padding[0]), "kernelX": kw, "kernelY": kh,
              "strideX": int(stride[1]), "strideY": int(stride[0]), "dilateX": int(dilation[1]),
              "dilateY": int(dilation[0]), "padMode": "CAFFE", "group": int(groups), "outputCount": cout,
              "inputCount": cin, "relu": False, "relu6": False, "pads": [int(padding[0]), int(padding[1])] * 2}
    depthwise = groups > 1 and groups == cin == cout
    if transposed:
        common["outPads"] = [int(p) for p in out_pad]
        op = "DeconvolutionDepthwise" if depthwise else "Deconvolution"
    else:
        op = "ConvolutionDepthwise" if depthwise else "Convolution"
    return ctx.emit(op, [x], [ctx.out(node)], {"common": common, "weight": w.reshape(-1), "bias": bias})


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


@aten("aten::flatten")
def flatten(ctx, node, args):
    shape = ctx.shape_of(args[0])
    start, end = args[1] % len(shape), args[2] % len(shape)
    dims = list(shape[:start]) + [int(np.prod(shape[start:end + 1]))] + list(shape[end + 1:])
    return ctx.reshape(args[0], dims, ctx.out(node))


@aten("aten::reshape", "aten::view")
def reshape(ctx, node, args):
    return ctx.reshape(args[0], args[1], ctx.out(node))


@aten("aten::permute")
def permute(ctx, node, args):
    rank = len(ctx.shape_of(args[0]))
    return ctx.emit("Permute", [args[0]], [ctx.out(node)], {"dims": [int(d) % rank for d in args[1]]})


@aten("aten::transpose")
def transpose(ctx, node, args):
    rank = len(ctx.shape_of(args[0]))
    perm = list(range(rank))
    a, b = args[1] % rank, args[2] % rank
    perm[a], perm[b] = perm[b], perm[a]
    return ctx.emit("Permute", [args[0]], [ctx.out(node)], {"dims": perm})


@aten("aten::t")
def t(ctx, node, args):
    return ctx.emit("Permute", [args[0]], [ctx.out(node)], {"dims": [1, 0]})


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


@aten("aten::softmax", "aten::log_softmax")
def softmax(ctx, node, args):
    out = ctx.out(node)
    if node.kind() == "aten::softmax":
        return ctx.emit("Softmax", [args[0]], [out], {"axis": int(args[1])})
    sm = T(ctx.tmp(out + "_sm"))
    ctx.emit("Softmax", [args[0]], [sm], {"axis": int(args[1])})
    return ctx.emit("UnaryOp", [sm], [out], {"opType": "LOG", "T": "DT_FLOAT"})


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


@aten("aten::cat")
def cat(ctx, node, args):
    parts = [ctx.tensor(p) for p in args[0]]
    rank = len(ctx.shape_of(parts[0]))
    return ctx.emit("Concat", parts, [ctx.out(node)], {"axis": int(args[1]) % rank})


@aten("aten::split", "aten::chunk", "aten::split_with_sizes")
def split(ctx, node, args):
    x = args[0]
    shape = ctx.shape_of(x)
    dim = int(args[2]) % len(shape)
    if node.kind() == "aten::chunk":
        n = int(args[1])
        size = -(-shape[dim] // n)
        sizes = [min(size, shape[dim] - k * size) for k in range(n) if k * size < shape[dim]]
    elif isinstance(args[1], int):
        sizes = [min(args[1], shape[dim] - k) for k in range(0, shape[dim], args[1])]
    else:
        sizes = [int(s) for s in args[1]]
    outs = [T(ctx.tmp(f"{ctx.out(node)}_{k}")) for k in range(len(sizes))]
    ctx.emit("Slice", [x], outs, {"axis": dim, "slicePoints": list(np.cumsum(sizes)[:-1]), "sourceType": "CAFFE"})
    return [list(outs)]


@aten("prim::ListUnpack", "prim::TupleUnpack")
def unpack(ctx, node, args):
    return list(args[0])


@aten("prim::ListConstruct", "prim::TupleConstruct")
def construct(ctx, node, args):
    return [list(args)]


@aten("prim::TupleIndex", "aten::__getitem__")
def getitem(ctx, node, args):
    return [args[0][args[1]]]


@aten("aten::slice")
def slice_(ctx, node, args):
    x, dim, start, end, step = args[0], args[1], args[2], args[3], args[4]
    if not isinstance(x, T):
        return [x[slice(start, end, step)]]
    start = 0 if start is None else start
    end = 2 ** 31 - 1 if end is None or end > 2 ** 31 - 1 else end
    ins = [x] + [ctx.tensor(np.array([v], np.int32)) for v in (start, end, dim, step)]
    return ctx.emit("StridedSlice", ins, [ctx.out(node)], {"fromType": 1})


@aten("aten::select")
def select(ctx, node, args):
    x, dim, index = args
    if not isinstance(x, T):
        return [x[index]]
    rank = len(ctx.shape_of(x))
    out = ctx.out(node)
    part = T(ctx.tmp(out + "_slice"))
    end = index + 1 if index != -1 else 2 ** 31 - 1
    ins = [x] + [ctx.tensor(np.array([v], np.int32)) for v in (index, end, dim, 1)]
    ctx.emit("StridedSlice", ins, [part], {"fromType": 1})
    return ctx.emit("Squeeze", [part], [out], {"squeezeDims": [int(dim) % rank]})


@aten("aten::mean", "aten::sum", "aten::amax")
def reduce(ctx, node, args):
    x = args[0]
    dims = args[1] if len(args) > 1 and args[1] is not None else list(range(len(ctx.shape_of(x))))
    keep = bool(args[2]) if len(args) > 2 else False
    op = {"aten::mean": "MEAN", "aten::sum": "SUM", "aten::amax": "MAXIMUM"}[node.kind()]
    return ctx.emit("Reduction", [x], [ctx.out(node)], {"operation": op, "dim": [int(d) for d in dims],
                                                        "keepDims": keep, "dType": "DT_FLOAT"})


@aten("aten::lstm")
def lstm(ctx, node, args):
    """aten::lstm -> the ONNX LSTM unrolling, one call per layer (torch gates i,f,g,o -> ONNX i,o,f,c)."""
    from .onnx.rnn import lstm as onnx_lstm
    x, hx, params, has_bias, layers, _, _, bidir, batch_first = args[:9]
    dirs = 2 if bidir else 1
    if batch_first:
        xt = T(ctx.tmp(ctx.out(node) + "_seqfirst"))
        ctx.emit("Permute", [x], [xt], {"dims": [1, 0, 2]})
        x = xt
    per = 4 if has_bias else 2
    h0, c0 = hx
    hs, cs = [], []
    for layer in range(layers):
        ws, rs, bs = [], [], []
        for d in range(dirs):
            p = params[(layer * dirs + d) * per:(layer * dirs + d + 1) * per]
            def order(a):
                parts = np.split(np.asarray(a, np.float32), 4)
                return np.concatenate([parts[i] for i in (0, 3, 1, 2)])
            ws.append(order(p[0]))
            rs.append(order(p[1]))
            bs.append(np.concatenate([order(p[2]), order(p[3])]) if has_bias else np.zeros(8 * rs[-1].shape[1]))
        hidden = rs[0].shape[1]
        names = {k: ctx.g.add_const(f"lstm{layer}_{k}", v) for k, v in
                 (("W", np.stack(ws)), ("R", np.stack(rs)), ("B", np.stack(bs).astype(np.float32)))}
        init = []
        for state in (h0, c0):
            s = np.asarray(state, np.float32)[layer * dirs:(layer + 1) * dirs] if not isinstance(state, T) else None
            if s is None:
                raise MnnToolError(f"{ctx.path}: aten::lstm: initial states must be constants")
            init.append(ctx.g.add_const(f"lstm{layer}_init", s))
        y, yh, yc = (ctx.tmp(f"lstm{layer}_{k}") for k in ("Y", "Yh", "Yc"))
        fake = SimpleNamespace(op_type="LSTM", name=f"lstm{layer}", input=[x, names["W"], names["R"], names["B"], "",
                                                                            init[0], init[1]],
                               output=[y, yh, yc])
        onnx_lstm(ctx, fake, {"hidden_size": hidden, "direction": b"bidirectional" if bidir else b"forward"})
        seq, batch = ctx.shape_of(T(x))[:2]
        perm = T(ctx.tmp(f"lstm{layer}_perm"))
        ctx.emit("Permute", [y], [perm], {"dims": [0, 2, 1, 3]})
        x = ctx.reshape(perm, [seq, batch, dirs * hidden], ctx.tmp(f"lstm{layer}_out"))[0]
        hs.append(yh)
        cs.append(yc)
    out = x
    if batch_first:
        o2 = T(ctx.tmp(ctx.out(node) + "_batchfirst"))
        ctx.emit("Permute", [out], [o2], {"dims": [1, 0, 2]})
        out = o2
    h_n, c_n = T(ctx.tmp("h_n")), T(ctx.tmp("c_n"))
    ctx.emit("Concat", [T(h) for h in hs], [h_n], {"axis": 0})
    ctx.emit("Concat", [T(c) for c in cs], [c_n], {"axis": 0})
    return [out, h_n, c_n]


def _walk(ctx, nodes, env):
    for n in nodes:
        k = n.kind()
        if k == "prim::Constant":
            env[n.output().unique()] = _ivalue(n)
            continue
        fn = ATEN.get(k) or ATEN.get(k.rstrip("_"))
        if fn is None:
            what = "the model raises an exception for these input shapes" if k == "prim::RaiseException" else \
                f"unsupported TorchScript op {k}"
            raise MnnToolError(f"{ctx.path}: {what} ({n.scopeName() or 'graph'})")
        args = [env.get(i.unique()) for i in n.inputs()]
        try:
            outs = fn(ctx, n, args)
        except MnnToolError:
            raise
        except Exception as e:
            raise MnnToolError(f"{ctx.path}: {k} ({n.scopeName() or 'graph'}): cannot convert "
                               f"({type(e).__name__}: {e})") from None
        for o, val in zip(n.outputs(), outs):
            env[o.unique()] = val


def load_torchscript(path, input_shapes: dict) -> Graph:
    path = Path(path)
    try:
        import torch
    except ImportError:
        raise MnnToolError("TorchScript needs torch: pip install 'mnntool[torch]'") from None
    if not path.exists():
        raise MnnToolError(f"{path}: no such file")
    try:
        module = torch.jit.load(str(path), map_location="cpu").eval()
    except Exception as e:
        raise MnnToolError(f"{path}: not a TorchScript model ({type(e).__name__}: {str(e)[:100]})") from None
    try:
        module = torch.jit.freeze(module)
    except Exception:
        pass   # already frozen, or nothing to freeze
    graph = module.graph.copy()
    torch._C._jit_pass_inline(graph)
    inputs = [v for v in graph.inputs() if not v.type().kind() == "ClassType"]
    names = [v.debugName().split(".")[0] for v in inputs]
    missing = [n for n in names if n not in input_shapes]
    if missing:
        raise MnnToolError(f"{path}: TorchScript needs --input-shape for {', '.join(missing)} "
                           f"(inputs: {', '.join(names)})")
    unsupported = {}
    def scan(nodes):
        for n in nodes:
            k = n.kind()
            if k not in ATEN and k.rstrip("_") not in ATEN and k not in ("prim::Constant", "prim::GetAttr"):
                unsupported.setdefault(k, []).append(n.scopeName() or "?")
    scan(graph.nodes())     # branches of prim::If are checked when chosen (untaken ones may raise)
    if unsupported:
        listed = "; ".join(f"{k} ({len(v)}x)" for k, v in sorted(unsupported.items()))
        raise MnnToolError(f"{path}: unsupported TorchScript ops: {listed}")
    g = Graph(source="TORCH", name=path.stem)
    ctx = TorchCtx(g, str(path))
    env: dict = {}
    for v, name in zip(inputs, names):
        dtype = "int32" if "Long" in str(v.type()) or "Int" in str(v.type()) else "float32"
        env[v.unique()] = ctx.add_input(name, input_shapes[name], dtype)
    ctx.env = env
    _walk(ctx, graph.nodes(), env)
    results = []
    for v in graph.outputs():
        val = env[v.unique()]
        results.extend(val if isinstance(val, list) else [val])
    for k, r in enumerate(results):
        if not isinstance(r, T):
            raise MnnToolError(f"{path}: output {k} is not a tensor computed by the model")
        g.outputs.append(str(r))
    if len(g.outputs) == 1 and g.outputs[0] != "output" and "output" not in g.tensors and \
            g.outputs[0] not in g.inputs and g.outputs[0] not in g.constants:
        producer = next(n for n in g.nodes if g.outputs[0] in n.outputs)
        producer.outputs[producer.outputs.index(g.outputs[0])] = "output"
        for n in g.nodes:
            n.inputs = ["output" if i == g.outputs[0] else i for i in n.inputs]
        g.outputs = ["output"]
    ctx.drop_unused_constants()
    return g
