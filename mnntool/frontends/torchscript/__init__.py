"""TorchScript (.pt/.torchscript from torch.jit.trace or torch.jit.script) -> IR, walking the frozen,
inlined aten graph directly (not through torch's ONNX exporter).

Values are either IR tensors or Python values (ints, floats, lists, constant tensors). Shape arithmetic
(aten::size and the integer math on it) is evaluated at conversion time from the shapes inferred so
far, which is why --input-shape is required.
"""
from __future__ import annotations

from pathlib import Path

from ...errors import MnnToolError
from ...ir.graph import Graph
from ..shaped import T
from . import control, math, nn, onnx_like, pointwise, prim, tensor  # noqa: F401  (registration)
from .context import ATEN, TorchCtx, _ivalue, torch_for


def _walk(ctx, nodes, env):
    for n in nodes:
        k = n.kind()
        if k == "prim::Constant":
            env[n.output().unique()] = _ivalue(n)
            continue
        if k == "prim::GetAttr":    # what freezing left: a submodule, or a weight read off one
            env[n.output().unique()] = _attribute(ctx, env.get(n.input().unique()), n.s("name"))
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


def _attribute(ctx, owner, name: str):
    """An attribute of a loaded module as data: a submodule stays an object, a tensor becomes a constant
    array, a number or list stays a Python value (nothing of the model's code runs)."""
    import torch
    if owner is None:
        raise MnnToolError(f"{ctx.path}: prim::GetAttr '{name}' on a value that is not a module")
    value = getattr(owner, name)
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return value


def load_torchscript(path, input_shapes: dict) -> Graph:
    path = Path(path)
    torch = torch_for(path, "converting TorchScript models")
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
    # a saved trace often types its inputs only as Tensor: one that indexes an embedding holds token ids
    indices = {list(n.inputs())[1].unique() for n in graph.nodes() if n.kind() == "aten::embedding"} | \
        {list(n.inputs())[0].unique() for n in graph.nodes() if n.kind() == "aten::Int"}
    env: dict = {v.unique(): module for v in graph.inputs() if v.type().kind() == "ClassType"}
    for v, name in zip(inputs, names):
        dtype = "int32" if "Long" in str(v.type()) or "Int" in str(v.type()) or v.unique() in indices else "float32"
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
