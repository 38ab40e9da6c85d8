"""Checks an IR graph must pass before it is written: a .mnn that MNN or mnntool cannot load is never
written (MNN segfaults on an output no op produces, or on dims past int32)."""
from __future__ import annotations

from ..errors import MnnToolError
from .graph import Graph

INT32_MAX = 2**31 - 1


def validate(g: Graph, where: str = "") -> None:
    prefix = f"{where}: " if where else ""
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
    for name, value in g.constants.items():
        if any(d > INT32_MAX for d in value.shape):
            raise MnnToolError(f"{prefix}constant '{name}' has a dimension beyond MNN's int32")
