"""A numpy reader of the safetensors format, checked before it is trusted.

Layout: 8 bytes little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets: [begin,
end]}, "__metadata__": {str: str}}, then the data (offsets count from its start). The file is memory-mapped
read-only and a tensor is a view into the map, so a 15 GB checkpoint is read one tensor at a time without
holding it in memory. Checkpoints come from the internet: every field is checked (types, sizes against the
byte ranges, ranges against the file, overlaps) before a view is made, and each problem is one MnnToolError
line naming the file and the tensor. Nothing is allocated from a size the header claims.
"""
from __future__ import annotations

import json
import math
import mmap
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..errors import MnnToolError

MAX_HEADER = 100 << 20          # the library's own limit; real headers are a few hundred KB
MAX_DIMS = 64
MAX_DIM = (1 << 63) - 1         # keeps the element count a small integer, whatever the header says

# name -> little-endian numpy dtype (the format's byte order on any host)
NUMPY = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "C64": "<c8",
         "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
         "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?"}
# one byte each, laid out and checked like the others, but never widened: FP8 weights come with block
# scales in other tensors, and values without them would be silently wrong
FP8 = ("F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F8_E8M0")
SUB_BYTE = ("F4", "F6_E2M3", "F6_E3M2")     # packed below a byte: refused when the header is read
ITEMSIZE = {**{k: np.dtype(v).itemsize for k, v in NUMPY.items()}, **{k: 1 for k in FP8}}


def show(name: str, limit: int = 120) -> str:
    """A name from a file, quoted, on one line and of bounded length (a hostile name cannot forge lines)."""
    text = name if name.isprintable() else repr(name)[1:-1]
    return f"'{text[:limit]}...'" if len(text) > limit else f"'{text}'"


class Entry(NamedTuple):
    dtype: str
    shape: tuple[int, ...]


class _Span(NamedTuple):
    dtype: str
    shape: tuple[int, ...]
    begin: int              # in the data buffer
    end: int


def _no_duplicates(pairs: list) -> dict:
    """json.loads keeps the last of two equal keys; a header naming a tensor twice is refused instead."""
    out = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"the key {show(k)} appears twice")
        out[k] = v
    return out


def _is_int(v) -> bool:
    return type(v) is int       # not bool, not 2.0


class SafetensorsFile:
    """One .safetensors file: the header checked at open, tensors as read-only views of a map."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                head = f.read(8)
                if size < 8 or len(head) < 8:
                    raise self._error(f"is {size} bytes, too short for a safetensors header")
                n = int.from_bytes(head, "little")
                if n > MAX_HEADER:
                    raise self._error(f"header length {n} is absurd (limit {MAX_HEADER}): not a safetensors file?")
                if n > size - 8:
                    raise self._error(f"header length {n} runs past the end of the file ({size} bytes)")
                raw = f.read(n)
                if len(raw) != n:
                    raise self._error("changed while it was read")
                self._map: mmap.mmap | None = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except FileNotFoundError:
            raise self._error("no such file") from None
        except IsADirectoryError:
            raise self._error("is a directory, expected a .safetensors file") from None
        except PermissionError:
            raise self._error("cannot be read (permission denied)") from None
        self._start = 8 + n
        self._spans, self.metadata = self._parse(raw, size - 8 - n)
        self.names = list(self._spans)

    def _error(self, what: str, name: str | None = None) -> MnnToolError:
        return MnnToolError(f"{self.path}: {'tensor ' + show(name) + ' ' if name is not None else ''}{what}")

    def _parse(self, raw: bytes, data_len: int) -> tuple[dict[str, _Span], dict[str, str]]:
        try:
            header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
        except UnicodeDecodeError:
            raise self._error("header is not UTF-8: not a safetensors file?") from None
        except (ValueError, RecursionError) as e:       # JSONDecodeError, a duplicate key, deep nesting
            raise self._error(f"header is not valid JSON ({' '.join(str(e).split())[:120]})") from None
        if not isinstance(header, dict):
            raise self._error(f"header is a JSON {type(header).__name__}, expected an object")
        metadata = header.pop("__metadata__", {})
        if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
            raise self._error("header's __metadata__ is not an object of strings")
        spans = {name: self._entry(name, e, data_len) for name, e in header.items()}
        used = sorted((s.begin, s.end, name) for name, s in spans.items() if s.end > s.begin)
        for (b0, e0, n0), (b1, e1, n1) in zip(used, used[1:]):
            if b1 < e0:
                raise self._error(f"tensors {show(n0)} (bytes [{b0}, {e0})) and {show(n1)} "
                                  f"(bytes [{b1}, {e1})) overlap")
        return spans, metadata

    def _entry(self, name: str, e, data_len: int) -> _Span:
        def bad(what: str) -> MnnToolError:
            return self._error(what, name)
        if not isinstance(e, dict):
            raise bad(f"has a JSON {type(e).__name__} entry, expected an object")
        for field in ("dtype", "shape", "data_offsets"):
            if field not in e:
                raise bad(f"has no '{field}'")
        dtype, shape, offsets = e["dtype"], e["shape"], e["data_offsets"]
        if not isinstance(dtype, str):
            raise bad("has a dtype that is not a string")
        if dtype in SUB_BYTE:
            raise bad(f"has dtype {dtype}, packed below a byte: not supported")
        if dtype not in ITEMSIZE:
            raise bad(f"has unknown dtype {show(dtype, 20)}")
        if not isinstance(shape, list):
            raise bad("has a shape that is not a list")
        if len(shape) > MAX_DIMS:
            raise bad(f"has {len(shape)} dims (limit {MAX_DIMS})")
        for d in shape:
            if not _is_int(d):
                raise bad(f"has a non-integer dim {json.dumps(d)[:30]} in its shape")
            if d < 0:
                raise bad(f"has a negative dim {d} in its shape")
            if d > MAX_DIM:
                raise bad(f"has an absurd dim {str(d)[:30]} in its shape")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(o) for o in offsets)):
            raise bad("has data_offsets that are not two integers")
        begin, end = offsets
        if begin < 0 or begin > end:
            raise bad(f"has data_offsets [{begin}, {end}]: begin must be between 0 and end")
        if end > data_len:
            raise bad(f"has data_offsets [{begin}, {end}] past the end of the data ({data_len} bytes)")
        count = math.prod(shape)        # an int of at most 64 * 63 bits: compared, never allocated
        if count * ITEMSIZE[dtype] != end - begin:
            raise bad(f"has shape {shape} of {dtype}: {count} elements need {count * ITEMSIZE[dtype]} bytes, "
                      f"data_offsets give {end - begin}")
        return _Span(dtype, tuple(shape), begin, end)

    def _span(self, name: str) -> _Span:
        if self._map is None:
            raise self._error("is closed")
        if name not in self._spans:
            raise self._error("not in this file", name)
        return self._spans[name]

    def __contains__(self, name: str) -> bool:
        return name in self._spans

    def info(self, name: str) -> Entry:
        s = self._span(name)
        return Entry(s.dtype, s.shape)

    def get(self, name: str) -> np.ndarray:
        """A read-only view into the map (BF16 as its uint16 bits: see to_float32). Valid after close()."""
        s = self._span(name)
        if s.dtype in FP8:
            raise self._error(f"is {s.dtype} (FP8): not supported; FP8 weights need the block scales stored "
                              "beside them, dequantize the checkpoint to BF16 or F16 first", name)
        if s.begin == s.end:
            out = np.zeros(s.shape, NUMPY[s.dtype])
            out.flags.writeable = False
            return out
        count = (s.end - s.begin) // ITEMSIZE[s.dtype]
        return np.frombuffer(self._map, NUMPY[s.dtype], count, self._start + s.begin).reshape(s.shape)

    def release(self, name: str) -> None:
        """Drop the tensor's pages from this process (they stay in the page cache). Touched pages of a map
        count in RSS: without this, reading every tensor once shows the whole file as resident."""
        s = self._span(name)
        if s.begin == s.end or not hasattr(mmap, "MADV_DONTNEED"):
            return
        first = (self._start + s.begin) // mmap.PAGESIZE * mmap.PAGESIZE
        try:
            self._map.madvise(mmap.MADV_DONTNEED, first, self._start + s.end - first)
        except (OSError, ValueError):
            pass        # only a hint

    def close(self) -> None:
        """Forget the map; views already handed out keep it alive until they go (so none dangles)."""
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:         # views still exported: the map closes when the last one goes
                pass
            self._map = None

    def __enter__(self) -> SafetensorsFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def to_float32(arr: np.ndarray, dtype: str) -> np.ndarray:
    """A new float32 array from a float tensor as `get` returns it: BF16 is the top half of an F32, so its
    bits are shifted into place rather than converted (numpy has no bfloat16)."""
    if dtype == "BF16":
        out = arr.astype(np.uint32)
        out <<= 16
        return out.view(np.float32)
    if dtype in ("F32", "F16", "F64"):
        return arr.astype(np.float32)
    raise ValueError(f"to_float32: {dtype} is not a float dtype")
