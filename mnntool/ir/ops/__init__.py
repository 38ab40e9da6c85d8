"""The op registry: every op is defined once, in one unit, and everything else looks it up by name.

A definition is a class of plain functions decorated with `@define(name, ...)`:

    @define("Reduction", param="ReductionParam", inputs=("x", "axes?"), kind="reduction")
    class Reduction:
        def infer(node, ins): ...        # [Val] from the inputs' Vals: shape, dtype (value when it knows it)
        def compute(node, xs): ...       # the outputs' values from numpy inputs, with MNN's meaning
        def flops(node, ins, outs): ...  # optional: arithmetic operations (0 for data movement)

`param` names the MNN OpParameter member the serializer writes; `inputs` names the operands, weights
and run-time operands included ("?" optional, "*" variadic). The keywords after them are the op's
facts that passes, the quantizer and the planner ask for (`kind`, `moves`, `layout`, `grows`, `int8`,
`spreads_grid`, `rows_at_run_time`, see OpDef); they ask through the queries below (`is_view(op)`, ...),
never through a set of op names of their own, so adding an op is its definition and its converters
(as onnx's OpSchema flags and MNN's GeometryComputer registration by op kind keep them). Frontends emit
nodes of these ops, shape inference and constant folding call infer/compute, the runtime runs
`compute` where it has no faster kernel, and the writer takes `param` from here. `params(node)` reads a
node's parameters with the schema's defaults for the fields it does not set (what MNN reads).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable

import numpy as np

from ..graph import Node
from ..schema_tables import ENUMS, TABLES


@dataclass
class Val:
    """What shape inference knows of a tensor: shape, dtype and, for small known tensors, the value;
    the runtime planner adds the int8 grid its values lie on (kernels.micro.epilogue.grid_of) and its zero point."""
    shape: tuple | None
    dtype: str = "float32"
    value: Any = None
    grid: tuple | None = None
    zero: float = 0.0


def _no_flops(node, ins, outs) -> int:
    return 0


# what an op does, coarsely: the op map groups by it and the passes ask for convolutions by it
KINDS = ("convolution", "deconvolution", "pooling", "elementwise", "movement", "reduction", "normalization",
         "matmul", "index", "generator", "sampling", "detection", "shape", "control", "input")
MOVES = (None, "view", "permute")
LAYOUTS = ("NCHW", "NC4HW4", "NC4HW4-all", "either")
INT8 = (None, "weights", "values", "float")


@dataclass
class OpDef:
    name: str
    param: str | None                                    # OpParameter member written for this op
    inputs: tuple[str, ...]
    infer: Callable[[Node, list[Val]], list[Val]]
    compute: Callable[[Node, list[np.ndarray]], list[np.ndarray]]
    flops: Callable[[Node, list[Val], list[Val]], int] = _no_flops
    kind: str = "elementwise"     # one of KINDS
    # data movement that keeps every value: "view" gives input 0's elements in the same order (a reshape,
    # a layout conversion, Identity: the runtime may hand out the same bytes); "permute" reorders them
    moves: str | None = None
    # what MNN runs it on: "NC4HW4" reads its first input and writes its output in NC4HW4 ("NC4HW4-all":
    # every input), "either" keeps whatever layout its input has (activations), "NCHW" everything else
    layout: str = "NCHW"
    grows: bool = False           # the output can be far larger than the inputs (a Tile, a Range)
    # int8 in MNN: "weights" the quantizer gives it int8 weights and grids (convolutions); "values" MNN
    # runs it on int8 values as they come, zero point included (pooling, ReLU); "float" MNN's CPU backend
    # computes it in float when an operand has no int8 grid, reading the others unrounded (BinaryOp)
    int8: str | None = None
    # MNN hands its input's int8 grid on to its output where the file gives that none: its Pipeline
    # propagates scales through it (Compiler_Loop's _getQuantPropagateOp) or its geometry makes it Raster
    # data movement; views and permutations do so too (keeps_values)
    spreads_grid: bool = False
    rows_at_run_time: bool = False  # MNN sets its output's row count only as it runs (DetectionOutput)
    source: str = ""              # the module that defines it (the op map shows it)

    def evaluate(self, node: Node, xs: list) -> list[np.ndarray]:
        out = self.compute(node, xs)
        return [np.asarray(o) for o in (out if isinstance(out, (list, tuple)) else [out])]


REGISTRY: dict[str, OpDef] = {}


def define(*names: str, param: str | None = None, inputs: tuple[str, ...] = ("x",), kind: str = "elementwise",
           moves: str | None = None, layout: str = "NCHW", grows: bool = False, int8: str | None = None,
           spreads_grid: bool = False, rows_at_run_time: bool = False):
    """Register the class's `infer`, `compute` and optional `flops` under each name, with the op's facts."""
    for value, allowed, what in ((kind, KINDS, "kind"), (moves, MOVES, "moves"), (layout, LAYOUTS, "layout"),
                                 (int8, INT8, "int8")):
        if value not in allowed:
            raise TypeError(f"op {names[0]}: {what}={value!r} is not one of {allowed}")
    if param is not None and param not in TABLES:
        raise TypeError(f"op {names[0]}: param={param!r} is no table of the MNN schema")

    def deco(cls):
        fns = vars(cls)
        for part in ("infer", "compute"):
            if part not in fns:
                raise TypeError(f"op {names[0]}: the definition has no {part}()")
        for name in names:
            REGISTRY[name] = OpDef(name, param, tuple(inputs), fns["infer"], fns["compute"],
                                   fns.get("flops", _no_flops), kind, moves, layout, grows, int8,
                                   spreads_grid, rows_at_run_time, cls.__module__)
        return cls
    return deco


def get(name: str) -> OpDef:
    return REGISTRY[name]


# ------------------------------------------------------------------ queries: what passes and planners ask

def _fact(op: str, fact: str, absent=None):
    d = REGISTRY.get(op)
    return getattr(d, fact) if d is not None else absent


def kind_of(op: str) -> str | None:
    """The op's kind (KINDS); None for an op with no definition (a runtime-only fused op)."""
    return _fact(op, "kind")


def is_convolution(op: str) -> bool:
    """Convolution and ConvolutionDepthwise: what folds BatchNorm and pads and gets int8 weights."""
    return kind_of(op) == "convolution"


def is_deconvolution(op: str) -> bool:
    return kind_of(op) == "deconvolution"


def is_view(op: str) -> bool:
    """Input 0's elements in the same order under another shape or layout: a reader may look through it."""
    return _fact(op, "moves") == "view"


def keeps_values(op: str) -> bool:
    """Every output value is an input value, only moved (a view or a permutation): a per-tensor grid
    or scale carries over."""
    return _fact(op, "moves") in ("view", "permute")


def layout_of(op: str) -> str:
    """The layout MNN runs the op on (LAYOUTS); NCHW for unknown ops."""
    return _fact(op, "layout", "NCHW")


def grows(op: str) -> bool:
    return bool(_fact(op, "grows", False))


def int8_weights(op: str) -> bool:
    """The quantizer gives it int8 weights and int8 input/output grids."""
    return _fact(op, "int8") == "weights"


def runs_int8(op: str) -> bool:
    """MNN computes it on int8 values (with their zero point): int8-weight ops and int8 pass-throughs."""
    return _fact(op, "int8") in ("weights", "values")


def int8_in_float(op: str) -> bool:
    """MNN's CPU backend computes it in float when one operand has no int8 grid (its raw reads)."""
    return _fact(op, "int8") == "float"


def spreads_grid(op: str) -> bool:
    """MNN hands the input's int8 grid on to the output (Pipeline scale propagation, Raster movement,
    and every op that only moves values)."""
    return bool(_fact(op, "spreads_grid", False)) or keeps_values(op)


def rows_at_run_time(op: str) -> bool:
    return bool(_fact(op, "rows_at_run_time", False))


def ops_where(query: Callable[[str], bool]) -> frozenset[str]:
    """The names of the registered ops a query holds for, for code that needs them as a collection."""
    return frozenset(name for name in REGISTRY if query(name))


# ------------------------------------------------------------------ parameters with the schema's defaults

_INTEGERS = {"byte", "ubyte", "short", "ushort", "int", "uint", "long", "ulong", "int8", "uint8", "int32", "uint32",
             "int64"}


@lru_cache(maxsize=None)
def schema_defaults(table: str) -> dict:
    """The defaults MNN reads for the scalar and enum fields of a parameter table that a file leaves out
    (enums by name; FlatBuffers' zero where the schema names none); tables, vectors and strings have none."""
    out = {}
    for _, field, ftype, default in TABLES.get(table, ()):
        if ftype in ENUMS:
            out[field] = default or next((k for k, v in ENUMS[ftype][1].items() if v == 0), 0)
        elif ftype == "bool":
            out[field] = default == "true"
        elif ftype in ("float", "double"):
            out[field] = float(default or 0)
        elif ftype in _INTEGERS:
            out[field] = int(default or 0)
    return out


@lru_cache(maxsize=None)
def _table_types(table: str) -> dict:
    """{field: table name} for the fields of `table` that are tables themselves (Convolution2D's common)."""
    return {field: ftype for _, field, ftype, _ in TABLES.get(table, ()) if ftype in TABLES}


class Params(Mapping):
    """A node's parameter table as MNN reads it: the node's fields, then the schema's default for each
    scalar/enum field it leaves out; a nested table reads the same way. Unknown fields raise KeyError
    (`.get(k)` gives None), so a definition never restates a default the schema holds."""

    def __init__(self, fields: dict, table: str | None):
        self._fields, self._table = fields or {}, table
        self._defaults = schema_defaults(table) if table else {}

    def __getitem__(self, key):
        if key in self._fields:
            v = self._fields[key]
            sub = _table_types(self._table).get(key) if self._table else None
            return Params(v, sub) if sub and isinstance(v, dict) else v
        return self._defaults[key]

    def __iter__(self):
        return iter(dict.fromkeys(list(self._fields) + list(self._defaults)))

    def __len__(self):
        return len(set(self._fields) | set(self._defaults))


def as_table(fields, table: str) -> Params:
    """A parameter dict (a runtime kernel's `node.param["common"]`) read with `table`'s defaults."""
    return fields if isinstance(fields, Params) else Params(fields, table)


def params(node: Node) -> Params:
    """The node's parameters with the schema's defaults, for the table its op writes."""
    table = node.param_type or (REGISTRY[node.op].param if node.op in REGISTRY else None)
    return Params(node.param, table)


# ------------------------------------------------------------------ small helpers for definitions

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


from . import control, detection, elementwise, index, nn, norm, sampling, tensor  # noqa: E402,F401  (registration)
