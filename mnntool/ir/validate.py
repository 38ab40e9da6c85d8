"""Checks an IR graph must pass before it is written: a .mnn that MNN or mnntool cannot load is never
written (MNN segfaults on an output no op produces, or on dims past int32)."""
from __future__ import annotations

import numpy as np

from ..errors import MnnToolError
from .graph import Graph

INT32_MAX = 2**31 - 1
MAX_TENSOR_BYTES = 1 << 31   # no tensor of a model that runs on a phone comes near 2 GB; a corrupt shape does


def validate(g: Graph, where: str = "") -> None:
    from .shape_inference import infer_shapes
    prefix = f"{where}: " if where else ""
    infer_shapes(g)          # the shapes as written, after every pass
    known = set(g.inputs) | set(g.constants)
    produced: dict[str, str] = {}
    for node in g.nodes:
        for i in node.inputs:
            if i and i not in known and i not in produced:
                raise MnnToolError(f"{prefix}{node.op} '{node.name}' reads '{i}', which no op produces")
        for o in node.outputs:
            if not o:
                continue
            if o in produced or o in known:
                other = produced.get(o, "a graph input or constant")
                raise MnnToolError(f"{prefix}tensor '{o}' is written twice ({other} and {node.op} '{node.name}')")
            produced[o] = f"{node.op} '{node.name}'"
    for o in g.outputs:
        if o not in produced and o not in known:
            raise MnnToolError(f"{prefix}output '{o}' is produced by no op")
    for name, info in g.tensors.items():
        if info.shape is None:
            continue
        if any(isinstance(d, int) and abs(d) > INT32_MAX for d in info.shape):
            raise MnnToolError(f"{prefix}tensor '{name}' has a dimension beyond MNN's int32 ({list(info.shape)})")
        count = 1
        for d in info.shape:
            count *= d if isinstance(d, int) and d > 0 else 1
        if count > INT32_MAX:
            raise MnnToolError(f"{prefix}tensor '{name}' would hold {count} elements ({list(info.shape)}), beyond "
                               "MNN's int32 sizes")
        nbytes = count * (np.dtype(info.dtype).itemsize if info.dtype else 4)
        if nbytes > MAX_TENSOR_BYTES:
            raise MnnToolError(f"{prefix}tensor '{name}' would take {nbytes / 2**30:.1f} GB ({list(info.shape)}); "
                               "neither MNN nor mnntool could run the model")
    for name, value in g.constants.items():
        if any(d > INT32_MAX for d in value.shape):
            raise MnnToolError(f"{prefix}constant '{name}' has a dimension beyond MNN's int32")
