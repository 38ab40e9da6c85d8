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
from ..shape_tracking import T
from . import control, index, math, nn, onnx_like, pointwise, prim, state, tensor  # noqa: F401  (registration)
from .context import ATEN, SAME_TYPE, TorchCtx, is_bool, torch_for
from .walk import walk


def _defaults(module) -> dict:
    """forward's arguments that have a default value, by name."""
    try:
        args = module.forward.schema.arguments
    except (AttributeError, RuntimeError):
        return {}
    return {a.name: a.default_value for a in args if a.has_default_value()}


def _flat(val) -> list:
    """A model's outputs: tuples, lists and dicts (a traced ModelOutput) opened, in order."""
    if isinstance(val, dict):
        val = list(val.values())
    if isinstance(val, (list, tuple)):
        return [t for v in val for t in _flat(v)]
    return [val]


# where an operand holds integers: (op, operand position)
INDEX_OPERANDS = {"aten::embedding": 1, "aten::Int": 0, "aten::index_select": 2, "aten::gather": 2}


# transformers' integer inputs by their names (a 0/1 attention mask indexes nothing, yet holds integers)
INTEGER_NAMES = {"attention_mask", "token_type_ids", "decoder_attention_mask", "padding_mask"}


def _integer_values(graph) -> set:
    """A saved trace often types its inputs only as Tensor: the values that index (an embedding's token
    ids, an index list's tensors), followed back through the views and casts that carried them."""
    found = set()
    for n in graph.nodes():
        k = n.kind()
        if k in INDEX_OPERANDS:
            found.add(n.inputsAt(INDEX_OPERANDS[k]))
        elif k in ("aten::index", "aten::index_put_", "aten::index_put"):
            src = n.inputsAt(1).node()
            if src.kind() == "prim::ListConstruct":
                found.update(v for v in src.inputs() if not is_bool(v))
    ids, todo = set(), list(found)
    while todo:
        v = todo.pop()
        if v.unique() in ids:
            continue
        ids.add(v.unique())
        producer = v.node()
        if producer.kind() in SAME_TYPE | {"aten::to", "aten::type_as"} and producer.inputs():
            todo.append(producer.inputsAt(0))
    return ids


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
    defaults = _defaults(module)       # forward(x, mask: Optional[Tensor] = None): left out, the default holds
    kept = [k for k, n in enumerate(names) if n in input_shapes or n not in defaults]
    fixed = {inputs[k].unique(): defaults[names[k]] for k in range(len(inputs)) if k not in kept}
    inputs, names = [inputs[k] for k in kept], [names[k] for k in kept]
    plain = [f"{n} ({v.type()})" for n, v in zip(names, inputs) if v.type().kind() not in ("TensorType", "ClassType")]
    if plain:
        raise MnnToolError(f"{path}: inputs {', '.join(plain)} are not tensors; a converted model takes tensors "
                           "only (script a wrapper module that fixes them)")
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
    indices = _integer_values(graph)
    env: dict = {v.unique(): module for v in graph.inputs() if v.type().kind() == "ClassType"}
    env.update(fixed)
    for v, name in zip(inputs, names):
        dtype = "int32" if "Long" in str(v.type()) or "Int" in str(v.type()) or v.unique() in indices or \
            name in INTEGER_NAMES or name.endswith("_ids") else "float32"
        env[v.unique()] = ctx.add_input(name, input_shapes[name], dtype)
    ctx.env = env
    walk(ctx, graph.nodes(), env)
    results = []
    for v in graph.outputs():
        results.extend(_flat(env[v.unique()]))
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
