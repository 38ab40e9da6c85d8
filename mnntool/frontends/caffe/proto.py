"""Compile caffe.proto (proto2 messages, nested enums, scalar/message/enum fields) into protobuf message
classes at import time: no protoc, and no generated code tied to one protobuf release."""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto
SCALARS = {"double": _F.TYPE_DOUBLE, "float": _F.TYPE_FLOAT, "int64": _F.TYPE_INT64, "uint64": _F.TYPE_UINT64,
           "int32": _F.TYPE_INT32, "uint32": _F.TYPE_UINT32, "bool": _F.TYPE_BOOL, "string": _F.TYPE_STRING,
           "bytes": _F.TYPE_BYTES}
LABELS = {"optional": _F.LABEL_OPTIONAL, "repeated": _F.LABEL_REPEATED, "required": _F.LABEL_REQUIRED}
_TOKEN = re.compile(r'"[^"]*"|[A-Za-z_][\w.]*|-?[\d.]+(?:[eE][-+]?\d+)?|[{}\[\];=,]')


def _tokens(text: str) -> list[str]:
    text = re.sub(r"//[^\n]*", "", text)
    return _TOKEN.findall(text)


def parse(text: str) -> descriptor_pb2.FileDescriptorProto:
    toks = _tokens(text)
    fd = descriptor_pb2.FileDescriptorProto(name="mnntool_caffe.proto", syntax="proto2")
    pos = 0
    messages = []        # (message proto, [(field proto, type name)])

    def take(expect=None):
        nonlocal pos
        tok = toks[pos]
        if expect is not None and tok != expect:
            raise ValueError(f"caffe.proto: expected '{expect}', got '{tok}' (token {pos})")
        pos += 1
        return tok

    def enum(container):
        e = container.add(name=take())
        take("{")
        while toks[pos] != "}":
            name = take()
            take("=")
            e.value.add(name=name, number=int(take()))
            take(";")
        take("}")

    def message(container, prefix):
        msg = container.add(name=take())
        fields = []
        messages.append((msg, prefix + "." + msg.name, fields))
        take("{")
        while toks[pos] != "}":
            kw = take()
            if kw == "enum":
                enum(msg.enum_type)
                continue
            label, type_name, name = LABELS[kw], take(), take()
            take("=")
            f = msg.field.add(name=name, number=int(take()), label=label)
            while toks[pos] != ";":
                if take() == "[":
                    while toks[pos] != "]":
                        key = take()
                        take("=")
                        value = take()
                        if key == "packed":
                            f.options.packed = value == "true"
                        elif key == "default":
                            f.default_value = value.strip('"')
                        if toks[pos] == ",":
                            take()
                    take("]")
            take(";")
            fields.append((f, type_name))
        take("}")

    while pos < len(toks):
        kw = take()
        if kw == "syntax":
            take("=")
            take()
            take(";")
        elif kw == "package":
            fd.package = take()
            take(";")
        elif kw == "message":
            message(fd.message_type, "")
        else:
            raise ValueError(f"caffe.proto: unexpected '{kw}'")
    pkg = "." + fd.package
    top = {m.name for m in fd.message_type}
    top_enums = {e.name for e in fd.enum_type}
    for msg, _, fields in messages:
        nested = {e.name for e in msg.enum_type}
        for f, type_name in fields:
            if type_name in SCALARS:
                f.type = SCALARS[type_name]
                if f.HasField("default_value") and type_name in ("float", "double"):
                    f.default_value = repr(float(f.default_value))
            elif type_name in nested:
                f.type, f.type_name = _F.TYPE_ENUM, f"{pkg}.{msg.name}.{type_name}"
            elif type_name in top_enums:
                f.type, f.type_name = _F.TYPE_ENUM, f"{pkg}.{type_name}"
            elif type_name in top:
                f.type, f.type_name = _F.TYPE_MESSAGE, f"{pkg}.{type_name}"
            else:
                raise ValueError(f"caffe.proto: unknown type {type_name} of {msg.name}.{f.name}")
    return fd


@lru_cache(maxsize=1)
def messages() -> dict:
    """Message classes by name, from the caffe.proto next to this file."""
    fd = parse((Path(__file__).with_name("caffe.proto")).read_text())
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    file_desc = pool.FindFileByName(fd.name)
    return {name: message_factory.GetMessageClass(d) for name, d in file_desc.message_types_by_name.items()}
