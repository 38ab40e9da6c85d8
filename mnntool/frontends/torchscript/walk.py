"""Walking a TorchScript block: each node given to its converter, values kept by TorchScript value id.
Its own module so that control flow (which walks its branches and loop bodies) and the loader both
import it from below, never from the package."""
from __future__ import annotations

from ...errors import MnnToolError
from .context import ATEN, _ivalue, attribute


def walk(ctx, nodes, env):
    for n in nodes:
        k = n.kind()
        if k == "prim::Constant":
            env[n.output().unique()] = _ivalue(n)
            continue
        if k == "prim::GetAttr":    # what freezing left: a submodule, a weight read off one, or module state
            env[n.output().unique()] = attribute(ctx, env.get(n.input().unique()), n.s("name"))
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
        if k.endswith("_") and not k.endswith("__") and outs and n.outputs():
            write_back(ctx, n.inputsAt(0), outs[0], env)


# views that read all of their base's elements in the same order (writing one writes the base)
WHOLE_VIEWS = {"aten::contiguous", "aten::alias", "aten::detach", "aten::view", "aten::reshape", "aten::flatten",
               "aten::unsqueeze", "aten::squeeze", "aten::view_as", "aten::reshape_as"}


def write_back(ctx, value, result, env):
    """An in-place op (x.index_put_, x.add_) changes its operand and every tensor it is a view of: later
    readers of those values read the result. A view of part of a tensor (a slice) is written back into it."""
    from ..shape_tracking import T, emit_onnx
    env[value.unique()] = result
    node = value.node()
    k = node.kind()
    if not isinstance(result, T) or k not in WHOLE_VIEWS | {"aten::slice"}:
        return
    base = node.inputsAt(0)
    old = env.get(base.unique())
    if not isinstance(old, T):
        return
    shape = ctx.shape_of(old)
    if k == "aten::slice":
        dim, start, end, step = (env.get(node.inputsAt(i).unique()) for i in range(1, 5))
        dim = int(dim) % len(shape)
        start = 0 if start is None else int(start) + (shape[dim] if int(start) < 0 else 0)
        end = shape[dim] if end is None else min(int(end) + (shape[dim] if int(end) < 0 else 0), shape[dim])
        if (start, end, step) != (0, shape[dim], 1):
            if step != 1:
                raise MnnToolError(f"{ctx.path}: {value.node().kind()} ({node.scopeName() or 'graph'}): an in-place "
                                   "write to a strided slice of a tensor is not supported")
            parts = []
            if start:
                parts.append(emit_onnx(ctx, "Slice", [old, [0], [start], [dim]], [ctx.tmp(f"{old}_head")])[0])
            parts.append(result)
            if end < shape[dim]:
                parts.append(emit_onnx(ctx, "Slice", [old, [end], [shape[dim]], [dim]], [ctx.tmp(f"{old}_tail")])[0])
            result = emit_onnx(ctx, "Concat", parts, [ctx.tmp(f"{old}_written")], {"axis": dim})[0]
            return write_back(ctx, base, result, env)
    if tuple(ctx.shape_of(result)) != tuple(shape):
        result = ctx.reshape(result, shape, ctx.tmp(f"{old}_written"))[0]
    write_back(ctx, base, result, env)
