"""The op registry: every op is defined once, in one unit, and everything else looks it up by name.

A definition is a class of plain functions decorated with `@define(name, ...)`:

    @define("Reduction", param="ReductionParam", inputs=("x", "axes?"))
    class Reduction:
        def infer(node, ins): ...        # [Val] from the inputs' Vals: shape, dtype (value when it knows it)
        def compute(node, xs): ...       # the outputs' values from numpy inputs, with MNN's meaning
        def flops(node, ins, outs): ...  # optional: arithmetic operations (0 for data movement)

`param` names the MNN OpParameter member the serializer writes; `inputs` names the operands, weights
and run-time operands included ("?" optional, "*" variadic). Frontends emit nodes of these ops, shape
inference and constant folding call infer/compute, the runtime runs `compute` where it has no faster
kernel, and the writer takes `param` from here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..graph import Node


@dataclass
class Val:
    """What shape inference knows of a tensor: shape, dtype and, for small known tensors, the value;
    the runtime planner adds the int8 grid its values lie on (kernels.grid.grid_of) and its zero point."""
    shape: tuple | None
    dtype: str = "float32"
    value: Any = None
    grid: tuple | None = None
    zero: float = 0.0


def _no_flops(node, ins, outs) -> int:
    return 0


@dataclass
class OpDef:
    name: str
    param: str | None                                    # OpParameter member written for this op
    inputs: tuple[str, ...]
    infer: Callable[[Node, list[Val]], list[Val]]
    compute: Callable[[Node, list[np.ndarray]], list[np.ndarray]]
    flops: Callable[[Node, list[Val], list[Val]], int] = _no_flops

    def evaluate(self, node: Node, xs: list) -> list[np.ndarray]:
        out = self.compute(node, xs)
        return [np.asarray(o) for o in (out if isinstance(out, (list, tuple)) else [out])]


REGISTRY: dict[str, OpDef] = {}


def define(*names: str, param: str | None = None, inputs: tuple[str, ...] = ("x",)):
    """Register the class's `infer`, `compute` and optional `flops` under each name."""
    def deco(cls):
        fns = vars(cls)
        for part in ("infer", "compute"):
            if part not in fns:
                raise TypeError(f"op {names[0]}: the definition has no {part}()")
        for name in names:
            REGISTRY[name] = OpDef(name, param, tuple(inputs), fns["infer"], fns["compute"],
                                   fns.get("flops", _no_flops))
        return cls
    return deco


def get(name: str) -> OpDef:
    return REGISTRY[name]


def numel(shape) -> int:
    n = 1
    for d in shape or ():
        n *= d if isinstance(d, int) else 1
    return n


def ints(v) -> list[int]:
    """A small integer tensor (axes, a shape, pads) as Python ints."""
    return [int(x) for x in np.asarray(v).reshape(-1)]


def known(v: Val, what: str, node) -> list[int]:
    """The integer value shape inference needs from an operand (ValueError when computed at run time)."""
    if v.value is None:
        raise ValueError(f"{node.op} '{node.name}': {what} is computed at run time")
    return ints(v.value)


def same(node, ins) -> list[Val]:
    """One output with the first input's shape and type."""
    return [Val(ins[0].shape, ins[0].dtype)]


def out_size(node, ins, outs) -> int:
    return numel(outs[0].shape)


from . import control, elementwise, index, nn, norm, tensor  # noqa: E402,F401  (registration)
