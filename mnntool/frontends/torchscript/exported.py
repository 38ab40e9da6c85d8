"""torch.export programs (`.pt2` from torch.export.save) -> IR, through the same aten converters as
TorchScript: the program's FX graph is walked node by node, each call given to the converter of its
aten op with its schema's defaults filled in, so one lowering serves both frontends.

Loading never runs code from the file: torch's loader unpickles some weights and constants, and here
every unpickling goes through torch's weights-only unpickler (tensors and plain values; anything else
is refused). Shapes are fixed at conversion, as in the TorchScript frontend, when the program has none
open or --input-shape fixes them; a program with open dims (torch.export's Dim) is translated by torch's
ONNX exporter, which keeps them as symbols, and converted by the ONNX frontend.
"""
from __future__ import annotations

import contextlib
import operator
from pathlib import Path

from ...errors import MnnToolError
from ...ir.graph import Graph
from ..shape_tracking import T, given_shape
from .context import ATEN, TorchCtx, torch_for

_PY = {operator.add, operator.sub, operator.mul, operator.floordiv, operator.truediv, operator.mod, operator.neg,
       operator.getitem, operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge}


class _Value:
    """What the aten converters read of a TorchScript value: its name and type."""

    def __init__(self, name: str, type_text: str = "Tensor"):
        self._name, self._type = name, type_text

    def debugName(self) -> str:     # noqa: N802 - TorchScript's name
        return self._name

    def type(self) -> str:
        return self._type


class _Call:
    """An FX call seen as a TorchScript node by the aten converters (kind, output names, input types)."""

    def __init__(self, fx_node, kind: str, arg_nodes: list):
        self.fx, self._kind, self._args = fx_node, kind, arg_nodes

    def kind(self) -> str:
        return self._kind

    def outputsAt(self, k: int) -> _Value:   # noqa: N802
        return _Value(self.fx.name if k == 0 else f"{self.fx.name}_{k}")

    def inputs(self) -> list[_Value]:
        return [_Value(getattr(a, "name", "const"), _type_text(a)) for a in self._args]

    def scopeName(self) -> str:     # noqa: N802
        return self.fx.name

    def list_item_is_bool(self, arg: int, k: int) -> bool:
        """Whether item k of list operand `arg` (an index list) holds booleans, from the program's metadata."""
        items = self._args[arg] if arg < len(self._args) else None
        item = items[k] if isinstance(items, (list, tuple)) and k < len(items) else None
        return _type_text(item) == "Bool"

    def blocks(self):
        return []


def _type_text(a) -> str:
    val = getattr(a, "meta", {}).get("val") if hasattr(a, "meta") else None
    dtype = getattr(val, "dtype", None)
    return "Bool" if str(dtype) == "torch.bool" else "Tensor"


@contextlib.contextmanager
def _weights_only():
    """torch.export.load with every unpickling restricted to torch's weights-only unpickler."""
    import pickle
    import torch
    from torch.export.pt2_archive import _package
    real_load = torch.load

    def safe_load(*args, **kwargs):
        kwargs["weights_only"] = True
        return real_load(*args, **kwargs)

    class _NoPickle:
        def __getattr__(self, name):
            if name in ("loads", "load"):
                raise MnnToolError("the archive holds a pickled object that is not a tensor; refused")
            return getattr(pickle, name)
    saved = (torch.load, getattr(_package, "pickle", None), torch._C._pickle_load_obj)

    def refuse(*_a, **_k):
        raise MnnToolError("the archive holds a scripted object; refused")
    torch.load, _package.pickle, torch._C._pickle_load_obj = safe_load, _NoPickle(), refuse
    try:
        yield
    finally:
        torch.load, _package.pickle, torch._C._pickle_load_obj = saved


def _dtype_code(v):
    """torch dtypes as TorchScript's scalar-type numbers, which the aten converters read."""
    import torch
    codes = {torch.uint8: 0, torch.int8: 1, torch.int16: 2, torch.int32: 3, torch.int64: 4, torch.float16: 5,
             torch.float32: 6, torch.float64: 7, torch.bool: 11, torch.bfloat16: 15}
    return codes.get(v, v) if isinstance(v, torch.dtype) else v


def _kind(target) -> str | None:
    name = getattr(target, "name", None)
    if callable(name):
        ns_op = name()              # "aten::conv2d" (overload dropped)
        return ns_op.split(".")[0]
    return None


def load_exported(path, input_shapes: dict) -> Graph:
    path = Path(path)
    torch = torch_for(path, "converting torch.export programs")
    try:
        with _weights_only():
            ep = torch.export.load(str(path))
    except MnnToolError as e:
        raise MnnToolError(f"{path}: {e}") from None
    except Exception as e:      # noqa: BLE001 - a damaged archive shows itself in many ways
        raise MnnToolError(f"{path}: not a torch.export program ({type(e).__name__}: {' '.join(str(e).split())[:120]})") \
            from None
    sig = ep.graph_signature
    from torch.export.graph_signature import InputKind
    user = {spec.arg.name for spec in sig.input_specs if spec.kind == InputKind.USER_INPUT}
    open_dims = [n.name for n in ep.graph.nodes if n.op == "placeholder" and n.name in user and
                 n.name not in input_shapes and any(not isinstance(d, int) for d in n.meta["val"].shape)]
    if open_dims:
        return _through_onnx(path, ep, input_shapes)
    params = {}
    for spec in sig.input_specs:
        if spec.kind != InputKind.USER_INPUT:
            value = ep.state_dict.get(spec.target) if spec.target in ep.state_dict else ep.constants.get(spec.target)
            if value is None:
                raise MnnToolError(f"{path}: the program's {spec.kind.name.lower()} '{spec.target}' has no value")
            params[spec.arg.name] = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value
    nodes = list(ep.graph.nodes)
    unsupported: dict[str, int] = {}
    for n in nodes:
        if n.op == "call_function" and n.target not in _PY:
            k = _kind(n.target)
            if k is None or (k not in ATEN and k.rstrip("_") not in ATEN):
                key = k or str(n.target)
                unsupported[key] = unsupported.get(key, 0) + 1
    if unsupported:
        listed = "; ".join(f"{k} ({v}x)" for k, v in sorted(unsupported.items()))
        raise MnnToolError(f"{path}: unsupported ops in the program: {listed}")
    g = Graph(source="TORCH", name=path.stem)
    ctx = TorchCtx(g, str(path))
    env: dict = {}
    for n in nodes:
        if n.op == "placeholder":
            if n.name in params:
                env[n.name] = params[n.name]
                continue
            val = n.meta.get("val")
            shape = input_shapes.get(n.name)
            if shape is not None and val is not None:     # a torch.export.Dim is open, an int dim fixed
                shape = given_shape(path, n.name, [d if isinstance(d, int) else None for d in val.shape], shape)
            if shape is None:
                shape = tuple(int(d) if isinstance(d, int) else int(d.node.hint) for d in val.shape)
            dtype = "int32" if val is not None and not val.dtype.is_floating_point else "float32"
            env[n.name] = ctx.add_input(n.name, shape, dtype)
        elif n.op == "call_function":
            env[n.name] = _call(ctx, n, env)
        elif n.op == "output":
            outs = n.args[0]
            results = [env[o.name] if hasattr(o, "name") else o for o in (outs if isinstance(outs, (list, tuple)) else [outs])]
            for k, r in enumerate(results):
                if not isinstance(r, T):
                    raise MnnToolError(f"{path}: output {k} is not a tensor computed by the program")
                g.outputs.append(str(r))
    missing = [k for k in input_shapes if k not in g.inputs]
    if missing:
        raise MnnToolError(f"{path}: --input-shape names {', '.join(missing)}; the inputs are {', '.join(g.inputs)}")
    ctx.drop_unused_constants()
    return g


def _through_onnx(path: Path, ep, input_shapes: dict) -> Graph:
    """A program with dims left open: torch's exporter translates its ATen graph to ONNX (its
    decompositions, not the model's code: a program holds only ATen calls), keeping the open dims as
    symbols, and the ONNX frontend converts that."""
    import io
    import tempfile
    import torch
    from ..onnx import load_onnx
    with tempfile.TemporaryDirectory(prefix="mnntool-pt2-") as tmp:
        onnx_path = Path(tmp) / (path.stem + ".onnx")
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                torch.onnx.export(ep, dynamo=True).save(str(onnx_path))
        except Exception as e:      # noqa: BLE001
            raise MnnToolError(f"{path}: its open dims could not be kept ({type(e).__name__}: "
                               f"{' '.join(str(e).split())[:160]}); fix them with --input-shape") from None
        try:
            g = load_onnx(onnx_path, input_shapes)
        except MnnToolError as e:
            raise MnnToolError(str(e).replace(str(onnx_path), str(path))) from None
    g.source, g.name = "TORCH", path.stem
    return g


def _call(ctx, n, env):
    def value(a):
        if hasattr(a, "name") and hasattr(a, "op"):
            return env[a.name]
        if isinstance(a, (list, tuple)):
            return type(a)(value(x) for x in a)
        return _dtype_code(a)
    if n.target in _PY:
        args = [value(a) for a in n.args]
        if n.target is not operator.getitem and any(isinstance(a, T) for a in args):
            raise MnnToolError(f"{ctx.path}: {n.target.__name__} on tensors ('{n.name}') is not supported")
        return n.target(*args)
    kind = _kind(n.target)
    fn = ATEN.get(kind) or ATEN.get(kind.rstrip("_"))
    schema = n.target._schema
    raw = list(n.args)
    for arg in schema.arguments[len(raw):]:     # every argument in order, as TorchScript lists them
        raw.append(n.kwargs[arg.name] if arg.name in n.kwargs else (arg.default_value if arg.has_default_value() else None))
    try:
        outs = fn(ctx, _Call(n, kind, raw), [value(a) for a in raw])
    except MnnToolError:
        raise
    except Exception as e:      # noqa: BLE001
        raise MnnToolError(f"{ctx.path}: {kind} ('{n.name}'): cannot convert ({type(e).__name__}: {e})") from None
    return outs[0] if len(outs) == 1 else list(outs)
