"""TorchScript control flow. prim::If on a value known at conversion inlines its branch; on a run-time
tensor it becomes MNN's If with both blocks as bodies. prim::Loop with a known trip count and a
condition that stays a known value is unrolled; otherwise it becomes MNN's While (ONNX Loop form, see
ir/ops/control.py). A block reads outer tensors by name: each becomes an input of its body."""
from __future__ import annotations

import numpy as np

from ...errors import MnnToolError
from ...ir.graph import Graph
from ...ir.ops.control import if_binding
from ..shape_tracking import T
from .context import ATEN, TorchCtx, aten
from .walk import walk

MAX_UNROLL = 4096


def _defined(block) -> set:
    out = {v.unique() for v in block.inputs()}
    for n in block.nodes():
        out.update(o.unique() for o in n.outputs())
        for b in n.blocks():
            out |= _defined(b)
    return out


def _free(block, inner: set | None = None) -> list:
    """Values the block reads that it does not define, in order of first use."""
    inner = _defined(block) if inner is None else inner
    seen, out = set(), []

    def visit(b):
        for n in b.nodes():
            for v in n.inputs():
                if v.unique() not in inner and v.unique() not in seen:
                    seen.add(v.unique())
                    out.append(v)
            for sub in n.blocks():
                visit(sub)
        for v in b.outputs():
            if v.unique() not in inner and v.unique() not in seen:
                seen.add(v.unique())
                out.append(v)
    visit(block)
    return out


def _body(ctx, block, name: str, leading: list) -> tuple[Graph, list[str]]:
    """The block as a graph: inputs `leading` [(TS value, name, shape, dtype)] then the outer tensors it
    reads; returns it and those outer tensor names."""
    sub = Graph(source="TORCH", name=name)
    sctx = TorchCtx(sub, ctx.path, parent=ctx)
    env = dict(ctx.env)
    for v, nm, shape, dtype in leading:
        env[v.unique()] = sctx.add_input(nm, shape, dtype)
    captured = []
    for v in _free(block):
        val = ctx.env.get(v.unique())
        if isinstance(val, T) and str(val) not in sub.inputs:
            sctx.add_input(str(val), ctx.shape_of(val), ctx.val(val).dtype)
            captured.append(str(val))
    sctx.env = env
    walk(sctx, block.nodes(), env)
    outs = []
    for v in block.outputs():
        val = env[v.unique()]
        outs.append(str(val) if isinstance(val, T) else str(sctx.tensor(val)))
    sub.outputs = outs
    sctx.drop_unused_constants()
    return sub, captured


@aten("prim::If")
def if_(ctx, node, args):
    cond = args[0]
    blocks = list(node.blocks())
    if not isinstance(cond, T):     # known at conversion (shape checks in scripted code): inline the branch
        block = blocks[0 if cond else 1]
        walk(ctx, block.nodes(), ctx.env)
        return [ctx.env[o.unique()] for o in block.outputs()]
    base = ctx.out(node) if list(node.outputs()) else ctx.g.fresh_name("if")     # a branch for its effects only
    then_g, then_in = _body(ctx, blocks[0], ctx.g.fresh_name(f"{base}/then"), [])
    else_g, else_in = _body(ctx, blocks[1], ctx.g.fresh_name(f"{base}/else"), [])
    captured, param = if_binding(then_g, then_in, else_g, else_in)
    outs = [ctx.out(node, k) if k else base for k in range(len(then_g.outputs))]
    return ctx.emit("If", [cond] + captured, outs, param, base,
                    graphs={"then_graph": then_g, "else_graph": else_g})


@aten("prim::Loop")
def loop(ctx, node, args):
    trips, cond, carried = args[0], args[1], list(args[2:])
    block = list(node.blocks())[0]
    ins = list(block.inputs())
    if not isinstance(trips, T) and not isinstance(cond, T):
        values, step = carried, 0
        while cond and step < trips:
            if step >= MAX_UNROLL:
                break
            env = ctx.env
            env[ins[0].unique()] = step
            for v, val in zip(ins[1:], values):
                env[v.unique()] = val
            walk(ctx, block.nodes(), env)
            outs = [env[o.unique()] for o in block.outputs()]
            cond, values = outs[0], outs[1:]
            step += 1
            if isinstance(cond, T):
                raise MnnToolError(f"{ctx.path}: prim::Loop: a condition computed from tensors after "
                                   f"{step} unrolled steps is not supported")
        else:
            return values
        # too many steps to unroll: fall through to a loop op
    if any(not isinstance(c, T) for c in carried):
        carried = [c if isinstance(c, T) else ctx.tensor(c) for c in carried]
    base = ctx.out(node)
    leading = [(ins[0], f"{base}_i", (), "int32")] + [(v, f"{base}_c{k}", ctx.shape_of(c), ctx.val(c).dtype)
                                                      for k, (v, c) in enumerate(zip(ins[1:], carried))]
    sub, captured = _body(ctx, block, ctx.g.fresh_name(f"{base}/body"), leading)
    # ONNX Loop form: body inputs [i, cond, carried..., captured...], outputs [cond, carried..., captured...]
    sub.inputs.insert(1, f"{base}_cond_in")
    sub.tensors[f"{base}_cond_in"] = sub.info(f"{base}_cond_in")
    sub.tensors[f"{base}_cond_in"].dtype, sub.tensors[f"{base}_cond_in"].shape = "int32", ()
    sub.outputs = sub.outputs + captured
    big = trips if isinstance(trips, T) else ctx.tensor(np.array(min(int(trips), 2**31 - 1), np.int32))
    go = cond if isinstance(cond, T) else ctx.tensor(np.array(int(bool(cond)), np.int32))
    outs = [base] + [ctx.out(node, k) for k in range(1, len(carried))] + \
        [ctx.tmp(f"{base}_unused_{c}") for c in captured]
    result = ctx.emit("While", [big, go] + carried + captured, outs, {"body_graph": sub.name}, base,
                      graphs={"body_graph": sub})
    return result[:len(carried)]


def like_tensor(ctx, value, other):
    """A Python number beside a tensor as a constant of the tensor's type (MNN refuses int32 with float)."""
    if isinstance(value, T) or not isinstance(other, T):
        return value
    return ctx.tensor(np.asarray(value, np.float32 if ctx.val(other).dtype == "float32" else np.int32))


def _compare(op_type):
    def conv(ctx, node, args):
        a, b = args[0], args[1]
        if not isinstance(a, T) and not isinstance(b, T):
            return [PY[node.kind()](a, b)]
        from .onnx_like import onnx_op
        a, b = like_tensor(ctx, a, b), like_tensor(ctx, b, a)
        if node.kind() == "aten::ne":
            eq = onnx_op(ctx, node, "Equal", [a, b])[0]
            return ctx.emit("BinaryOp", [ctx.tensor(1), eq], [ctx.out(node)], {"opType": "SUB", "T": "DT_INT32"})
        return onnx_op(ctx, node, op_type, [a, b])
    return conv


PY = {"aten::gt": lambda a, b: a > b, "aten::lt": lambda a, b: a < b, "aten::ge": lambda a, b: a >= b,
      "aten::le": lambda a, b: a <= b, "aten::eq": lambda a, b: a == b, "aten::ne": lambda a, b: a != b}
for _k, _op in {"aten::gt": "Greater", "aten::lt": "Less", "aten::ge": "GreaterOrEqual", "aten::le": "LessOrEqual",
                "aten::eq": "Equal", "aten::ne": "ne"}.items():
    ATEN[_k] = _compare(_op)


@aten("aten::Bool", "aten::is_nonzero")
def to_bool(ctx, node, args):
    return [args[0] if isinstance(args[0], T) else bool(args[0])]
