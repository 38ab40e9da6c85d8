"""A frontend context that infers each op's shape as it is emitted.

TorchScript, Caffe and TensorFlow graphs carry few shapes of their own, and their converters need them
(flatten sizes, reshape targets, layout decisions), so every emitted op goes through the op registry's
shape inference at once.
"""
from __future__ import annotations

import numpy as np

from ..errors import MnnToolError
from ..ir.graph import Graph, TensorInfo
from ..ir.ops import REGISTRY, Val
from .onnx.context import Ctx


def given_shape(path, name: str, declared, given) -> list[int]:
    """The shape --input-shape gives an input, checked against the dims its model fixes: an open dim
    (None, a negative number, 0, a symbol) takes any size, a fixed one only its own; the rank must match.
    declared None (no shape recorded at all, as in TorchScript) accepts any shape."""
    given = [int(d) for d in given]
    if declared is None:
        return given
    declared = list(declared)
    if len(declared) != len(given):
        raise MnnToolError(f"{path}: --input-shape {name}: rank {len(given)} does not match the model's rank "
                           f"{len(declared)}")
    for d, w in zip(declared, given):
        if isinstance(d, (int, np.integer)) and d > 0 and d != w:
            shown = "x".join(str(x) if isinstance(x, (int, np.integer)) and x > 0 else "?" for x in declared)
            raise MnnToolError(f"{path}: --input-shape {name}: {given} conflicts with the model's fixed shape {shown}")
    return given


class T(str):
    """An IR tensor name (as opposed to a Python value)."""


class ShapedCtx(Ctx):
    def __init__(self, graph: Graph, path: str):
        super().__init__(graph, path, {})
        self.vals: dict[str, Val] = {}

    def add_input(self, name: str, shape, dtype: str = "float32") -> T:
        shape = tuple(int(d) for d in shape)
        self.g.inputs.append(name)
        self.g.tensors[name] = TensorInfo(name, dtype, shape)
        self.vals[name] = Val(shape, dtype)
        self.shapes[name] = shape
        return T(name)

    def emit(self, op, inputs, outputs, param=None, name="", fmt=None, graphs=None):
        # a Python value or array where a tensor goes (a traced buffer, a folded size) becomes a constant
        inputs = [i if isinstance(i, str) else self.tensor(i) for i in inputs]
        outs = super().emit(op, inputs, outputs, param, name, fmt, graphs)
        node = self.g.nodes[-1]
        ins = [self.val(i) for i in node.inputs]
        try:
            results = REGISTRY[op].infer(node, ins)
        except Exception as e:
            raise MnnToolError(f"{self.path}: {op} '{node.name}': cannot infer its shape ({e})") from None
        for o, v in zip(node.outputs, results):
            self.vals[o] = v
            self.shapes[o] = v.shape
            self.g.info(o).shape, self.g.info(o).dtype = v.shape, v.dtype
        return [T(o) for o in outs]

    def val(self, name: str) -> Val:
        if name in self.g.constants:
            c = self.g.constants[name]
            return Val(tuple(c.shape), str(c.dtype), c)
        return self.vals.get(name, Val(None))

    def tensor(self, v, base="const") -> T:
        """Make a Python value (number, list, array) usable as an op input."""
        if isinstance(v, T):
            return v
        arr = np.asarray(v)
        if arr.dtype == np.float64:
            arr = arr.astype(np.float32)
        if arr.dtype == np.int64 or arr.dtype == np.bool_:
            arr = arr.astype(np.int32)
        return T(self.g.add_const(base, arr))

    def shape_of(self, t) -> tuple:
        if not isinstance(t, str):          # a constant still held as a Python value or array
            return tuple(np.shape(t))
        shape = self.vals.get(t, Val(None)).shape if t not in self.g.constants else self.g.constants[t].shape
        if shape is None:
            raise MnnToolError(f"{self.path}: shape of '{t}' is unknown")
        return tuple(shape)

    def reshape(self, x, dims, out) -> list[T]:
        return self.emit("Reshape", [x, self.tensor(np.asarray([int(d) for d in dims], np.int32), "shape")],
                         [out], {"dimType": "NCHW"}, out)

    def drop_unused_constants(self):
        used = {i for n in self.g.nodes for i in n.inputs} | set(self.g.outputs)
        for c in [c for c in self.g.constants if c not in used]:
            del self.g.constants[c]


def emit_onnx(ctx, op_type: str, inputs: list, outs: list[str], attrs: dict | None = None) -> list[T]:
    """Emit what the ONNX frontend's converter of `op_type` emits for these operands (one lowering per
    meaning for every frontend); Python values become constants, None an omitted input."""
    from onnx import helper

    from .onnx.registry import CONVERTERS
    names = [ctx.tensor(i) if i is not None and not isinstance(i, str) else (i or "") for i in inputs]
    proto = helper.make_node(op_type, names, list(outs), name=outs[0], **(attrs or {}))
    CONVERTERS[op_type](ctx, proto, attrs or {})
    return [T(o) for o in outs]


def reverse_axes(ctx, x, axes, out: str) -> T:
    """x reversed along each axis, as a Gather of the indices backwards (a negative-step slice crashes MNN)."""
    axes = [int(a) for a in axes]
    for k, a in enumerate(axes):
        n = ctx.shape_of(x)[a]
        x = emit_onnx(ctx, "Gather", [x, np.arange(n - 1, -1, -1, dtype=np.int64)],
                      [out if k == len(axes) - 1 else ctx.tmp(f"{out}_rev{a}")], {"axis": a})[0]
    return x


def conv_param(kh, kw, cout, cin, group, stride=(1, 1), dilation=(1, 1), pads=(0, 0, 0, 0)) -> dict:
    """MNN's Convolution2DCommon for explicit pads (top, left, bottom, right)."""
    top, left, bottom, right = (int(p) for p in pads)
    return {"padX": left, "padY": top, "kernelX": int(kw), "kernelY": int(kh), "strideX": int(stride[1]),
            "strideY": int(stride[0]), "dilateX": int(dilation[1]), "dilateY": int(dilation[0]), "padMode": "CAFFE",
            "group": int(group), "outputCount": int(cout), "inputCount": int(cin), "relu": False, "relu6": False,
            "pads": [top, left, bottom, right]}


def conv_op(weight_shape_kind: str, group: int, cin: int, cout: int) -> str:
    """Convolution or its depthwise form (and the same for Deconvolution)."""
    depthwise = group > 1 and group == cin == cout
    return weight_shape_kind + "Depthwise" if depthwise else weight_shape_kind


def rename_tensor(g: Graph, old: str, new: str) -> None:
    """Give a computed tensor a public name (a graph output named like the source model's)."""
    if old == new:
        return
    if new in g.tensors or new in g.constants or any(new in n.outputs for n in g.nodes):
        raise MnnToolError(f"cannot name output '{old}' as '{new}': the name is taken")
    for n in g.nodes:
        n.outputs = [new if o == old else o for o in n.outputs]
        n.inputs = [new if i == old else i for i in n.inputs]
    info = g.tensors.pop(old, None)
    if info is not None:
        info.name = new
        g.tensors[new] = info
    g.outputs = [new if o == old else o for o in g.outputs]
