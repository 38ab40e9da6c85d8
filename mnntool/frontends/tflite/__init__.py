"""TensorFlow Lite (.tflite) -> IR, read with the project's own checked FlatBuffers decoder and the schema
facts in schema.py: no TensorFlow needed, and a corrupt file is one error line, never a crash.

Quantized models: constant tensors are dequantized into the float IR (value = scale * (q - zero point),
per channel along quantized_dimension), and every int8 convolution's exact int8 weights and its input
and output grids go into the graph's int8 plan, which the converter applies after the passes
(quant.ptq.apply_int8_plan): the .mnn keeps the TFLite model's own scales."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...errors import MnnToolError
from ...format.flatbuf import FormatError, decode
from ...ir.graph import Graph
from ..shape_tracking import T, emit_onnx, given_shape
from ..tensorflow.context import TfCtx
from .ops import OPS
from ..fold_unroll import fold, folded, unroll
from .schema import BUILTIN_OPS, SCHEMA, TENSOR_TYPES

QUANTIZED = ("int8", "uint8", "int16", "int32", "int64")


def supported_ops() -> list[str]:
    return sorted(set(OPS) | {"WHILE"})


@dataclass
class Operator:
    index: int
    code: str
    name: str
    inputs: list
    outputs: list
    opts: dict = field(default_factory=dict)

    @property
    def op(self) -> str:        # read by the messages the TensorFlow frontend's helpers write
        return self.code


class TfliteCtx(TfCtx):
    def __init__(self, graph, path, tensors):
        super().__init__(graph, path)
        self.tensors = tensors          # the decoded Tensor tables of the subgraph being converted
        self.subgraph = 0
        self.raw: dict[tuple, np.ndarray] = {}    # (subgraph, tensor) -> its stored integers (quantized weights)

    def tflite_dtype(self, index: int) -> str:
        return TENSOR_TYPES.get(self.tensors[index]["type"], "?")

    def stored_grid(self, index: int):
        """(scale, zero point) as the file stores them for a per-tensor quantized int8/uint8 tensor, else None."""
        q = self.tensors[index].get("quantization") or {}
        scale, zp = q.get("scale"), q.get("zero_point")
        if scale is None or len(scale) != 1 or self.tflite_dtype(index) not in ("int8", "uint8"):
            return None
        return float(scale[0]), int(zp[0]) if zp is not None and len(zp) else 0

    def grid(self, index: int):
        """The tensor's grid on MNN's int8 values: a uint8 tensor's zero point moves down by 128."""
        g = self.stored_grid(index)
        if g is None:
            return None
        return g[0], g[1] - 128 if self.tflite_dtype(index) == "uint8" else g[1]

    def int8_plan(self, o, node, to_mnn):
        """Record an int8 convolution: the file's int8 weights in MNN's layout (`to_mnn`, the transform its
        float weights took), per-channel scales, both activation grids."""
        w_idx, x_idx, y_idx = o.inputs[1], o.inputs[0], o.outputs[0]
        q = self.raw.get((self.subgraph, w_idx))
        gin, gout = self.grid(x_idx), self.grid(y_idx)
        if q is None or gin is None or gout is None or self.tflite_dtype(w_idx) != "int8":
            return
        cout = node.param["common"]["outputCount"]
        alpha = np.broadcast_to(np.asarray(self.tensors[w_idx]["quantization"]["scale"], np.float32), (cout,))
        self.g.int8_plan[node.name] = {"weight": np.ascontiguousarray(to_mnn(q), np.int8).reshape(cout, -1),
                                       "alpha": alpha.copy(), "input": gin, "output": gout}


def _builtin(code: dict) -> str:
    b = max(int(code.get("deprecated_builtin_code", 0)), int(code.get("builtin_code", 0)))
    if b == 32:
        return f"CUSTOM:{code.get('custom_code') or '?'}"
    return BUILTIN_OPS[b] if 0 <= b < len(BUILTIN_OPS) else f"BUILTIN_{b}"


def _constant(path, t: dict, buffers: list):
    """The tensor's stored value, as (float or integer array, raw integers or None); None when not stored."""
    b = t.get("buffer", 0)
    if not b or b >= len(buffers):
        return None, None
    data = buffers[b].get("data")
    if data is None or len(data) == 0:
        if buffers[b].get("size"):
            raise MnnToolError(f"{path}: tensor '{t.get('name')}' is stored outside the flatbuffer (a >2 GB model)")
        return None, None
    dtype = TENSOR_TYPES.get(t.get("type", 0))
    if dtype in (None, "string"):
        raise MnnToolError(f"{path}: tensor '{t.get('name')}' has an unsupported type ({t.get('type')})")
    shape = [int(d) for d in t.get("shape", [])]
    raw = np.asarray(data, np.uint8)
    arr = raw.view(np.dtype(dtype).newbyteorder("<")) if raw.size % np.dtype(dtype).itemsize == 0 else None
    if arr is None or arr.size != int(np.prod(shape)):
        raise MnnToolError(f"{path}: tensor '{t.get('name')}': {raw.size} bytes do not hold {dtype}{shape}")
    arr = arr.reshape(shape)
    q = t.get("quantization") or {}
    scale = q.get("scale")
    if dtype == "float16":
        return arr.astype(np.float32), None
    if dtype in QUANTIZED and scale is not None and len(scale):
        dim = int(q.get("quantized_dimension", 0))
        zp = np.asarray(q.get("zero_point") if q.get("zero_point") is not None and len(q.get("zero_point"))
                        else [0], np.float64)
        s = np.asarray(scale, np.float64)
        if s.size > 1:
            bshape = [1] * arr.ndim
            bshape[dim] = -1
            s, zp = s.reshape(bshape), (zp.reshape(bshape) if zp.size > 1 else zp)
        return ((arr.astype(np.float64) - zp) * s).astype(np.float32), arr
    return arr.copy(), None


def read_model(path: Path) -> dict:
    data = path.read_bytes()
    if len(data) < 8 or data[4:8] != b"TFL3":
        raise MnnToolError(f"{path}: not a TFLite model (no 'TFL3' file identifier)")
    try:
        return decode(data, "Model", SCHEMA)
    except FormatError as e:
        raise MnnToolError(f"{path}: corrupt TFLite flatbuffer ({e})") from None


class Model:
    """The decoded file: operator names, buffers, subgraphs (each with its constants read once)."""

    def __init__(self, path: Path, model: dict):
        self.path = path
        self.codes = [_builtin(c) for c in model.get("operator_codes") or []]
        self.buffers = model.get("buffers") or []
        self.subgraphs = model.get("subgraphs") or []
        if not self.subgraphs:
            raise MnnToolError(f"{path}: the model has no subgraph")
        self._ops: dict[int, list[Operator]] = {}
        self._constants: dict[int, dict] = {}

    def operators(self, k: int) -> list[Operator]:
        if k in self._ops:
            return self._ops[k]
        if not 0 <= k < len(self.subgraphs):
            raise MnnToolError(f"{self.path}: subgraph {k} does not exist ({len(self.subgraphs)} in the file)")
        sg, path, codes = self.subgraphs[k], self.path, self.codes
        tensors = sg.get("tensors") or []
        ops = []
        for j, o in enumerate(sg.get("operators") or []):
            ci = int(o.get("opcode_index", 0))
            if ci >= len(codes):
                raise MnnToolError(f"{path}: operator {j} names operator code {ci} of {len(codes)}")
            ins, outs = [int(i) for i in o.get("inputs", [])], [int(i) for i in o.get("outputs", [])]
            for i in ins + outs:
                if i >= len(tensors) or i < -1:
                    raise MnnToolError(f"{path}: operator {j} ({codes[ci]}) names tensor {i} of {len(tensors)}")
            first_out = tensors[outs[0]].get("name", "") if outs else ""
            ops.append(Operator(j, codes[ci], first_out or f"op{j}", ins, outs, o.get("builtin_options") or {}))
        bad = sorted({o.code for o in ops if o.code not in OPS and o.code != "WHILE"})
        if bad:
            raise MnnToolError(f"{path}: unsupported TFLite ops: {', '.join(bad)}")
        self._ops[k] = ops
        return ops

    def constants(self, ctx, k: int) -> dict:
        """Subgraph k's stored tensors (index -> array), decoded on first use (a loop body is called once
        per step); their raw integers go to ctx.raw. A fresh dict each time: the caller extends it."""
        if k not in self._constants:
            env = {}
            for i, t in enumerate(self.subgraphs[k].get("tensors") or []):
                value, raw = _constant(self.path, t, self.buffers)
                if value is not None:
                    env[i] = value
                    if raw is not None:
                        ctx.raw[(k, i)] = raw
            self._constants[k] = env
        return dict(self._constants[k])


def run_subgraph(ctx, model: Model, k: int, env: dict) -> dict:
    """Convert subgraph k's operators into ctx, its tensors' values in `env` (index -> T or array)."""
    sg = model.subgraphs[k]
    tensors = sg.get("tensors") or []
    saved = ctx.tensors, ctx.subgraph
    ctx.tensors, ctx.subgraph = tensors, k
    try:
        for o in model.operators(k):
            args = [env.get(i) if i >= 0 else None for i in o.inputs]
            missing = [tensors[i].get("name") for i, a in zip(o.inputs, args) if i >= 0 and a is None
                       and not tensors[i].get("is_variable")]
            if missing:
                raise MnnToolError(f"{model.path}: {o.code} '{o.name}' reads tensor(s) "
                                   f"{', '.join(map(str, missing))} that nothing computes")
            if o.code == "WHILE":
                results = _while(ctx, model, o, args)
            else:
                outs = [ctx.tmp(tensors[i].get("name") or f"t{i}") for i in o.outputs]
                start = len(ctx.g.nodes)
                try:
                    results = OPS[o.code](ctx, o, args, outs)
                except MnnToolError:
                    raise
                except Exception as e:
                    raise MnnToolError(f"{model.path}: {o.code} '{o.name}': cannot convert "
                                       f"({type(e).__name__}: {e})") from None
                fold(ctx, start)
                results = folded(ctx, results)
            for i, v in zip(o.outputs, results):
                env[i] = v
    finally:
        ctx.tensors, ctx.subgraph = saved
    return env


def _call(ctx, model: Model, k: int, values: list) -> list:
    sg = model.subgraphs[k]
    env = model.constants(ctx, k)
    ins = list(sg.get("inputs", []))
    if len(ins) != len(values):
        raise MnnToolError(f"{model.path}: subgraph {k} takes {len(ins)} operands, given {len(values)}")
    env.update(zip(ins, values))
    env = run_subgraph(ctx, model, k, env)
    return [env.get(i) for i in sg.get("outputs", [])]


def _while(ctx, model: Model, o, args) -> list:
    """A WHILE whose condition folds to a constant at every step (loops over a known length: Keras RNNs)
    is unrolled; a condition on run-time values is refused."""
    cond_k, body_k = int(o.opts.get("cond_subgraph_index", 0)), int(o.opts.get("body_subgraph_index", 0))
    return unroll(ctx.loops, f"{model.path}: WHILE '{o.name}'", lambda vs: _call(ctx, model, cond_k, vs)[0],
                  lambda vs: _call(ctx, model, body_k, vs), list(args))


def load_tflite(path, input_shapes: dict) -> Graph:
    path = Path(path)
    if not path.is_file():
        raise MnnToolError(f"{path}: no such file")
    model = Model(path, read_model(path))
    sg = model.subgraphs[0]
    tensors = sg.get("tensors") or []
    model.operators(0)
    g = Graph(source="TFLITE", name=path.stem)
    ctx = TfliteCtx(g, str(path), tensors)
    env = model.constants(ctx, 0)
    public_inputs = [tensors[i].get("name") or f"t{i}" for i in sg.get("inputs", [])]
    unknown = set(input_shapes) - set(public_inputs)
    if unknown:
        raise MnnToolError(f"{path}: --input-shape names {', '.join(sorted(unknown))}, but the inputs are "
                           f"{', '.join(public_inputs)}")
    for i, public in zip(sg.get("inputs", []), public_inputs):
        t = tensors[i]
        shape = [int(d) for d in t.get("shape", [])]
        if public in input_shapes:      # shape_signature's -1 dims are open, its others fixed; no signature: any
            sig = t.get("shape_signature")
            declared = [None] * len(shape) if sig is None or not len(sig) else [int(d) for d in sig]
            shape = given_shape(path, public, declared, input_shapes[public])
        dtype = ctx.tflite_dtype(i)
        if ctx.stored_grid(i) is not None:
            x = ctx.add_input(public, shape, dtype)
            scale, zero = ctx.stored_grid(i)
            env[i] = emit_onnx(ctx, "DequantizeLinear", [x, np.float32(scale), np.asarray(zero, dtype)],
                               [ctx.tmp(public + "_dequantized")])[0]
        elif dtype in ("float32", "int32", "int64", "bool"):
            env[i] = ctx.add_input(public, shape, "int32" if dtype == "int64" else dtype)
        else:
            raise MnnToolError(f"{path}: input '{public}' has type {dtype}, which is not supported")
    env = run_subgraph(ctx, model, 0, env)
    for i in sg.get("outputs", []):
        public = tensors[i].get("name") or f"t{i}"
        v = env.get(i)
        if not isinstance(v, T):
            raise MnnToolError(f"{path}: output '{public}' is a constant or not computed")
        v = ctx.as_nhwc(v)
        dtype = ctx.tflite_dtype(i)
        if ctx.stored_grid(i) is not None:
            scale, zero = ctx.stored_grid(i)
            q = emit_onnx(ctx, "QuantizeLinear", [v, np.float32(scale), np.asarray(zero, dtype)],
                          [ctx.tmp(public + "_quantized")])[0]
            v = ctx.emit("Cast", [q], [ctx.tmp(public + "_" + dtype)],
                         {"srcT": "DT_INT32", "dstT": "DT_INT8" if dtype == "int8" else "DT_UINT8"})[0]
        ctx.publish(v, public)
    ctx.drop_unused_constants()
    return g
