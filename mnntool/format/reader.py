"""bytes -> MNN `Net` table -> IR, with every failure reported as one MnnToolError. Weights in a
`.mnn.weight` file beside the model (format/external.py) are memory-mapped."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import MnnToolError
from ..ir.graph import Graph, Node, TensorInfo
from ..ir.dtypes import FROM_MNN, from_mnn
from . import external
from .flatbuf import FormatError, decode

BLOB_FIELDS = ("float32s", "int32s", "int64s", "int8s", "uint8s")


def blob_value(b: dict) -> np.ndarray:
    dims = [int(d) for d in b.get("dims", [])]
    if b.get("dataType") in ("DT_HALF", "DT_BFLOAT16") and "uint8s" in b:   # 2-byte floats as raw bytes (--fp16)
        raw = np.asarray(b["uint8s"], np.uint8)
        if raw.size % 2:
            raise FormatError(f"a {b['dataType']} constant of {raw.size} bytes")
        if b["dataType"] == "DT_HALF":
            arr = raw.view(np.float16).astype(np.float32)
        else:
            arr = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        b = {"dims": dims, "float32s": arr}
    for field in BLOB_FIELDS:
        if field in b:
            arr = np.asarray(b[field])
            if field == "int64s":
                arr = arr.astype(np.int32)
            break
    else:
        arr = np.zeros(0, np.float32)
    expected = int(np.prod(dims)) if dims else 1
    if arr.size != expected:
        raise FormatError(f"constant has {arr.size} values for dims {dims}")
    return arr.reshape(dims)


def _fill(g: Graph, ops: list, names: list) -> set:
    """The ops into the graph (inputs in the order of their Input ops); returns the tensors produced."""
    def name(i: int) -> str:
        i = int(i)
        if not 0 <= i < len(names):
            raise FormatError(f"tensor index {i} is outside the {len(names)} named tensors")
        return names[i]

    produced: set[str] = set()
    for k, op in enumerate(ops or []):
        kind = op.get("type")
        outs = [name(i) for i in op.get("outputIndexes", [])]
        ins = [name(i) for i in op.get("inputIndexes", [])]
        param = op.get("main") or {}
        if kind == "Input":
            dims = param.get("dims")
            shape = tuple(int(d) if d >= 0 else f"d{j}" for j, d in enumerate(dims)) if dims is not None else None
            g.inputs.append(outs[0])
            g.tensors[outs[0]] = TensorInfo(outs[0], from_mnn(param.get("dtype", "DT_FLOAT")), shape)
        elif kind == "Const" and op.get("main_type") == "Blob":
            value = blob_value(param)
            g.constants[outs[0]] = value
            g.tensors[outs[0]] = TensorInfo(outs[0], str(value.dtype), tuple(value.shape))
        else:
            fmt = op.get("defaultDimentionFormat")
            g.nodes.append(Node(kind, ins, outs, op.get("name") or f"op{k}", param,
                                op.get("main_type") if op.get("main_type") != "NONE" else None,
                                fmt if fmt != "NHWC" else None))
        produced.update(outs)
    return produced


def _seq(v) -> list:
    return [] if v is None else list(v)


BODY_FIELDS = {"If": ("then_graph", "else_graph"), "While": ("cond_graph", "body_graph")}


def _subgraphs(protos: list) -> dict[str, Graph]:
    """MNN's named bodies as graphs. Their Input ops' types and shapes are placeholders in files MNN's
    converter writes ([1], int32 for any tensor): the runtime takes both from the values fed."""
    subs: dict[str, Graph] = {}
    for proto in protos or []:
        names = list(_seq(proto.get("tensors")))
        sub = Graph(name=proto.get("name", ""))
        _fill(sub, proto.get("nodes"), names)
        try:
            sub.inputs = [names[int(i)] for i in _seq(proto.get("inputs"))]
            sub.outputs = [names[int(i)] for i in _seq(proto.get("outputs"))]
        except IndexError:
            raise FormatError(f"subgraph '{sub.name}' names a tensor outside its list") from None
        for name in sub.inputs:
            sub.tensors[name] = TensorInfo(name, sub.info(name).dtype, None)
        subs[sub.name] = sub
    return subs


def _attach(g: Graph, subs: dict[str, Graph], depth: int = 0) -> None:
    if depth > 64:
        raise FormatError("control-flow bodies nest more than 64 deep (or refer to themselves)")
    for node in g.nodes:
        for field in BODY_FIELDS.get(node.op, ()):
            ref = node.param.get(field)
            if not ref:
                continue
            if ref not in subs:
                raise FormatError(f"{node.op} '{node.name}' names the body '{ref}', which the file does not have")
            node.graphs[field] = subs[ref]
            _attach(subs[ref], subs, depth + 1)


def net_to_graph(net: dict) -> Graph:
    names = list(net.get("tensorName") or [])
    g = Graph(source=net.get("sourceType", "CAFFE"))
    produced = _fill(g, net.get("oplists"), names)
    _attach(g, _subgraphs(net.get("subgraphs")))
    for d in net.get("extraTensorDescribe") or []:
        blob = d.get("blob")
        k = int(d.get("index", -1))
        if not 0 <= k < len(names) or names[k] in g.constants:
            continue
        if d.get("quantInfo"):
            g.info(names[k]).quant = dict(d["quantInfo"])
        if blob is None or blob.get("dims") is None:
            continue
        t = g.info(names[k])
        if t.shape is None:
            t.shape = tuple(int(x) for x in blob["dims"])
        if blob.get("dataType") in FROM_MNN:     # an index tensor's int32, as the writer recorded it
            t.dtype = from_mnn(blob["dataType"])
        if blob.get("dataFormat") == "NC4HW4":
            t.layout = "NC4HW4"
    g.outputs = list(net.get("outputName") or [])
    if not g.outputs:
        used = {i for n in g.nodes for i in n.inputs}
        g.outputs = [o for n in g.nodes for o in n.outputs if o not in used]
    for o in g.outputs:
        if o not in produced:
            raise FormatError(f"output '{o}' is produced by no op")
    return g


def load(path: str | os.PathLike) -> Graph:
    path = Path(path)
    try:
        data = bytearray(path.stat().st_size)      # writable: the weights are views into it (flatbuf.vector)
        with open(path, "rb") as f:
            if f.readinto(data) != len(data):
                raise MnnToolError(f"{path}: changed while it was read")
    except FileNotFoundError:
        raise MnnToolError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise MnnToolError(f"{path}: is a directory, expected a .mnn file") from None
    if not data:
        raise MnnToolError(f"{path}: file is empty")
    try:
        net = decode(data, "Net")
        if not net.get("oplists"):
            raise FormatError("no ops")
        weights = external.attach(net, path)     # arrays in <path>.weight: mapped, not read
        g = net_to_graph(net)
    except (FormatError, KeyError, ValueError, TypeError, IndexError, AttributeError, OverflowError) as e:
        # every way a corrupt table shows itself while it is decoded (an op without outputs: IndexError)
        raise MnnToolError(f"{path}: not a valid MNN model ({type(e).__name__}: {' '.join(str(e).split())[:160]})") from None
    g.name = path.stem
    g.weight_file = str(weights) if weights else None
    return g
