"""IR -> MNN `Net` table -> bytes, written atomically (big weights into a `.mnn.weight` file beside it)."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from .._version import MNN_FORMAT_VERSION
from ..errors import MnnToolError
from ..interrupts import deferred, test_point
from ..ir import ops
from ..ir.graph import Graph
from ..ir.dtypes import to_mnn
from .external import externalize, weight_path
from .flatbuf import FormatError, encode, encode_buffer

FLATBUFFERS_MAX = 2**31 - 1
EXTERNAL_ABOVE = 2000 * 2**20     # MNN's converter moves the weights out past 2000 MB (writeFb.cpp)

BLOB_FIELD = {"DT_FLOAT": ("float32s", np.float32), "DT_INT32": ("int32s", np.int32),
              "DT_INT8": ("int8s", np.int8), "DT_UINT8": ("uint8s", np.uint8)}


def blob(value: np.ndarray) -> dict:
    arr = np.asarray(value)
    dtype = "DT_FLOAT" if arr.dtype == np.float16 else to_mnn(arr.dtype)   # constants are stored as float32
    field, np_type = BLOB_FIELD[dtype]
    out = {"dataFormat": "NCHW", "dataType": dtype, field: arr.astype(np_type, copy=False).reshape(-1)}
    if arr.ndim:
        out["dims"] = np.array(arr.shape, dtype=np.int32)
    return out


def _oplists(g: Graph, take, constants: set):
    """The graph's ops (Input and Const ops included) and its tensor names, as MNN lists them."""
    names: list[str] = []
    index: dict[str, int] = {}

    def idx(name: str) -> int:
        if name not in index:
            index[name] = len(names)
            names.append(name)
        return index[name]

    oplists = []
    for name in g.inputs:
        t = g.tensors[name]
        main = {"dtype": to_mnn(t.dtype), "dformat": "NCHW"}
        if t.shape is not None:
            main["dims"] = [d if isinstance(d, int) else -1 for d in t.shape]
        oplists.append({"type": "Input", "name": name, "outputIndexes": [idx(name)], "main_type": "Input",
                        "main": main})
    for node in g.nodes:
        for i in node.inputs:
            if i in constants and i not in index:
                oplists.append({"type": "Const", "name": i, "outputIndexes": [idx(i)], "main_type": "Blob",
                                "main": blob(take(i))})
        param_type = node.param_type or (ops.get(node.op).param if node.op in ops.REGISTRY else None)
        op = {"type": node.op, "name": node.name or node.outputs[0],
              "inputIndexes": [idx(i) for i in node.inputs], "outputIndexes": [idx(o) for o in node.outputs]}
        if param_type:
            op["main_type"] = param_type
            op["main"] = node.param
        if node.fmt:
            op["defaultDimentionFormat"] = node.fmt
        oplists.append(op)
    for o in g.outputs:
        if o in constants and o not in index:
            oplists.append({"type": "Const", "name": o, "outputIndexes": [idx(o)], "main_type": "Blob",
                            "main": blob(take(o))})
    return oplists, names, index


def _subgraphs(g: Graph) -> list[dict]:
    """Every body of every control-flow op as MNN's flat list of named SubGraphProtos, a body after the
    bodies inside it (MNN builds them in order and fails on a name it has not built yet); names made
    unique where two bodies share one."""
    out: list[dict] = []
    taken: set[str] = set()

    def visit(owner: Graph) -> None:
        for node in owner.nodes:
            for field, sub in node.graphs.items():
                name, k = sub.name, 0
                while name in taken:
                    k += 1
                    name = f"{sub.name}_{k}"
                taken.add(name)
                sub.name = node.param[field] = name
                visit(sub)
                ops_, names, index = _oplists(sub, sub.constants.__getitem__, set(sub.constants))
                out.append({"name": name, "inputs": [index[i] for i in sub.inputs],
                            "outputs": [index[o] for o in sub.outputs], "tensors": names, "nodes": ops_})
    visit(g)
    return out


def graph_to_net(g: Graph, biz_code: str = "mnntool", consume: bool = False) -> dict:
    """The Net table as a dict. `consume` moves the constants out of the graph into it (see save)."""
    constants = set(g.constants)
    subgraphs = _subgraphs(g)
    oplists, names, index = _oplists(g, g.constants.pop if consume else g.constants.__getitem__, constants)
    net = {"bizCode": biz_code, "oplists": oplists, "outputName": list(g.outputs), "sourceType": g.source,
           "tensorName": names, "tensorNumber": len(names), "extraInfo": {"version": MNN_FORMAT_VERSION}}
    if subgraphs:
        net["subgraphs"] = subgraphs
    describes = []
    for name, k in index.items():     # inferred shapes and int8 scales, where MNN keeps per-tensor facts
        t = g.tensors.get(name)
        if t is None or name in constants:
            continue
        d = {"index": k}
        if t.shape is not None and all(isinstance(x, int) for x in t.shape):
            d["blob"] = {"dims": list(t.shape), "dataType": to_mnn(t.dtype),
                         "dataFormat": t.layout if t.layout in ("NCHW", "NC4HW4") else "NCHW"}
        if t.quant:
            d["quantInfo"] = dict(t.quant)
        if len(d) > 1:
            describes.append(d)
    if describes:
        net["extraTensorDescribe"] = describes
    return net


def to_bytes(g: Graph, biz_code: str = "mnntool") -> bytes:
    return encode("Net", graph_to_net(g, biz_code))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


MODEL_SUFFIXES = (".mnn", ".onnx", ".pb", ".tflite", ".pt", ".pth", ".prototxt", ".caffemodel", ".keras", ".h5",
                  ".weight")


def _same_file(a: Path, b: Path) -> bool:
    """Whether writing `a` would replace `b`: the same path once links are followed, or one file under
    two names (a hard link)."""
    try:
        if a.resolve() == b.resolve():
            return True
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def check_output(path: str | os.PathLike, sources=()) -> Path:
    """The output path, refused with one line when writing it would lose data or cannot work: it is one
    of the sources, a directory, or an existing non-regular file (a device: /dev/full is not replaced)."""
    path = Path(path)
    for src in sources:
        if src is not None and _same_file(path, Path(src)):
            what = "the source model" if Path(src).suffix.lower() in MODEL_SUFFIXES else f"an input ({src})"
            raise MnnToolError(f"{path}: is {what}; refusing to overwrite it")
    if path.is_dir():
        raise MnnToolError(f"{path}: is a directory; give a file name")
    if path.exists() and not path.is_file():
        raise MnnToolError(f"{path}: exists and is not a regular file; refusing to replace it")
    if not path.parent.is_dir():
        raise MnnToolError(f"{path}: directory {path.parent} does not exist")
    return path


class _Staged:
    """A temporary file beside `path`: commit() flushes it to disk and renames it onto `path`, discard()
    removes it. No half-written outputs; the umask honoured (mkstemp alone makes 0600)."""

    def __init__(self, path: Path):
        self.path = path
        try:
            fd, self.tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        except OSError as e:
            raise MnnToolError(f"{path}: cannot write here ({e.strerror or e})") from None
        self.file = os.fdopen(fd, "wb")

    def write(self, data) -> None:
        try:
            self.file.write(data)
        except OSError as e:
            raise MnnToolError(f"{self.path}: cannot write ({e.strerror or e})") from None
        test_point("write")     # the interrupt tests stop here, the temporary file on disk

    def commit(self) -> None:
        try:
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()
            os.chmod(self.tmp, 0o666 & ~_umask())
            os.replace(self.tmp, self.path)
        except OSError as e:
            raise MnnToolError(f"{self.path}: cannot write ({e.strerror or e})") from None

    def discard(self) -> None:
        self.file.close()
        if os.path.exists(self.tmp):
            os.unlink(self.tmp)


def atomic_write(path: str | os.PathLike, data: bytes, sources=()) -> None:
    """Write to a temporary file beside the target, flush it to disk, then rename: no half-written
    outputs, the umask honoured, sources and devices never replaced."""
    staged = _Staged(check_output(path, sources))
    try:
        staged.write(data)
        staged.commit()
    except BaseException:
        staged.discard()
        raise


def _arrays(g: Graph) -> list:
    arrays = list(g.constants.values())
    stack = [n.param for n in g.nodes]
    while stack:
        v = stack.pop()
        if isinstance(v, np.ndarray):
            arrays.append(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)) and len(v) < 64:
            stack.extend(v)
    return arrays


def _size_hint(arrays: list, nodes: int) -> int:
    """About the file's size (arrays as stored, 4 bytes an element at most, plus room for the tables)."""
    return sum(a.size * max(a.itemsize, 4) for a in arrays) + (1 << 20) + 4096 * nodes


def _stored_bytes(arrays: list) -> int:
    """The arrays' bytes as the file stores them (floats as float32, int8 tables as bytes)."""
    return sum(a.size * (1 if a.itemsize == 1 else 4) for a in arrays)


def _encode(net: dict, hint: int, consume: bool, path, external: bool) -> memoryview:
    try:
        return encode_buffer("Net", net, hint, consume)
    except FormatError as e:
        more = "" if external else " (--external-weights moves the weights into a .mnn.weight file)"
        raise MnnToolError(f"{path}: {e}{more}") from None


def save(g: Graph, path: str | os.PathLike, biz_code: str = "mnntool", sources=(), consume: bool = False,
         external: bool | None = None) -> int:
    """write(), returning the bytes written (both files' when the weights are external)."""
    return write(g, path, biz_code, sources, consume, external)["bytes"]


def write(g: Graph, path: str | os.PathLike, biz_code: str = "mnntool", sources=(), consume: bool = False,
          external: bool | None = None) -> dict:
    """Write the graph as a .mnn; returns {"bytes", "weight_file"}. With `consume` the graph's constants
    are moved into the file as it is built and the graph is left without them: a large model's weights
    are then held once, not twice. `external` writes the big arrays into `<path>.weight` (MNN's
    --saveExternalData layout, format/external.py) as the tables are walked; None does so when they
    pass 2000 MB, as MNN's converter does. Both files are staged beside their targets and renamed into
    place only once both are whole."""
    path = check_output(path, sources)
    arrays = _arrays(g)
    hint, stored = _size_hint(arrays, len(g.nodes)), _stored_bytes(arrays)
    del arrays
    if external is None:
        external = stored > EXTERNAL_ABOVE
    if not external:
        if stored > FLATBUFFERS_MAX:
            raise MnnToolError(f"{path}: the model's weights come to {stored / 2**30:.1f} GB, and a .mnn (one "
                               "FlatBuffers file) holds 2 GB; --external-weights writes them to a .mnn.weight file")
        data = _encode(graph_to_net(g, biz_code, consume), hint, consume, path, False)
        atomic_write(path, data, sources)
        return {"bytes": len(data), "weight_file": None}
    wpath = check_output(weight_path(path), sources)
    net = graph_to_net(g, biz_code, consume)
    staged = [_Staged(wpath)]
    try:
        moved = externalize(net, staged[0], consume)
        data = _encode(net, max(hint - moved, 0), consume, path, True)
        staged.append(_Staged(path))
        staged[1].write(data)
        with deferred():        # an interrupt waits until both files are in place (or neither)
            staged[0].commit()
            try:
                staged[1].commit()
            except BaseException:
                os.unlink(wpath)
                raise
    except BaseException:
        for s in staged:
            s.discard()
        raise
    return {"bytes": len(data) + moved, "weight_file": str(wpath)}
