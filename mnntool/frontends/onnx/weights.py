"""ONNX files read with their weights held once.

onnx.load keeps the file's bytes and the parsed message (with every weight inside) at once, and each
later copy doubles again. Here the protobuf wire format is walked and each large initializer's raw bytes
are left in the file: the parsed skeleton refers to them as ONNX external data at their offset in the
model file itself, so the skeleton is a valid model that onnx's checker and shape inference take. A
weight is read, once, into the array that becomes the IR constant. Files over 2 GB (external data) take
the same path; external data is read only from inside the model's folder."""
from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ...errors import MnnToolError

INLINE_MAX = 1024        # bytes: raw data this small stays in the parsed skeleton (shape constants)
MAX_ELEMENTS = 2**31 - 1
EXTERNAL = onnx.TensorProto.EXTERNAL
_MODEL_GRAPH, _GRAPH_INITIALIZER = 7, 5
_T_RAW, _T_EXTERNAL, _T_LOCATION = 9, 13, 14


class _Malformed(Exception):
    pass


def _varint(buf, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise _Malformed
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


def _put_varint(out: bytearray, v: int) -> None:
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def _fields(buf, start: int, end: int):
    """(field number, wire type, start of the field, start of its value, end of its value)."""
    pos = start
    while pos < end:
        head = pos
        key, pos = _varint(buf, pos, end)
        field, wire = key >> 3, key & 7
        if wire == 0:
            _, pos2 = _varint(buf, pos, end)
        elif wire == 1:
            pos2 = pos + 8
        elif wire == 5:
            pos2 = pos + 4
        elif wire == 2:
            n, pos = _varint(buf, pos, end)
            pos2 = pos + n
        else:
            raise _Malformed
        if pos2 > end or field == 0:
            raise _Malformed
        yield field, wire, head, pos, pos2
        pos = pos2


def _entry(out: bytearray, key: str, value: str) -> None:
    body = bytearray()
    for num, text in ((1, key), (2, value)):
        data = text.encode()
        body.append(num << 3 | 2)
        _put_varint(body, len(data))
        body += data
    out.append(_T_EXTERNAL << 3 | 2)
    _put_varint(out, len(body))
    out += body


def _tensor(buf, start, end, location: str) -> bytes:
    out, raw = bytearray(), None
    for field, wire, head, vs, ve in _fields(buf, start, end):
        if field == _T_RAW and wire == 2 and ve - vs > INLINE_MAX:
            raw = (vs, ve)
            continue
        out += buf[head:ve]
    if raw is not None:
        _entry(out, "location", location)
        _entry(out, "offset", str(raw[0]))
        _entry(out, "length", str(raw[1] - raw[0]))
        out.append(_T_LOCATION << 3)
        _put_varint(out, EXTERNAL)
    return bytes(out)


def _nested(buf, start, end, field_no: int, inner) -> bytes:
    out = bytearray()
    for field, wire, head, vs, ve in _fields(buf, start, end):
        if field == field_no and wire == 2:
            body = inner(buf, vs, ve)
            out.append(field_no << 3 | 2)
            _put_varint(out, len(body))
            out += body
        else:
            out += buf[head:ve]
    return bytes(out)


def skeleton_bytes(buf, location: str) -> bytes:
    """The model's bytes with every initializer's raw data over INLINE_MAX left out, pointed at instead."""
    return _nested(buf, 0, len(buf), _MODEL_GRAPH,
                   lambda b, s, e: _nested(b, s, e, _GRAPH_INITIALIZER,
                                           lambda b2, s2, e2: _tensor(b2, s2, e2, location)))


def read_model(path: Path) -> tuple[onnx.ModelProto, "Weights"]:
    path = Path(path)
    if not path.exists():
        raise MnnToolError(f"{path}: no such file")
    if not path.is_file():
        raise MnnToolError(f"{path}: not a file")
    real = path.resolve()
    with open(real, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise MnnToolError(f"{path}: file is empty")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            try:
                data = skeleton_bytes(buf, real.name)
            except (_Malformed, IndexError):
                raise MnnToolError(f"{path}: not a valid ONNX model (malformed protobuf)") from None
    if len(data) > 2**31 - 1:
        raise MnnToolError(f"{path}: its graph alone is over 2 GB, more than protobuf can parse")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as e:  # protobuf raises several types for malformed bytes
        raise MnnToolError(f"{path}: not a valid ONNX model ({type(e).__name__}: {str(e)[:120]})") from None
    return model, Weights(real.parent)


def _count(t) -> int:
    if any(d < 0 for d in t.dims):
        raise ValueError(f"negative dimension in {list(t.dims)}")
    n = 1
    for d in t.dims:
        n *= int(d)
    if n > MAX_ELEMENTS:
        raise ValueError(f"shape {list(t.dims)} holds {n} values, beyond int32 sizes")
    return n


FOUR_BIT = {onnx.TensorProto.INT4, onnx.TensorProto.UINT4, getattr(onnx.TensorProto, "FLOAT4E2M1", -1)}
PLAIN = {"float32", "float16", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
         "uint64", "bool"}     # numpy reads these from raw bytes as they are


def _bits(data_type: int) -> int:
    if data_type in FOUR_BIT:
        return 4
    if data_type == onnx.TensorProto.STRING:
        return 0
    return np.dtype(helper.tensor_dtype_to_np_dtype(data_type)).itemsize * 8


class Weights:
    """Reads tensors' data: embedded ones checked against their shape, external ones from the folder."""

    def __init__(self, folder: Path):
        self.folder = folder

    def array(self, t, what: str = "initializer") -> np.ndarray:
        try:
            n = _count(t)
            if t.data_location == EXTERNAL:
                return self._external(t, n)
            self._check_embedded(t, n)
            return numpy_helper.to_array(t)
        except (ValueError, TypeError, KeyError, OverflowError) as e:
            raise MnnToolError(f"{what} '{t.name}': {e}") from None

    @staticmethod
    def _check_embedded(t, n: int) -> None:
        if t.data_type == onnx.TensorProto.STRING:
            return
        if t.raw_data:
            want = (n * _bits(t.data_type) + 7) // 8
            if len(t.raw_data) != want:
                raise ValueError(f"shape {list(t.dims)} needs {want} bytes, the data has {len(t.raw_data)}")
            return
        have = max(len(t.float_data), len(t.int32_data), len(t.int64_data), len(t.double_data),
                   len(t.uint64_data))
        per = 2 if t.data_type in (onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128) else 1
        want = (n + 1) // 2 if _bits(t.data_type) == 4 else n * per
        if have != want:
            raise ValueError(f"shape {list(t.dims)} needs {want} values, the data has {have}")

    def _external(self, t, n: int) -> np.ndarray:
        info = {e.key: e.value for e in t.external_data}
        if "location" not in info:
            raise ValueError("external data without a location")
        target = (self.folder / info["location"]).resolve()
        if not target.is_relative_to(self.folder) or not target.is_file():
            raise ValueError(f"external data '{info['location']}' is not a file inside the model's folder")
        offset = int(info.get("offset", 0))
        want = (n * _bits(t.data_type) + 7) // 8
        length = int(info.get("length", want))
        if length != want or offset < 0 or offset + length > target.stat().st_size:
            raise ValueError(f"external data '{info['location']}' holds {length} bytes at {offset}, "
                             f"shape {list(t.dims)} needs {want} within the file")
        if t.data_type == onnx.TensorProto.STRING:
            raise ValueError("string tensors cannot be external")
        dtype = helper.tensor_dtype_to_np_dtype(t.data_type)
        plain = np.dtype(dtype).name in PLAIN
        out = np.empty(n if plain else length, dtype if plain else np.uint8)
        with open(target, "rb") as f:
            f.seek(offset)
            if f.readinto(memoryview(out).cast("B")) != length:
                raise ValueError(f"external data '{info['location']}' ends early")
        if plain:
            return out.reshape(tuple(t.dims))
        tmp = onnx.TensorProto()
        tmp.CopyFrom(t)
        del tmp.external_data[:]
        tmp.data_location = onnx.TensorProto.DEFAULT
        tmp.raw_data = out.tobytes()
        return numpy_helper.to_array(tmp)


def _type_outputs(model) -> None:
    """Graph outputs declared without a type or shape get the inferred one: onnxruntime (and MNN) accept
    them so, only onnx's checker insists."""
    g = model.graph
    bare = [o for o in g.output if o.type.WhichOneof("value") is None or
            (o.type.WhichOneof("value") == "tensor_type" and not o.type.tensor_type.HasField("shape"))]
    if not bare:
        return
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001 - then the checker says what is wrong
        inferred = onnx.ModelProto()
    known = {v.name: v for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
    keep = []
    for o in g.output:
        v = known.get(o.name)
        if o in bare and v is not None and v.type.WhichOneof("value") == "tensor_type" and \
                v.type.tensor_type.HasField("shape"):
            o.type.CopyFrom(v.type)
        if o not in bare or o.type.tensor_type.HasField("shape"):
            keep.append(o)
    kept = [onnx.ValueInfoProto.FromString(o.SerializeToString()) for o in keep]
    del g.output[:]
    g.output.extend(kept)       # what inference cannot type either is left to the converter


def checkable(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy onnx's checker takes: it resolves external data against the working directory, so the
    weights left in the file become typed graph inputs (same types and shapes, no data); outputs
    declared without a type get the inferred one."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    g = copy.graph
    _type_outputs(copy)
    external = [t for t in g.initializer if t.data_location == EXTERNAL]
    if not external:
        return copy
    names = {t.name for t in external}
    declared = {i.name for i in g.input}
    keep = [t for t in g.initializer if t.name not in names]
    del g.initializer[:]
    g.initializer.extend(keep)
    g.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                   for t in external if t.name not in declared)
    if copy.ir_version < 4:
        copy.ir_version = 4
    return copy
