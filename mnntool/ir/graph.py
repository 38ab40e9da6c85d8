"""The graph IR: ops named by MNN op type, parameters as MNN parameter tables, constants as arrays."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

Dim = int | str  # a symbolic dimension is a name
Shape = tuple[Dim, ...]


@dataclass
class Node:
    op: str                    # an MNN OpType name, e.g. "Convolution"
    inputs: list[str]
    outputs: list[str]
    name: str = ""
    param: dict = field(default_factory=dict)  # fields of the op's MNN parameter table
    param_type: str | None = None              # the OpParameter member; None takes the op's default
    fmt: str | None = None                     # defaultDimentionFormat when it matters to MNN
    graphs: dict = field(default_factory=dict)  # control flow: the bodies, by the param field naming them


@dataclass
class TensorInfo:
    name: str
    dtype: str = "float32"
    shape: Shape | None = None
    layout: str = "NCHW"       # NC4HW4 for tensors that convolutions and pools exchange
    quant: dict | None = None  # MNN TensorQuantInfo (scale, zero, min, max, type) for int8 tensors


def consumers_of(nodes: list[Node]) -> dict[str, list[Node]]:
    """Who reads each tensor among `nodes`: its reading nodes in order, a node that reads it twice (x * x,
    IsNaN as x != x) listed once. Graph.consumers() asks it of the graph's nodes; the planner asks it of
    the node list it is rewriting."""
    out: dict[str, list[Node]] = {}
    for n in nodes:
        for i in dict.fromkeys(n.inputs):
            out.setdefault(i, []).append(n)
    return out


def producers_of(nodes: list[Node]) -> dict[str, Node]:
    """The node that writes each tensor among `nodes`."""
    return {o: n for n in nodes for o in n.outputs}


@dataclass
class Graph:
    nodes: list[Node] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    source: str = "ONNX"       # NetSource name
    name: str = "model"
    # convolutions a quantized source model runs in int8, by node name: {"weight": int8 (O, I*kh*kw),
    # "alpha": per-channel scales, "input"/"output": (scale, zero point)}; applied after the passes
    int8_plan: dict = field(default_factory=dict)
    weight_file: str | None = None   # a .mnn read with external weights: the .weight file they are mapped from

    def info(self, name: str) -> TensorInfo:
        if name not in self.tensors:
            self.tensors[name] = TensorInfo(name)
        return self.tensors[name]

    def producers(self) -> dict[str, Node]:
        return producers_of(self.nodes)

    def consumers(self) -> dict[str, list[Node]]:
        """Who reads each tensor (consumers_of the graph's nodes): the one such query, which the passes,
        the quantizer and the planner ask."""
        return consumers_of(self.nodes)

    def sole_consumer(self, name: str, readers: dict[str, list[Node]] | None = None) -> Node | None:
        """The one node reading `name` when it is not a graph output and nothing else reads it: only then
        may a rewrite fold the tensor away. `readers` is a consumers() map already at hand (a pass that
        does not change the graph between its questions asks consumers() once)."""
        us = (self.consumers() if readers is None else readers).get(name, [])
        return us[0] if len(us) == 1 and name not in self.outputs else None

    def fresh_name(self, base: str) -> str:
        taken = set(self.tensors) | set(self.constants) | {o for n in self.nodes for o in n.outputs}
        if base not in taken:
            return base
        i = 1
        while f"{base}_{i}" in taken:
            i += 1
        return f"{base}_{i}"

    def scalar(self, name: str) -> float | None:
        """The value of a one-element constant, else None."""
        v = self.constants.get(name)
        return float(np.asarray(v).reshape(-1)[0]) if v is not None and np.asarray(v).size == 1 else None

    def add_const(self, base: str, value) -> str:
        name = self.fresh_name(base)
        arr = np.asarray(value)
        self.constants[name] = arr
        self.tensors[name] = TensorInfo(name, str(arr.dtype), tuple(arr.shape))
        return name

    def subgraphs(self):
        """Every body of every control-flow op, nested ones too, depth first."""
        for n in self.nodes:
            for sub in n.graphs.values():
                yield sub
                yield from sub.subgraphs()

    def param_count(self) -> int:
        total = sum(int(v.size) for v in self.constants.values() if v.dtype.kind == "f")
        for n in self.nodes:
            for key in ("weight", "bias", "slope", "gamma", "beta", "scaleData", "biasData"):
                v = n.param.get(key)
                if isinstance(v, np.ndarray):
                    total += int(v.size)
            qp = n.param.get("quanParameter")
            if qp is not None and "weight" not in n.param and n.param.get("common"):
                c = n.param["common"]
                group = c.get("group", 1) or 1
                total += c["outputCount"] * (c.get("inputCount", 0) // group) * c.get("kernelX", 1) * c.get("kernelY", 1)
        return total

    def toposort(self) -> None:
        """Order nodes so every input is produced before it is used (stable for sorted graphs)."""
        ready = set(self.inputs) | set(self.constants)
        pending, ordered = list(self.nodes), []
        while pending:
            rest = []
            for n in pending:
                if all(i in ready or i == "" for i in n.inputs):
                    ordered.append(n)
                    ready.update(n.outputs)
                else:
                    rest.append(n)
            if len(rest) == len(pending):
                missing = sorted({i for n in rest for i in n.inputs if i not in ready})
                raise ValueError(f"graph has a cycle or undefined tensors: {missing[:5]}")
            pending = rest
        self.nodes = ordered
