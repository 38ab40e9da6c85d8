"""ONNX If and Loop -> MNN's If and While ops with their bodies as subgraphs (ir/ops/control.py has
the meaning). An If whose condition folds to a constant never gets here (fold.py inlines the branch).

A body reads outer tensors by name; each one it reads becomes an input of the body: an outer
constant is copied into it, a run-time tensor is passed in as an operand (as MNN's converter does).
"""
from __future__ import annotations

import onnx

from ...errors import MnnToolError
from ...ir.graph import Graph, TensorInfo
from ...ir.ops.control import if_binding
from .context import Ctx, attrs_of, ir_value
from .registry import CONVERTERS, converts
from .tensor import ir_dtype

MAX_TRIPS = 1 << 30     # a Loop without a trip count runs until its condition says stop (MNN's bound)


def all_nodes(graph):
    """The graph's nodes and those of every body inside it."""
    for n in graph.node:
        yield n
        for a in n.attribute:
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else
                        list(a.graphs) if a.type == onnx.AttributeProto.GRAPHS else []):
                yield from all_nodes(sub)


def convert_nodes(ctx, nodes) -> None:
    for k, n in enumerate(nodes):
        if not n.name:
            n.name = f"{n.op_type}_{k}"
        try:
            CONVERTERS[n.op_type](ctx, n, attrs_of(n))
        except MnnToolError:
            raise
        except (KeyError, IndexError, ValueError, TypeError) as e:
            raise MnnToolError(f"{ctx.path}: {n.op_type} '{n.name}': cannot convert ({type(e).__name__}: {e})") from None


def free_names(graph) -> list[str]:
    """Tensors the graph (or a body inside it) reads but does not define, in order of first use."""
    defined = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    out: list[str] = []
    for n in graph.node:
        reads = list(n.input)
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                reads += free_names(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for sub in a.graphs:
                    reads += free_names(sub)
        for name in reads:
            if name and name not in defined and name not in out:
                out.append(name)
        defined.update(o for o in n.output if o)
    out += [o.name for o in graph.output if o.name not in defined and o.name not in out]
    return out


def _declared(vi):
    tt = vi.type.tensor_type
    dtype = ir_dtype(tt.elem_type) if tt.elem_type else "float32"
    shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or f"{vi.name}_d{k}")
                  for k, d in enumerate(tt.shape.dim)) if tt.HasField("shape") else None
    return dtype or "float32", shape


def build_body(ctx, body, name: str, leading: list[tuple[str, str, tuple]] = ()) -> tuple[Graph, list[str]]:
    """The body as an IR graph whose inputs are `leading` (name, dtype, shape) then the outer run-time
    tensors it reads; returns it and those outer names, in the order they were appended."""
    sub = Graph(source=ctx.g.source, name=name)
    sctx = Ctx(sub, ctx.path, ctx.shapes, ctx.dtypes)
    sctx.opset, sctx.wide = ctx.opset, ctx.wide
    for inp, dtype, shape in leading:
        sub.inputs.append(inp)
        sub.tensors[inp] = TensorInfo(inp, dtype, shape)
    for init in body.initializer:
        value = ir_value(onnx.numpy_helper.to_array(init))
        sub.constants[init.name] = value
        sub.tensors[init.name] = TensorInfo(init.name, str(value.dtype), tuple(value.shape))
    captured = []
    for outer in free_names(body):
        if outer in sub.inputs or outer in sub.constants:
            continue
        value = ctx.const(outer)
        if value is not None:
            sub.constants[outer] = value
            sub.tensors[outer] = TensorInfo(outer, str(value.dtype), tuple(value.shape))
            continue
        if outer not in ctx.g.inputs and not any(outer in n.outputs for n in ctx.g.nodes):
            raise MnnToolError(f"{ctx.path}: body '{name}' reads '{outer}', which is defined nowhere")
        dtype = "float32" if ctx.dtype(outer).startswith(("float", "bfloat")) else "int32"
        sub.inputs.append(outer)
        sub.tensors[outer] = TensorInfo(outer, dtype, ctx.shape(outer))
        captured.append(outer)
    convert_nodes(sctx, body.node)
    sub.outputs = [o.name for o in body.output]
    used = {i for n in sub.nodes for i in n.inputs} | set(sub.outputs)
    for c in [c for c in sub.constants if c not in used]:
        del sub.constants[c]
    sub.toposort()
    return sub, captured


def _scoped(ctx, node, role: str) -> str:
    return ctx.g.fresh_name(f"{node.name}/{role}")


@converts("If")
def if_(ctx, node, a):
    then_g, then_in = build_body(ctx, a["then_branch"], _scoped(ctx, node, "then"))
    else_g, else_in = build_body(ctx, a["else_branch"], _scoped(ctx, node, "else"))
    if len(then_g.outputs) != len(node.output) or len(else_g.outputs) != len(node.output):
        raise MnnToolError(f"{ctx.path}: If '{node.name}': the branches give {len(then_g.outputs)} and "
                           f"{len(else_g.outputs)} outputs for its {len(node.output)}")
    captured, param = if_binding(then_g, then_in, else_g, else_in)
    ctx.emit("If", [node.input[0]] + captured, list(node.output), param, node.name,
             graphs={"then_graph": then_g, "else_graph": else_g})


@converts("Loop")
def loop(ctx, node, a):
    body = a["body"]
    n = len(node.input) - 2
    k = len(node.output) - n
    if len(body.input) != n + 2 or len(body.output) != n + k + 1:
        raise MnnToolError(f"{ctx.path}: Loop '{node.name}': its body takes {len(body.input)} inputs and gives "
                           f"{len(body.output)} outputs for {n} loop-carried values")
    leading = []
    for vi, outer in zip(body.input, ["", ""] + list(node.input[2:])):
        dtype, shape = _declared(vi)
        if outer and outer in ctx.g.tensors and ctx.g.tensors[outer].shape is not None:
            shape = ctx.g.tensors[outer].shape
        leading.append((vi.name, dtype, shape))
    leading[0] = (leading[0][0], "int32", ())
    leading[1] = (leading[1][0], "int32", leading[1][2] or ())
    sub, captured = build_body(ctx, body, _scoped(ctx, node, "body"), leading)
    # the outer tensors it reads ride along as carried values the body passes through
    sub.outputs = sub.outputs[:1 + n] + captured + sub.outputs[1 + n:]
    trips = node.input[0] or ctx.int_const(f"{node.name}_max_trips", [MAX_TRIPS])
    cond = node.input[1] or ctx.int_const(f"{node.name}_cond", [1])
    unused = [ctx.tmp(f"{node.name}_unused_{c}") for c in captured]
    outs = list(node.output[:n]) + unused + list(node.output[n:])
    ctx.emit("While", [trips, cond] + list(node.input[2:]) + captured, outs, {"body_graph": sub.name}, node.name,
             graphs={"body_graph": sub})
