"""The op registry: every op is defined once (its MNN parameter table and shape inference).

Frontends build nodes of these ops, passes rewrite them, the runtime picks kernels by op name and
the serializer writes the parameter table named here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..graph import Node


@dataclass
class Val:
    """What shape inference knows of a tensor: shape, dtype and, for small known tensors, the value;
    the runtime planner adds the int8 grid step its values lie on when a kernel rounds them to one."""
    shape: tuple | None
    dtype: str = "float32"
    value: Any = None
    grid: float | None = None


@dataclass
class OpDef:
    name: str
    param: str | None                                # OpParameter member written for this op
    infer: Callable[[Node, list[Val]], list[Val]]
    flops: Callable[[Node, list[Val], list[Val]], int] | None = None


REGISTRY: dict[str, OpDef] = {}


def register(name: str, param: str | None = None, flops=None):
    def deco(fn):
        REGISTRY[name] = OpDef(name, param, fn, flops)
        return fn
    return deco


def get(name: str) -> OpDef:
    return REGISTRY[name]


def numel(shape) -> int:
    n = 1
    for d in shape or ():
        n *= d if isinstance(d, int) else 1
    return n


from . import elementwise, nn, tensor  # noqa: E402,F401  (registration)
