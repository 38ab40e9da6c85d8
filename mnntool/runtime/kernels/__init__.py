"""Kernel registry: op name -> factory that, at prepare time, returns the function that runs the op.

A factory gets the node and what shape inference knows of its inputs and outputs, does the one-time
work (weight packing, index tables) and returns a Kernel. A kernel either writes into output
buffers that the planner owns (`writes_out`), or returns arrays (views, tiny shape tensors).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ...registry import registrar

KERNELS: dict[str, Callable] = {}


@dataclass
class Kernel:
    fn: Callable
    writes_out: bool = False   # fn(inputs, outputs) fills preallocated outputs; else fn(inputs) -> outputs
    out_grid: tuple | None = None   # the int8 grid (conv.grid_of) the first output is rounded to, if any


kernel = registrar(KERNELS)


def returns(fn) -> Kernel:
    return Kernel(fn, False)


def writes(fn) -> Kernel:
    return Kernel(fn, True)


from . import conv, elementwise, matmul, norm, pool, resize, tensor  # noqa: E402,F401  (registration)
