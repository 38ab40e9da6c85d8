"""ONNX (opsets 11-19+) -> IR."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from ...errors import MnnToolError
from ...ir.graph import Graph, TensorInfo
from . import index, logic, math, nn, norm, quantized, rnn, tensor, volumetric  # noqa: F401  (registration)
from .context import Ctx, ir_value
from .control import all_nodes, convert_nodes
from .expand import expand_functions, opset_of
from .fold import fold, shapes_of
from .registry import CONVERTERS
from .tensor import ir_dtype
from .weights import checkable, read_model


def supported_ops() -> list[str]:
    return sorted(CONVERTERS)


def _read(path: Path) -> onnx.ModelProto:
    """The whole model as onnx loads it (for onnxruntime, which takes the message)."""
    if not path.exists():
        raise MnnToolError(f"{path}: no such file")
    if path.stat().st_size == 0:
        raise MnnToolError(f"{path}: file is empty")
    try:
        model = onnx.load(str(path))
    except Exception as e:  # protobuf raises several types for malformed bytes
        raise MnnToolError(f"{path}: not a valid ONNX model ({type(e).__name__}: {str(e)[:120]})") from None
    if not model.graph.node:
        raise MnnToolError(f"{path}: not a valid ONNX model (no graph nodes)")
    return model


ANONYMOUS_DIMS = ("", "?", "-1", "None", "none", "unk", "unknown")


def _open_dims(inp) -> None:
    """An input's dims that exporters mark open in ways other than a named symbol: a negative size (-1,
    as onnxruntime reads it) becomes a symbol of its own, and so does an anonymous symbol ('?', as the
    PP-OCR models declare [-1, 3, '?', '?']): two '?' are not the same size, where two uses of one name
    are. A 0 stays 0 unless --input-shape gives the dim (it is a valid, empty size)."""
    if not inp.type.HasField("tensor_type") or not inp.type.tensor_type.HasField("shape"):
        return
    for k, d in enumerate(inp.type.tensor_type.shape.dim):
        if (d.HasField("dim_value") and d.dim_value < 0) or (not d.HasField("dim_value") and
                                                             d.dim_param.strip() in ANONYMOUS_DIMS[1:]):
            d.dim_param = f"{inp.name}_d{k}"


def _fix_input_shapes(path, model, input_shapes: dict) -> None:
    init = {i.name for i in model.graph.initializer}
    real = [i for i in model.graph.input if i.name not in init]
    names = {i.name for i in real}
    for name in input_shapes:
        if name not in names:
            raise MnnToolError(f"{path}: --input-shape names '{name}', but the model's inputs are "
                               f"{', '.join(sorted(names))}")
    for inp in real:
        _open_dims(inp)
        if inp.name not in input_shapes:
            continue
        want = input_shapes[inp.name]
        dims = inp.type.tensor_type.shape.dim
        if len(dims) != len(want):
            raise MnnToolError(f"{path}: --input-shape {inp.name}: rank {len(want)} does not match the "
                               f"model's rank {len(dims)}")
        for d, w in zip(dims, want):
            if d.HasField("dim_value") and d.dim_value > 0 and d.dim_value != w:
                raise MnnToolError(f"{path}: --input-shape {inp.name}: {list(want)} conflicts with the model's "
                                   f"fixed shape {[x.dim_value or x.dim_param for x in dims]}")
            d.ClearField("dim_param")
            d.dim_value = int(w)


def _check(path, model) -> None:
    """onnx's checker with strict shape inference, before any converter sees the model. Failures inside
    the function bodies onnx ships for its own ops are onnx's (MVN's body at opset 13 fails so, and
    onnxruntime never uses it), not the model's: they are let through."""
    try:
        onnx.checker.check_model(checkable(model), full_check=True)
    except onnx.shape_inference.InferenceError as e:
        text = str(e)
        if text.count("Inference error(s)") > 1:
            return
        raise MnnToolError(f"{path}: onnx's shape inference refuses it: {' '.join(text.split())[:300]}") from None
    except onnx.checker.ValidationError as e:
        raise MnnToolError(f"{path}: onnx's checker refuses it: {' '.join(str(e).split())[:300]}") from None
    except (ValueError, UnicodeError) as e:     # names or strings that are not text (corrupt bytes)
        raise MnnToolError(f"{path}: onnx's checker cannot read it ({type(e).__name__}: "
                           f"{' '.join(str(e).split())[:160]})") from None


def load_onnx(path, input_shapes: dict) -> Graph:
    path = Path(path)
    model, weights = read_model(path)
    if not model.graph.node:
        raise MnnToolError(f"{path}: not a valid ONNX model (no graph nodes)")
    _check(path, model)
    _fix_input_shapes(path, model, input_shapes)
    expand_functions(model, set(CONVERTERS))
    fold(model, weights)
    unsupported = {}
    for n in all_nodes(model.graph):
        if n.domain not in ("", "ai.onnx") or n.op_type not in CONVERTERS:
            unsupported.setdefault(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}",
                                   []).append(n.name or "?")
    if unsupported:
        listed = "; ".join(f"{op} ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
                           for op, names in sorted(unsupported.items()))
        raise MnnToolError(f"{path}: unsupported ONNX ops: {listed}")
    g = Graph(source="ONNX", name=path.stem)
    dtypes: dict = {}
    ctx = Ctx(g, str(path), shapes_of(model, dtypes), dtypes)
    ctx.opset = opset_of(model)
    for init in model.graph.initializer:
        raw = weights.array(init)
        value = ir_value(raw)
        if raw.dtype == np.int64 and raw.size and (raw.max() > 2**31 - 1 or raw.min() < -2**31):
            ctx.wide[init.name] = raw      # clipped in the IR (slice ends of INT64_MAX); shapes must not be
        g.constants[init.name] = value
        g.tensors[init.name] = TensorInfo(init.name, str(value.dtype), tuple(value.shape))
    for inp in model.graph.input:
        if inp.name in g.constants:
            continue
        tt = inp.type.tensor_type
        shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or f"{inp.name}_d{k}")
                      for k, d in enumerate(tt.shape.dim))
        dtype = ir_dtype(tt.elem_type)
        if dtype is None:
            raise MnnToolError(f"{path}: input '{inp.name}' has type {onnx.TensorProto.DataType.Name(tt.elem_type)}, "
                               "which MNN cannot carry")
        g.inputs.append(inp.name)
        g.tensors[inp.name] = TensorInfo(inp.name, dtype, shape)
    convert_nodes(ctx, model.graph.node)
    g.outputs = [o.name for o in model.graph.output]
    used = {i for n in g.nodes for i in n.inputs} | set(g.outputs)
    for name in [c for c in g.constants if c not in used]:
        del g.constants[name]
    try:
        g.toposort()
    except ValueError as e:
        raise MnnToolError(f"{path}: {e}") from None
    return g
