"""What every ONNX op converter gets: the graph being built and helpers to read constants and emit ops."""
from __future__ import annotations

import numpy as np
from onnx import helper

from ...errors import MnnToolError

from ...ir.graph import Graph, Node


class Ctx:
    def __init__(self, graph: Graph, path: str, shapes: dict, dtypes: dict | None = None):
        self.g = graph
        self.path = path
        self.shapes = shapes   # ONNX shape inference: tensor name -> tuple (may hold None dims)
        self.dtypes = dtypes if dtypes is not None else {}   # ONNX element types as numpy names
        self.opset = 13           # the model's default-domain opset (set by the loader)
        self.wide: dict = {}      # int64 constants whose values do not fit int32, as they were

    def exact(self, name: str):
        """A constant as the model has it (int64 values beyond int32 not clipped), or None."""
        return self.wide.get(name, self.const(name)) if name else None

    def dtype(self, name: str) -> str:
        """The ONNX element type of a tensor (numpy name, e.g. 'int64'), 'float32' when unknown."""
        if name in self.dtypes:
            return self.dtypes[name]
        if name in self.g.constants:
            return str(self.g.constants[name].dtype)
        return self.g.tensors[name].dtype if name in self.g.tensors else "float32"

    def const(self, name: str):
        """The value of a constant input, or None when it is computed at run time (then converters emit
        the op with the tensor as an input: no ONNX operand has to be a constant)."""
        if not name:
            return None
        return self.g.constants.get(name)

    def shape(self, name: str):
        """ONNX shape inference's shape, else a constant's own (shape inference lists no initializers
        unless the file has value_info for them: a Gather on an initializer table missed its
        negative-index fix)."""
        s = self.shapes.get(name)
        if s is None and name in self.g.constants:
            return tuple(int(d) for d in np.shape(self.g.constants[name]))
        return s

    def rank(self, name: str) -> int | None:
        s = self.shape(name)
        if s is None and name in self.g.constants:
            return self.g.constants[name].ndim
        return None if s is None else len(s)

    def emit(self, op: str, inputs, outputs, param: dict | None = None, name: str = "", fmt=None,
             graphs: dict | None = None) -> list[str]:
        """Append an op; `graphs` are a control-flow op's bodies (Node.graphs)."""
        outputs = [o for o in outputs]
        self.g.nodes.append(Node(op, list(inputs), outputs, name or outputs[0], dict(param or {}), fmt=fmt,
                                 graphs=dict(graphs or {})))
        return outputs

    def tmp(self, base: str) -> str:
        name = self.g.fresh_name(base)
        self.g.info(name)
        return name

    def int_const(self, base: str, values) -> str:
        return self.g.add_const(base, np.asarray(values, dtype=np.int32))

    def float_const(self, base: str, values) -> str:
        return self.g.add_const(base, np.asarray(values, dtype=np.float32))


def attrs_of(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def ir_value(arr: np.ndarray) -> np.ndarray:
    """A constant as the IR carries it: floats as float32, integers and booleans as int32."""
    arr = np.asarray(arr)
    if arr.dtype.kind == "f" or arr.dtype.name in ("bfloat16",) or "float8" in arr.dtype.name:
        return arr.astype(np.float32, copy=False)     # weights are not copied (they are large)
    if arr.dtype.kind in "iub":
        return to_int32(arr.astype(np.int64)) if arr.dtype.kind != "b" else arr.astype(np.int32)
    return arr


def shape_int32(ctx, node, values, what: str) -> np.ndarray:
    """A shape-like operand (Reshape/Expand target, repeats, sizes) as int32, refused with one line where
    a value does not fit: clipping 2^40 to 2^31 - 1 would write a file MNN crashes on."""
    v = np.asarray(values, np.int64).reshape(-1)
    if v.size and (v.max() > 2**31 - 1 or v.min() < -2**31):
        raise MnnToolError(f"{ctx.path}: {node.op_type} '{node.name}': {what} {v.tolist()} exceeds MNN's int32 sizes")
    return v.astype(np.int32)


def to_int32(arr: np.ndarray) -> np.ndarray:
    if arr.dtype == np.int64:
        return np.clip(arr, -2**31, 2**31 - 1).astype(np.int32)
    return arr
