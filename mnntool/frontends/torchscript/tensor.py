"""aten reshapes, transposes, joins, splits and slices -> IR."""
from __future__ import annotations

import numpy as np

from ..shape_tracking import T
from .context import aten


@aten("aten::flatten")
def flatten(ctx, node, args):
    shape = ctx.shape_of(args[0])
    start, end = args[1] % len(shape), args[2] % len(shape)
    dims = list(shape[:start]) + [int(np.prod(shape[start:end + 1]))] + list(shape[end + 1:])
    return ctx.reshape(args[0], dims, ctx.out(node))


@aten("aten::reshape", "aten::view")
def reshape(ctx, node, args):
    return ctx.reshape(args[0], args[1], ctx.out(node))


@aten("aten::reshape_as", "aten::view_as")
def reshape_as(ctx, node, args):
    shape = ctx.shape_of(args[1])
    if not isinstance(args[0], T):
        return [np.asarray(args[0]).reshape(shape)]
    return ctx.reshape(args[0], shape, ctx.out(node))


@aten("aten::squeeze")
def squeeze(ctx, node, args):
    """squeeze(x), squeeze(x, dim) or squeeze(x, dims): only dims of size 1 go (others stay, as in torch)."""
    x = args[0]
    shape = ctx.shape_of(x)
    dims = range(len(shape)) if len(args) < 2 or args[1] is None else \
        ([args[1]] if isinstance(args[1], int) else list(args[1]))
    gone = sorted({int(d) % max(len(shape), 1) for d in dims if len(shape) and shape[int(d)] == 1})
    if not isinstance(x, T):
        return [np.squeeze(np.asarray(x), tuple(gone))]
    if not gone:
        return [x]
    return ctx.emit("Squeeze", [x], [ctx.out(node)], {"squeezeDims": gone})


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


@aten("aten::cat")
def cat(ctx, node, args):
    # torch.cat skips 1-D empty tensors (an empty KV cache traced as torch.tensor([]))
    parts = [ctx.tensor(p) for p in args[0] if isinstance(p, T) or np.shape(p) != (0,)]
    if len(parts) == 1:
        return [parts[0]]
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


@aten("aten::slice")
def slice_(ctx, node, args):
    if len(args) == 4:          # a list's slice (scripted code: x.shape[-2:])
        return [list(args[0])[slice(args[1], args[2], args[3])]]
    x, dim, start, end, step = args[0], args[1], args[2], args[3], args[4]
    if not isinstance(x, T):
        if isinstance(x, np.ndarray):
            index = [slice(None)] * x.ndim
            index[int(dim)] = slice(start, end, step)
            return [x[tuple(index)]]
        return [x[slice(start, end, step)]]
    start = 0 if start is None else start
    end = 2 ** 31 - 1 if end is None or end > 2 ** 31 - 1 else end
    ins = [x] + [ctx.tensor(np.array([v], np.int32)) for v in (start, end, dim, step)]
    return ctx.emit("StridedSlice", ins, [ctx.out(node)], {"fromType": 1})


@aten("aten::select")
def select(ctx, node, args):
    x, dim, index = args
    if not isinstance(x, T):
        return [np.take(x, index, axis=int(dim)) if isinstance(x, np.ndarray) else x[index]]
    rank = len(ctx.shape_of(x))
    out = ctx.out(node)
    part = T(ctx.tmp(out + "_slice"))
    end = index + 1 if index != -1 else 2 ** 31 - 1
    ins = [x] + [ctx.tensor(np.array([v], np.int32)) for v in (index, end, dim, 1)]
    ctx.emit("StridedSlice", ins, [part], {"fromType": 1})
    return ctx.emit("Squeeze", [part], [out], {"squeezeDims": [int(dim) % rank]})


@aten("aten::unflatten")
def unflatten(ctx, node, args):
    x, dim, sizes = args
    shape = list(ctx.shape_of(x))
    dim = int(dim) % len(shape)
    sizes = [int(s) for s in sizes]
    if -1 in sizes:
        sizes[sizes.index(-1)] = shape[dim] // -int(np.prod(sizes))
    dims = shape[:dim] + sizes + shape[dim + 1:]
    if not isinstance(x, T):
        return [np.asarray(x).reshape(dims)]
    return ctx.reshape(x, dims, ctx.out(node))
