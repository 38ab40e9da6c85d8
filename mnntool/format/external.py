"""MNN's external weight file (`<model>.mnn.weight`), written and read.

Why: a .mnn is one FlatBuffer, and FlatBuffers address 2 GB at most. MNN's converter moves the big arrays
into a side file (with `--saveExternalData`, and on its own past 2000 MB), and MNN's runtime opens it as
`<the .mnn's path>.weight` (Interpreter and Module set that default). The facts below are MNN 3.6.1's
(tools/converter/source/common/RemoveParams.cpp writes, source/core/OpCommonUtils.cpp, InitNet.cpp and
ConvolutionCommon.cpp read) and were checked against pairs its converter wrote:

- The file is the raw little-endian arrays back to back: no header, no padding, no alignment. Ops are
  visited in order, the net's `oplists` then each subgraph's `nodes`, offsets growing from 0.
- An op whose arrays moved gets `external = [offset, bytes of field 1, bytes of field 2, ...]` in its
  parameter table; the fields lie one after another from `offset` and are gone from the table:
  Convolution2D (weights not an input): weight, bias (float32); with a quanParameter (weight-only int8/
  int4, fp16 as type 3, int8 PTQ): buffer (int8), alpha (float32, or alphaFp16 as uint16 when scaleStorage
  is FP16), bias, index (uint32) -- all four listed, empty ones as 0 bytes.
  Scale: scaleData [, biasData]. LayerNorm: gamma, beta (only when it has both).
  Blob (Const): its data vector, for more than 1024 elements of DT_FLOAT, DT_INT32, DT_UINT8, DT_INT8 or
  DT_BFLOAT16 (the converter keeps DT_HALF constants inline; the runtime reads them from the file too).
- `Op.externalPath` names another file for that op (MNN's LLM exports); the converter never writes it.
"""
from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np

from ..errors import MnnToolError
from .flatbuf import FormatError

F32, I8, U8, I32, U16, U32 = (np.dtype(t) for t in ("<f4", "i1", "u1", "<i4", "<u2", "<u4"))
BLOB_WRITE = {"DT_FLOAT": ("float32s", F32), "DT_INT32": ("int32s", I32), "DT_UINT8": ("uint8s", U8),
              "DT_INT8": ("int8s", I8), "DT_BFLOAT16": ("uint8s", U8)}
BLOB_READ = dict(BLOB_WRITE, DT_HALF=("uint8s", U8))
INLINE_MAX = 1024       # a constant of this many elements or fewer stays in the .mnn (as MNN's converter)


def weight_path(model: str | os.PathLike) -> Path:
    """The weight file MNN's runtime opens for a model: its path with `.weight` added."""
    return Path(str(model) + ".weight")


def _ops(net: dict):
    yield from net.get("oplists") or []
    for sub in net.get("subgraphs") or []:
        yield from sub.get("nodes") or []


def _empty(v) -> bool:
    return v is None or np.size(v) == 0


def _slots(op: dict, main: dict, reading: bool) -> list:
    """(table, field, dtype) of the arrays an op keeps in the weight file, in file order; writing, only
    those MNN's converter moves out of this op."""
    kind = op.get("main_type")
    if kind == "Convolution2D":
        if len(op.get("inputIndexes") if op.get("inputIndexes") is not None else ()) > 1:
            return []           # weights fed as an input: nothing to move
        qp = main.get("quanParameter")
        if isinstance(qp, dict):
            alpha = ("alphaFp16", U16) if qp.get("scaleStorage") == "FP16" else ("alpha", F32)
            return [(qp, "buffer", I8), (qp, *alpha), (main, "bias", F32), (qp, "index", U32)]
        if not reading and _empty(main.get("weight")):
            return []           # int8 PTQ of the old kind (symmetricQuan alone): MNN's loader needs the weight first
        return [(main, "weight", F32), (main, "bias", F32)]
    if kind == "Scale":
        if not reading and _empty(main.get("scaleData")):
            return []
        bias = [] if not reading and _empty(main.get("biasData")) else [(main, "biasData", F32)]
        return [(main, "scaleData", F32)] + bias
    if kind == "LayerNorm":
        if not reading and (_empty(main.get("gamma")) or _empty(main.get("beta"))):
            return []
        return [(main, "gamma", F32), (main, "beta", F32)]
    if kind == "Blob":
        field = (BLOB_READ if reading else BLOB_WRITE).get(main.get("dataType", "DT_FLOAT"))
        if field is None:
            return []
        if not reading and (int(np.prod(main.get("dims") if main.get("dims") is not None else [], dtype=np.int64))
                            <= INLINE_MAX or _empty(main.get(field[0]))):
            return []
        return [(main, *field)]
    return []


def _raw(value, dtype: np.dtype) -> np.ndarray:
    """An array as the contiguous little-endian bytes of `dtype` (a view where it already is)."""
    a = np.asarray(value).reshape(-1)
    if a.dtype.kind in "iu" and dtype.kind in "iu" and a.dtype.itemsize == dtype.itemsize:
        a = a.view(dtype)      # int8 <-> uint8 buffers: the same bytes
    return np.ascontiguousarray(a, dtype=dtype)


def externalize(net: dict, out, consume: bool = False) -> int:
    """Move the arrays MNN's converter moves out of the Net dict into the file `out`, one op at a time,
    giving each op its `external` list; returns the bytes written. Without `consume` the tables are
    copied first (they are the graph's own parameter dicts); with it they are emptied in place, so each
    array is released as soon as it is written."""
    offset = 0
    for op in _ops(net):
        main = op.get("main")
        if not isinstance(main, dict) or op.get("externalPath"):
            continue
        if not _slots(op, main, reading=False):
            continue
        if not consume:
            op["main"] = main = dict(main)
            if isinstance(main.get("quanParameter"), dict):
                main["quanParameter"] = dict(main["quanParameter"])
        if op.get("main_type") == "Convolution2D" and _empty(main.get("bias")):
            # MNN's loader reads external[2] as the bias: a convolution without one gets zeros
            main["bias"] = np.zeros(int(main.get("common", {}).get("outputCount", 0)), np.float32)
        sizes = []
        for table, field, dtype in _slots(op, main, reading=False):
            value = table.pop(field, None)
            arr = _raw(value if value is not None else (), dtype)
            out.write(memoryview(arr).cast("B"))
            sizes.append(arr.nbytes)
            del value, arr
        main["external"] = np.array([offset, *sizes], np.int64)
        offset += sum(sizes)
    return offset


def needs_file(net: dict) -> bool:
    return any(_external(op) is not None for op in _ops(net))


def _external(op: dict):
    main = op.get("main")
    ext = main.get("external") if isinstance(main, dict) else None
    return ext if ext is not None and len(ext) > 1 else None     # MNN's USE_EXTERNAL_DATA


def _map(path: Path, op_name: str, model: Path):
    """The file as a writable copy-on-write mapping (the runtime gets ordinary writable arrays; the file is
    never written); b"" for an empty file, so its first op reports it short."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if size else b""
    except FileNotFoundError:
        raise MnnToolError(f"{path}: no such file; op '{op_name}' of {model} keeps its weights there") from None
    except IsADirectoryError:
        raise MnnToolError(f"{path}: is a directory; op '{op_name}' of {model} keeps its weights there") from None
    except OSError as e:
        raise MnnToolError(f"{path}: cannot read ({e.strerror or e}); op '{op_name}' of {model} needs it") from None


def _file_of(op: dict, model: Path) -> Path:
    """Where an op's arrays are: its own externalPath (inside the model's folder only: a model file must
    not make mnntool read files elsewhere), else the model's `.weight` file."""
    own = op.get("externalPath")
    if not own:
        return weight_path(model)
    p = Path(own) if Path(own).is_absolute() else model.parent / own
    if not p.resolve().is_relative_to(model.resolve().parent):
        raise MnnToolError(f"{model}: op '{op.get('name')}' names the weight file {own}, outside the model's folder")
    return p


def attach(net: dict, model: str | os.PathLike) -> Path | None:
    """Put every op's external arrays back into its table, as views of the mapped weight file (copies
    where a field is not aligned for its type: MNN packs the fields without padding), and drop the
    `external` lists. Returns the weight file, None when the model has no external arrays. A missing or
    short file is an MnnToolError naming the file and the first op that needs it."""
    model = Path(model)
    maps: dict[Path, object] = {}
    first = None
    for op in _ops(net):
        ext = _external(op)
        if ext is None:
            continue
        name = op.get("name") or op.get("type")
        path = _file_of(op, model)
        data = maps.get(path)
        if data is None:
            data = maps[path] = _map(path, name, model)
        first = first or path
        main = op["main"]
        slots = _slots(op, main, reading=True)
        start, sizes = int(ext[0]), [int(s) for s in ext[1:]]
        if len(sizes) > len(slots):
            raise FormatError(f"op '{name}' lists {len(sizes)} external arrays; a {op.get('main_type')} has "
                              f"{len(slots)}")
        end = start + sum(sizes)
        if start < 0 or min(sizes) < 0:
            raise FormatError(f"op '{name}' has a negative external offset or size")
        if end > len(data):
            raise MnnToolError(f"{path}: op '{name}' needs bytes {start}..{end}, the file has {len(data)} "
                               "(truncated, or not this model's weights)")
        pos = start
        for (table, field, dtype), size in zip(slots, sizes):
            if size % dtype.itemsize:
                raise FormatError(f"op '{name}': {field} of {size} bytes is not whole {dtype.name} values")
            if size:
                arr = np.frombuffer(data, dtype, size // dtype.itemsize, pos)
                table[field] = arr if arr.flags.aligned else arr.copy()
            pos += size
        del main["external"]
    return first
