"""A schema-driven FlatBuffers codec for MNN tables: dicts in, bytes out, and back.

The schema (slots, types, defaults) comes from ir/schema_tables.py. Decoding checks every offset
against the buffer so that a corrupt or hostile file raises FormatError instead of crashing,
looping or allocating without bound.
"""
from __future__ import annotations

import mmap
import struct
from typing import NamedTuple

import flatbuffers
import numpy as np

from ..ir.schema_tables import ENUMS, TABLES, UNIONS


class Schema(NamedTuple):
    """A FlatBuffers schema as tables: {table: [(slot, field, type, default)]}, {enum: (base, {name: value})},
    {union: {member: tag}}. MNN's is the default; the TFLite frontend reads with its own."""
    tables: dict
    enums: dict
    unions: dict


MNN = Schema(TABLES, ENUMS, UNIONS)

SCALAR_FMT = {"bool": "<B", "byte": "<b", "ubyte": "<B", "int8": "<b", "uint8": "<B", "short": "<h",
              "ushort": "<H", "int": "<i", "int32": "<i", "uint": "<I", "uint32": "<I", "long": "<q", "ulong": "<Q",
              "int64": "<q", "float": "<f", "double": "<d"}
NP_DTYPE = {"bool": "u1", "byte": "i1", "ubyte": "u1", "int8": "i1", "uint8": "u1", "short": "<i2",
            "ushort": "<u2", "int": "<i4", "int32": "<i4", "uint": "<u4", "uint32": "<u4", "long": "<i8", "ulong": "<u8",
            "int64": "<i8", "float": "<f4", "double": "<f8"}
PREPEND_SLOT = {"<B": "PrependUint8Slot", "<b": "PrependInt8Slot", "<h": "PrependInt16Slot",
                "<H": "PrependUint16Slot", "<i": "PrependInt32Slot", "<I": "PrependUint32Slot",
                "<q": "PrependInt64Slot", "<f": "PrependFloat32Slot", "<d": "PrependFloat64Slot"}
MAX_DEPTH = 32


class FormatError(ValueError):
    """The bytes are not a well-formed MNN flatbuffer."""


def _enum_value(enum: str, value, sc: Schema = MNN) -> int:
    if isinstance(value, str):
        try:
            return sc.enums[enum][1][value]
        except KeyError:
            raise ValueError(f"{value!r} is not a value of enum {enum}") from None
    return int(value)


def _enum_name(enum: str, value: int, sc: Schema = MNN):
    for name, v in sc.enums[enum][1].items():
        if v == value:
            return name
    return value


def _kind(ftype: str, sc: Schema = MNN) -> tuple[str, str]:
    """Classify a schema type as ('scalar'|'enum'|'string'|'table'|'union'|'utag', base)."""
    if ftype.startswith("ubyte (tag of"):
        return "utag", ftype.split()[-1].rstrip(")")
    if ftype in SCALAR_FMT:
        return "scalar", ftype
    if ftype in sc.enums:
        return "enum", ftype
    if ftype == "string":
        return "string", ftype
    if ftype in sc.unions:
        return "union", ftype
    if ftype in sc.tables:
        return "table", ftype
    raise KeyError(f"unknown schema type {ftype}")


def _default(ftype: str, default: str, sc: Schema = MNN):
    kind, base = _kind(ftype, sc)
    if kind == "enum":
        return _enum_value(base, default, sc) if default else 0
    if kind in ("scalar", "utag"):
        if default in ("", None):
            return 0
        if default in ("true", "false"):
            return int(default == "true")
        return float(default) if base in ("float", "double") else int(default)
    return None


def default_fields(table: str, sc: Schema = MNN) -> dict:
    """The scalar/enum fields of a table with their schema defaults (enums by name)."""
    out = {}
    for _, name, ftype, default in sc.tables[table]:
        kind, base = _kind(ftype, sc) if not ftype.startswith("[") else ("vector", ftype)
        if kind == "scalar":
            v = _default(ftype, default, sc)
            out[name] = bool(v) if base == "bool" else v
        elif kind == "enum":
            out[name] = _enum_name(base, _default(ftype, default, sc), sc)
    return out


# ----------------------------------------------------------------------------------------- writing

def encode(table: str, obj: dict) -> bytes:
    return bytes(encode_buffer(table, obj))


def encode_buffer(table: str, obj: dict, size_hint: int = 0, consume: bool = False) -> memoryview:
    """The encoded table as a view of the builder's buffer. With a size hint the buffer is one anonymous
    mapping of that size, whose pages count only once written (flatbuffers builds back to front, and
    would otherwise double its buffer, copy it, and copy it again for the output). `consume` drops each
    vector from `obj` once it is in the buffer, so a large model's weights are not held twice."""
    builder = flatbuffers.Builder(1024)
    if size_hint > 1 << 20:
        size_hint = min(size_hint, flatbuffers.Builder.MAX_BUFFER_SIZE)
        builder.Bytes = mmap.mmap(-1, size_hint)
        builder.head = size_hint
    try:
        root = _build_table(builder, table, obj, consume)
        builder.Finish(root)
    except flatbuffers.builder.BuilderSizeError:
        raise FormatError("the file would pass 2 GB, the most a FlatBuffers file (a .mnn) can hold") from None
    return memoryview(builder.Bytes)[builder.Head():]


def _numpy_vector(builder, x: np.ndarray) -> int:
    """builder.CreateNumpyVector without its tobytes() copy of the array."""
    x = np.ascontiguousarray(x.astype(x.dtype.newbyteorder("<"), copy=False)).reshape(-1)
    builder.StartVector(x.itemsize, x.size, x.dtype.alignment)
    builder.head = builder.head - x.nbytes
    np.frombuffer(builder.Bytes, np.uint8, x.nbytes, builder.head)[:] = x.view(np.uint8)
    builder.vectorNumElems = x.size
    return builder.EndVector()


def _build_vector(builder, elem: str, values, consume: bool = False):
    if elem in SCALAR_FMT or elem in ENUMS:
        if elem in ENUMS:
            base = ENUMS[elem][0]
            values = [_enum_value(elem, v) for v in values]
        else:
            base = elem
        return _numpy_vector(builder, np.asarray(values).astype(NP_DTYPE[base], copy=False))
    if elem == "string":
        offs = [builder.CreateString(str(s)) for s in values]
    else:
        offs = [_build_table(builder, elem, v, consume) for v in values]
    builder.StartVector(4, len(offs), 4)
    for off in reversed(offs):
        builder.PrependUOffsetTRelative(off)
    return builder.EndVector()


def _build_table(builder, table: str, obj: dict, consume: bool = False) -> int:
    fields = TABLES[table]
    offsets = {}
    for slot, name, ftype, _ in fields:
        value = obj.get(name)
        if value is None:
            continue
        if ftype.startswith("["):
            offsets[slot] = _build_vector(builder, ftype[1:-1], value, consume)
            if consume:
                obj[name] = value = None
        elif ftype == "string":
            offsets[slot] = builder.CreateString(str(value))
        elif ftype in TABLES:
            offsets[slot] = _build_table(builder, ftype, value, consume)
        elif ftype in UNIONS:
            member = obj.get(name + "_type")
            if member and member != "NONE":
                offsets[slot] = _build_table(builder, member, value, consume)
    builder.StartObject(max((f[0] for f in fields), default=-1) + 1)
    for slot, name, ftype, default in fields:
        if slot in offsets:
            builder.PrependUOffsetTRelativeSlot(slot, offsets[slot], 0)
            continue
        value = obj.get(name)
        if value is None or ftype.startswith("["):
            continue
        kind, base = _kind(ftype)
        if kind == "utag":
            if value == "NONE":
                continue
            tag = UNIONS[base][value] if isinstance(value, str) else int(value)
            builder.PrependUint8Slot(slot, tag, 0)
        elif kind == "enum":
            fmt = SCALAR_FMT[ENUMS[base][0]]
            getattr(builder, PREPEND_SLOT[fmt])(slot, _enum_value(base, value), _default(ftype, default))
        elif kind == "scalar":
            fmt = SCALAR_FMT[base]
            v = float(value) if base in ("float", "double") else int(value)
            getattr(builder, PREPEND_SLOT[fmt])(slot, v, _default(ftype, default))
    return builder.EndObject()


# ----------------------------------------------------------------------------------------- reading

_STRUCTS: dict = {}
_PLANS: dict = {}       # (id(schema), table) -> (schema, defaults, fields): a table's reading worked out once


def _struct(fmt: str) -> struct.Struct:
    s = _STRUCTS.get(fmt)
    if s is None:
        s = _STRUCTS[fmt] = struct.Struct(fmt)
    return s


def _plan(table: str, sc: Schema) -> tuple[dict, list]:
    """A table's defaults and, per field, (vtable entry, name, kind, base, scalar format, names of an
    enum's values): the schema lookups every decoded table repeated (an unrolled LSTM has 2165 tables,
    ~25 ms of a 50 ms load)."""
    key = (id(sc), table)
    hit = _PLANS.get(key)
    if hit is not None and hit[0] is sc:
        return hit[1], hit[2]
    fields = []
    for slot, name, ftype, _ in sc.tables[table]:
        entry = 4 + 2 * slot
        if ftype.startswith("["):
            fields.append((entry, name, "vector", ftype[1:-1], None, None))
            continue
        kind, base = _kind(ftype, sc)
        fmt = SCALAR_FMT.get(base) if kind == "scalar" else SCALAR_FMT[sc.enums[base][0]] if kind == "enum" else None
        names = {v: n for n, v in reversed(list(sc.enums[base][1].items()))} if kind == "enum" else None
        fields.append((entry, name, kind, base, fmt, names))
    _PLANS[key] = (sc, default_fields(table, sc), fields)
    return _PLANS[key][1], fields


class _Reader:
    def __init__(self, buf: bytes, sc: Schema = MNN):
        self.buf = memoryview(buf)
        self.n = len(buf)
        self.sc = sc

    def _check(self, pos: int, size: int):
        if pos < 0 or size < 0 or pos + size > self.n:
            raise FormatError(f"offset {pos}+{size} is outside the {self.n}-byte buffer")

    def u(self, fmt: str, pos: int):
        s = _struct(fmt)
        if pos < 0 or pos + s.size > self.n:
            self._check(pos, s.size)
        return s.unpack_from(self.buf, pos)[0]

    def deref(self, pos: int) -> int:
        return pos + self.u("<I", pos)

    def table(self, table: str, pos: int, depth: int = 0) -> dict:
        if depth > MAX_DEPTH:
            raise FormatError("tables nested too deeply")
        vt = pos - self.u("<i", pos)
        vt_size = self.u("<H", vt)
        if vt_size < 4 or vt_size % 2:
            raise FormatError(f"bad vtable size {vt_size} at {vt}")
        self._check(vt, vt_size)
        sc = self.sc
        defaults, fields = _plan(table, sc)
        out = dict(defaults)
        for entry, name, kind, base, fmt, names in fields:
            if entry + 2 > vt_size:
                continue
            off = self.u("<H", vt + entry)
            if not off:
                continue
            fpos = pos + off
            if kind == "vector":
                out[name] = self.vector(base, self.deref(fpos), depth)
            elif kind == "scalar":
                v = self.u(fmt, fpos)
                out[name] = bool(v) if base == "bool" else v
            elif kind == "enum":
                v = self.u(fmt, fpos)
                out[name] = names.get(v, v)
            elif kind == "utag":
                tag = self.u("<B", fpos)
                out[name] = next((k for k, v in sc.unions[base].items() if v == tag), tag) if tag else "NONE"
            elif kind == "string":
                out[name] = self.string(self.deref(fpos))
            elif kind == "table":
                out[name] = self.table(base, self.deref(fpos), depth + 1)
            elif kind == "union":
                member = out.get(name + "_type", "NONE")
                if member != "NONE" and member in sc.tables:
                    out[name] = self.table(member, self.deref(fpos), depth + 1)
        return out

    def string(self, pos: int) -> str:
        length = self.u("<I", pos)
        self._check(pos + 4, length)
        try:
            return bytes(self.buf[pos + 4:pos + 4 + length]).decode("utf-8")
        except UnicodeDecodeError:
            raise FormatError(f"string at {pos} is not UTF-8") from None

    def vector(self, elem: str, pos: int, depth: int):
        length = self.u("<I", pos)
        start = pos + 4
        sc = self.sc
        if elem in SCALAR_FMT or elem in sc.enums:
            base = sc.enums[elem][0] if elem in sc.enums else elem
            dt = np.dtype(NP_DTYPE[base])
            self._check(start, length * dt.itemsize)
            arr = np.frombuffer(self.buf, dtype=dt, count=length, offset=start)
            # a view into a writable buffer (the reader's bytearray: no second copy of the weights) where
            # it is aligned for its type; else a copy of its own
            if not (arr.flags.writeable and arr.flags.aligned):
                arr = arr.copy()
            if elem in sc.enums:
                return [_enum_name(elem, int(v), sc) for v in arr]
            return arr.astype(bool) if base == "bool" else arr
        self._check(start, length * 4)
        if elem == "string":
            return [self.string(self.deref(start + 4 * i)) for i in range(length)]
        return [self.table(elem, self.deref(start + 4 * i), depth + 1) for i in range(length)]


def decode(buf: bytes, table: str, sc: Schema = MNN) -> dict:
    if len(buf) < 8:
        raise FormatError(f"{len(buf)} bytes is too short for a flatbuffer")
    reader = _Reader(buf, sc)
    try:
        return reader.table(table, reader.deref(0))
    except (struct.error, RecursionError, OverflowError) as e:
        raise FormatError(str(e)) from None
