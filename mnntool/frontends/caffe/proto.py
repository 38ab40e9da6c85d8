"""Caffe's message classes from caffe.desc: the FileDescriptorSet that protoc compiles from the caffe.proto
next to it (tools/caffe_descriptor.py regenerates it; a test checks the two agree). protoc does the
parsing, so every proto feature (oneof, extensions, comments, escapes) means what protobuf says, and no
generated Python code ties mnntool to one protobuf release."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

DESCRIPTOR = Path(__file__).with_name("caffe.desc")


@lru_cache(maxsize=1)
def messages() -> dict:
    """Message classes by name."""
    files = descriptor_pb2.FileDescriptorSet.FromString(DESCRIPTOR.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for fd in files.file:
        pool.Add(fd)
    file_desc = pool.FindFileByName(files.file[-1].name)
    return {name: message_factory.GetMessageClass(d) for name, d in file_desc.message_types_by_name.items()}
