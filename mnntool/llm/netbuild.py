"""A small builder of MNN `Net` tables, op by op: the language-model graph is written directly in MNN's
ops (Attention with its KV cache, RMS LayerNorm, 1x1 convolutions reading an external weight file),
which have no counterpart in mnntool's IR. The result is the dict `format.flatbuf.encode` turns into
bytes, the same shape MNN's own JSON dump of a `.mnn` has.
"""
from __future__ import annotations

import numpy as np

from .._version import MNN_FORMAT_VERSION
from ..format.flatbuf import encode

SLICE_END = 1 << 30             # "to the end" in an ONNX-style StridedSlice


class NetBuilder:
    def __init__(self):
        self.names: list[str] = []
        self.index: dict[str, int] = {}
        self.ops: list[dict] = []
        self._consts: dict[tuple, str] = {}

    def tensor(self, name: str) -> int:
        if name in self.index:
            raise ValueError(f"tensor {name} written twice")
        self.index[name] = len(self.names)
        self.names.append(name)
        return self.index[name]

    def op(self, type_: str, inputs: list[str], output: str, main_type: str | None = None,
           main: dict | None = None) -> str:
        out = self.tensor(output)
        op = {"type": type_, "name": output, "inputIndexes": [self.index[i] for i in inputs],
              "outputIndexes": [out]}
        if main_type:
            op["main_type"], op["main"] = main_type, main or {}
        self.ops.append(op)
        return output

    def input(self, name: str, dims: list[int], dtype: str = "DT_FLOAT") -> str:
        return self.op("Input", [], name, "Input", {"dims": dims, "dtype": dtype, "dformat": "NCHW"})

    def const(self, value, dtype=np.int32, name: str | None = None) -> str:
        """A constant, shared by value (the same shape vector is written once)."""
        arr = np.asarray(value, dtype)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if name is None and key in self._consts:
            return self._consts[key]
        field, dt = {np.dtype(np.int32): ("int32s", "DT_INT32"), np.dtype(np.float32): ("float32s", "DT_FLOAT")}[arr.dtype]
        main = {"dataFormat": "NCHW", "dataType": dt, field: arr.reshape(-1)}
        if arr.ndim:
            main["dims"] = list(arr.shape)
        out = self.op("Const", [], name or f"const_{len(self.names)}", "Blob", main)
        self._consts[key] = out
        return out

    # ops used by the decoder, each named for what it computes
    def reshape(self, x: str, dims: list[int], out: str) -> str:
        return self.op("Reshape", [x], out, "Reshape", {"dims": list(dims), "dimType": "NCHW"})

    def convert(self, x: str, src: str, dst: str, out: str) -> str:
        return self.op("ConvertTensor", [x], out, "TensorConvertInfo", {"source": src, "dest": dst})

    def binary(self, kind: str, a: str, b: str, out: str) -> str:
        return self.op("BinaryOp", [a, b], out, "BinaryOp", {"opType": kind, "T": "DT_FLOAT"})

    def unary(self, kind: str, x: str, out: str) -> str:
        return self.op("UnaryOp", [x], out, "UnaryOp", {"opType": kind, "T": "DT_FLOAT"})

    def scale(self, x: str, factor: float, out: str) -> str:
        return self.binary("MUL", x, self.const(np.float32(factor), np.float32), out)

    def slice_last(self, x: str, start: int, end: int, axis: int, out: str) -> str:
        """x[..., start:end] along `axis` (ONNX Slice semantics: StridedSlice fromType 1)."""
        return self.op("StridedSlice", [x, self.const([start]), self.const([end]), self.const([axis]),
                                        self.const([1])], out, "StridedSliceParam",
                       {"T": "DT_FLOAT", "fromType": 1})

    def slice_from(self, x: str, start: str, axis: int, out: str) -> str:
        """x[start:] along `axis`, start a tensor (the graph's logits_index)."""
        return self.op("StridedSlice", [x, start, self.const([SLICE_END]), self.const([axis]), self.const([1])],
                       out, "StridedSliceParam", {"T": "DT_FLOAT", "fromType": 1})

    def concat(self, xs: list[str], axis: int, out: str) -> str:
        return self.op("Concat", xs, out, "Axis", {"axis": axis})

    def net(self, outputs: list[str], biz_code: str = "mnntool") -> dict:
        return {"bizCode": biz_code, "oplists": self.ops, "outputName": outputs, "sourceType": "ONNX",
                "tensorName": self.names, "tensorNumber": len(self.names), "extraInfo": {"version": MNN_FORMAT_VERSION}}

    def to_bytes(self, outputs: list[str]) -> bytes:
        return encode("Net", self.net(outputs))
