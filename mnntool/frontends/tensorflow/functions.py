"""Running GraphDef nodes through the converters, and TF2's functional control flow on top of that.

The main graph's calls are inlined as data beforehand (inline.py). The bodies of While, If and Case stay
functions: a While whose condition folds to a constant at each step (a loop over a known count: Keras
RNNs, `tf.while_loop` over a range) is unrolled; If and Case with a known predicate convert the branch
taken, and with a run-time predicate convert every branch and select the result (the branches of an
inference graph have no side effects). TensorLists, which Keras RNN loops carry, are Python lists of IR
tensors while the loop is unrolled."""
from __future__ import annotations

import numpy as np

from ...errors import MnnToolError
from ..shape_tracking import T, emit_onnx
from ..fold_unroll import fold, folded, unroll
from .inline import MAX_DEPTH, flat_body
from .ops import CONST_EVAL, OPS, _const, _fail, attr, op

CALL_OPS = {"StatefulPartitionedCall", "PartitionedCall"}
IGNORED = {"NoOp", "Assert"}       # no value: control edges only
# ops whose result is a list handle, never a model output (an unused one dangles in traced graphs)
LIST_HANDLES = {"TensorListReserve", "EmptyTensorList", "TensorListFromTensor", "TensorListSetItem",
                "TensorListPushBack"}


def ref(s: str) -> str:
    return s if ":" in s else s + ":0"


def run_nodes(ctx, nodes, env: dict) -> None:
    """Convert nodes (in dependency order) into ctx; env maps 'node:k' to an IR tensor or a value."""
    for n in nodes:
        if n.op in IGNORED:
            continue
        if n.op == "Const":
            if f"{n.name}:0" not in env:
                env[f"{n.name}:0"] = attr(n, "value")
            continue
        args = []
        for i in n.input:
            if i.startswith("^"):
                continue
            if ref(i) not in env:
                raise MnnToolError(f"{ctx.path}: {n.op} '{n.name}' reads '{i}', which nothing computes")
            args.append(env[ref(i)])
        start = len(ctx.g.nodes)
        try:
            if n.op in CONST_EVAL and all(not isinstance(a, (T, TensorList)) for a in args):
                outs = CONST_EVAL[n.op](n, args)
            elif n.op in OPS:
                outs = OPS[n.op](ctx, n, args)
            else:
                raise MnnToolError(f"{ctx.path}: {n.op} '{n.name}': only supported on constants")
        except MnnToolError:
            raise
        except Exception as e:
            raise MnnToolError(f"{ctx.path}: {n.op} '{n.name}': cannot convert ({type(e).__name__}: {e})") from None
        fold(ctx, start)
        for k, v in enumerate(folded(ctx, list(outs))):
            env[f"{n.name}:{k}"] = v


def _ordered(path, nodes):
    """A function body's nodes in dependency order (a FunctionDef lists them in any order)."""
    by_name = {n.name: n for n in nodes}
    order, state = [], {}
    for root in nodes:
        stack = [(root.name, False)]
        while stack:
            name, done = stack.pop()
            if done:
                state[name] = 2
                order.append(by_name[name])
                continue
            if state.get(name) == 2:
                continue
            if state.get(name) == 1:
                raise MnnToolError(f"{path}: a function body has a cycle through '{name}'")
            state[name] = 1
            stack.append((name, True))
            for i in by_name[name].input:
                src = i.lstrip("^").split(":")[0]
                if src in by_name and state.get(src) != 2:
                    stack.append((src, False))
    return order


def call(ctx, fname: str, values: list, where: str) -> list:
    """The outputs of library function `fname` applied to `values`, converted into ctx."""
    fdef = ctx.functions.get(fname)
    if fdef is None:
        raise MnnToolError(f"{ctx.path}: {where} calls function '{fname}', which the library lacks")
    args = [a.name for a in fdef.signature.input_arg]
    if len(args) != len(values):
        raise MnnToolError(f"{ctx.path}: {where} passes {len(values)} values to {fname}, which takes {len(args)}")
    body, rets = flat_body(fdef, ctx.functions)
    ctx.loops.nesting += 1          # a function that calls itself is stopped by the nesting bound
    try:
        if ctx.loops.nesting > MAX_DEPTH:
            raise MnnToolError(f"{ctx.path}: {where}: function calls nest deeper than {MAX_DEPTH}")
        env = {f"{a}:0": v for a, v in zip(args, values)}
        run_nodes(ctx, _ordered(ctx.path, body), env)
    finally:
        ctx.loops.nesting -= 1
    return [env[ref(r)] for r in rets]


def _where(node) -> str:
    return f"{node.op} '{node.name}'"


@op(*CALL_OPS)
def partitioned_call(ctx, node, args):
    return call(ctx, node.attr["f"].func.name, list(args), _where(node))


@op("While", "StatelessWhile")
def while_(ctx, node, args):
    cond, body = node.attr["cond"].func.name, node.attr["body"].func.name
    what = f"{ctx.path}: {_where(node)}"
    first = call(ctx, cond, list(args), _where(node))[0]
    if isinstance(first, T):
        return _looped(ctx, node, cond, body, list(args), first)
    return unroll(ctx.loops, what, lambda vs: call(ctx, cond, vs, _where(node))[0],
                  lambda vs: call(ctx, body, vs, _where(node)), list(args))


def _looped(ctx, node, cond: str, body: str, args: list, first: T) -> list:
    """A loop whose condition is known only at run time, as MNN's While (ONNX Loop form): the body graph
    runs the TF body and then the condition on its results, giving [condition, carried...]. TF passes
    the constants a loop reads (weights) as loop variables: those the body returns unchanged stay
    constants inside it; the others (a counter's start) are carried."""
    if any(isinstance(a, TensorList) for a in args):
        _fail(ctx, node, "a loop over a TensorList needs a condition known at conversion")
    outer = {k: a for k, a in enumerate(args) if isinstance(a, T)}      # the While's operands, by variable
    while True:
        sub, sctx, again, new = _loop_body(ctx, node, cond, body, args, outer)
        varying = {k for k, a in enumerate(args) if k not in outer
                   and (isinstance(new[k], T) or not np.array_equal(np.asarray(new[k]), np.asarray(a)))}
        if not varying:
            break
        outer.update((k, ctx.tensor(args[k])) for k in varying)
    order = sorted(outer)
    outs = []
    for k, v in enumerate([again] + [new[k] for k in order]):    # each body output a tensor of its own
        v = sctx.tensor(v)
        if v in sub.inputs or v in outs or v in sub.constants:
            v = sctx.emit("Identity", [v], [sctx.tmp(f"{sub.name}/out{k}")])[0]
        outs.append(v)
    sub.outputs = list(outs)
    sctx.drop_unused_constants()
    limit = ctx.tensor(np.asarray(2 ** 30, np.int32), node.name + "_max_trips")
    inputs = [ctx.tensor(ctx.as_nhwc(outer[k])) for k in order]
    results = ctx.emit("While", [limit, first] + inputs, [ctx.out(node, k) for k in order],
                       {"body_graph": sub.name}, node.name, graphs={"body_graph": sub})
    by_k = dict(zip(order, results))
    return [by_k.get(k, args[k]) for k in range(len(args))]


def _loop_body(ctx, node, cond: str, body: str, args: list, outer: dict):
    """The body graph with an input for each variable in `outer` (the rest are the constants themselves);
    returns it, its context, the condition on the body's results and those results (tensors in NHWC, or
    constants)."""
    from ...ir.graph import Graph
    from .context import TfCtx
    sub = Graph(source=ctx.g.source, name=ctx.g.fresh_name(f"{node.name}/body"))
    sctx = TfCtx(sub, ctx.path)
    sctx.functions, sctx.loops = ctx.functions, ctx.loops
    sctx.add_input(f"{sub.name}/iteration", (), "int32")
    sctx.add_input(f"{sub.name}/cond", (), "bool")
    values = []
    for k, a in enumerate(args):
        if k in outer:
            shape = ctx.tf_shape(outer[k])      # the body sees every variable in NHWC
            a = sctx.add_input(f"{sub.name}/v{k}", shape, ctx.val(outer[k]).dtype)
        values.append(a)
    ctx.loops.nesting += 1
    try:
        new = call(sctx, body, list(values), _where(node))
        if any(isinstance(v, TensorList) for v in new):
            _fail(ctx, node, "a loop run at run time cannot carry a TensorList")
        new = [sctx.as_nhwc(v) for v in new]
        again = call(sctx, cond, list(new), _where(node))[0]
    finally:
        ctx.loops.nesting -= 1
    for k in sorted(outer):
        before, after = sctx.shape_of(values[k]), sctx.shape_of(new[k])
        if before != after:
            _fail(ctx, node, f"loop variable {k} changes shape from {before} to {after} (only loops whose "
                             "variables keep their shapes run at run time)")
    return sub, sctx, again, new


def _select(ctx, node, pred, branches: list[list]) -> list:
    """branches[k]'s outputs where pred == k (a boolean pred picks branches [else, then])."""
    outs = []
    for k in range(len(branches[0])):
        vals = [b[k] for b in branches]
        if any(isinstance(v, TensorList) for v in vals):
            _fail(ctx, node, "a branch taken at run time returns a TensorList")
        y = vals[0]
        for j, v in enumerate(vals[1:], 1):
            hit = pred if len(branches) == 2 and ctx.val(pred).dtype == "bool" else \
                emit_onnx(ctx, "Equal", [pred, np.int32(j)], [ctx.tmp(f"{node.name}_is{j}")])[0]
            y = emit_onnx(ctx, "Where", [hit, ctx.tensor(ctx.as_nhwc(v)), ctx.tensor(ctx.as_nhwc(y))],
                          [ctx.out(node, k) if j == len(vals) - 1 else ctx.tmp(f"{node.name}_{k}_{j}")])[0]
        outs.append(y)
    return outs


@op("If", "StatelessIf")
def if_(ctx, node, args):
    pred, values = args[0], list(args[1:])
    then, else_ = node.attr["then_branch"].func.name, node.attr["else_branch"].func.name
    if not isinstance(pred, T):
        return call(ctx, then if bool(np.asarray(pred).reshape(-1)[0]) else else_, values, _where(node))
    if ctx.val(pred).dtype != "bool":
        pred = emit_onnx(ctx, "Cast", [pred], [ctx.tmp(node.name + "_pred")], {"to": 9})[0]
    return _select(ctx, node, pred, [call(ctx, else_, values, _where(node)), call(ctx, then, values, _where(node))])


@op("Case", "StatelessCase")
def case(ctx, node, args):
    index, values = args[0], list(args[1:])
    branches = [f.name for f in node.attr["branches"].list.func]
    if not isinstance(index, T):
        k = int(np.asarray(index).reshape(-1)[0])
        return call(ctx, branches[k if 0 <= k < len(branches) else -1], values, _where(node))
    # out of range means the last branch (TF's default): clip the index to it
    index = emit_onnx(ctx, "Clip", [emit_onnx(ctx, "Cast", [index], [ctx.tmp(node.name + "_i")], {"to": 6})[0],
                                    np.int32(0), np.int32(len(branches) - 1)], [ctx.tmp(node.name + "_k")])[0]
    neg = emit_onnx(ctx, "Less", [args[0], np.int32(0)], [ctx.tmp(node.name + "_neg")])[0]
    index = emit_onnx(ctx, "Where", [neg, np.int32(len(branches) - 1), index], [ctx.tmp(node.name + "_idx")])[0]
    return _select(ctx, node, index, [call(ctx, b, values, _where(node)) for b in branches])


# ---- TensorLists: Python lists of IR tensors while loops are unrolled ---------------------------------------

class TensorList(list):
    """A TensorList's items (None: not set yet)."""


def _index(ctx, node, v) -> int:
    return int(_const(ctx, node, v, "the list index").reshape(-1)[0])


@op("TensorListReserve", "EmptyTensorList")
def tl_reserve(ctx, node, args):
    n = _index(ctx, node, args[1]) if node.op == "TensorListReserve" else 0
    return [TensorList([None] * max(n, 0))]


@op("TensorListFromTensor")
def tl_from_tensor(ctx, node, args):
    x = ctx.tensor(ctx.as_nhwc(args[0]))
    n = ctx.shape_of(x)[0]
    parts = emit_onnx(ctx, "Split", [x], [ctx.tmp(f"{node.name}_p{k}") for k in range(n)], {"axis": 0}) if n > 1 \
        else [x]
    return [TensorList(emit_onnx(ctx, "Squeeze", [p, np.asarray([0], np.int64)], [ctx.tmp(f"{node.name}_{k}")])[0]
                       for k, p in enumerate(parts))]


def _list(ctx, node, v) -> TensorList:
    if not isinstance(v, TensorList):
        _fail(ctx, node, "expects a TensorList")
    return v


@op("TensorListGetItem")
def tl_get(ctx, node, args):
    items = _list(ctx, node, args[0])
    k = _index(ctx, node, args[1])
    if not -len(items) <= k < len(items) or items[k] is None:
        _fail(ctx, node, f"reads item {k}, which is not set")
    return [items[k]]


@op("TensorListSetItem")
def tl_set(ctx, node, args):
    items = TensorList(_list(ctx, node, args[0]))
    k = _index(ctx, node, args[1])
    if k >= len(items) and attr(node, "resize_if_index_out_of_bounds", False):
        items.extend([None] * (k + 1 - len(items)))
    if not 0 <= k < len(items):
        _fail(ctx, node, f"sets item {k} of a list of {len(items)}")
    items[k] = args[2]
    return [items]


@op("TensorListPushBack")
def tl_push(ctx, node, args):
    return [TensorList(_list(ctx, node, args[0]) + [args[1]])]


@op("TensorListLength")
def tl_length(ctx, node, args):
    return [np.asarray(len(_list(ctx, node, args[0])), np.int32)]


@op("TensorListStack")
def tl_stack(ctx, node, args):
    items = _list(ctx, node, args[0])
    if not items or any(i is None for i in items):
        _fail(ctx, node, "stacks a list with unset items")
    parts = [emit_onnx(ctx, "Unsqueeze", [ctx.tensor(ctx.as_nhwc(i)), np.asarray([0], np.int64)],
                       [ctx.tmp(f"{node.name}_u{k}")])[0] for k, i in enumerate(items)]
    if len(parts) == 1:
        return ctx.emit("Identity", parts, [ctx.out(node)], {})
    return emit_onnx(ctx, "Concat", parts, [ctx.out(node)], {"axis": 0})
