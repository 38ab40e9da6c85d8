"""What the planning stages share: the Planning under way (the shaped graph and everything the stages
have decided so far), the Steps it makes and the Plan it becomes."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...ir.graph import Graph
from ..kernels import Kernel
from ..settings import Settings


@dataclass
class Step:
    name: str
    op: str
    kernel: Kernel | None       # None until built: a small op a program may take (stage `kernels`)
    ins: list[int]
    outs: list[int]
    out_views: list = field(default_factory=list)
    concat: list | None = None      # a Concat's input slices in bytes (concat_in_place), else None
    elided: bool = False            # its output written in place by its inputs' producers
    pending: tuple | None = None    # (node, ins, outs) of a step whose kernel is not built yet
    bound: bool = False             # a view step whose outputs sit in their slots from prepare on
    shared: object = None           # its kernel's reuse.Entry where plans of its arena may share it (reuse.py)
    source: tuple | None = None     # (node, ins, outs) its kernel was built from, for such a step


@dataclass(eq=False)     # compared by identity (a plan holds arrays)
class Plan:
    steps: list[Step]
    slots: list
    input_slots: dict[str, int]
    input_dtypes: dict[str, np.dtype]
    output_slots: dict[str, int]
    names: list[str]
    pool_bytes: int
    shapes: dict
    # per step (fn, input slots, output views or None, output slots): what run() needs and nothing else,
    # so a step of a tiny op (an unrolled LSTM has 436) costs ~0.2 us of Python around its kernel
    calls: list = field(default_factory=list)
    ran: list = field(default_factory=list)     # the steps of `calls`, in order (views bound at prepare are not)
    settings: Settings | None = None            # the threads its kernels were built for (None: the session's)
    # an eager plan's kernels, by (node index, operand shapes/values): see Session._run_eager
    dynamic: dict = field(default_factory=dict)
    arena: object = None        # the arena its buffers lie in (arenas.Arena: a run reserves it), or None
    shared: list = field(default_factory=list)      # the reuse.Entry objects of its kernels (held: reuse.py)


@dataclass(eq=False)
class Planning:
    """One plan in the making. Each stage reads what earlier stages left here and adds its part."""
    graph: Graph                # the graph at this plan's input shapes (never written)
    keep_all: bool              # every tensor wanted (verify): nothing fused or bound away
    settings: Settings          # the session's; stage `threads` may lower them for this plan
    stored: dict                # tensor -> (int8 grid, zero) the file stores it on (int8_store.stored_grids)
    raw: set                    # (reader, tensor) pairs that read a stored tensor unrounded (int8_store.raw_reads)
    memory: object = None       # the session's Arenas (arenas.py), or None: buffers of the plan's own
    arena: object = None        # the arena taken when planning began (reserved for the caller of build)
    shared: list = field(default_factory=list)      # reuse.Entry objects its steps use
    vals: dict = field(default_factory=dict)        # shape inference's facts, by tensor
    nodes: list = field(default_factory=list)       # the ops to plan; fusion stages rewrite the list
    users: tuple | None = None      # (a node list, its readers of each tensor): match.users_of
    eager: bool = False         # shapes depend on run-time values: run op by op (Session._run_eager)
    known: dict = field(default_factory=dict)       # tensors computed at prepare (stage `constants`)
    names: list = field(default_factory=list)       # tensor of each slot
    index: dict = field(default_factory=dict)       # slot of each tensor
    steps: list = field(default_factory=list)
    grids: dict = field(default_factory=dict)       # tensor -> the int8 grid its values lie on
    placed: dict = field(default_factory=dict)      # slot -> (host slot, byte offset): concat_in_place
    slots: list = field(default_factory=list)
    fixed: set = field(default_factory=set)         # slots holding the same array every run
    buffers: list = field(default_factory=list)     # the memory pool
    pool_bytes: int = 0
    calls: list = field(default_factory=list)
    ran: list = field(default_factory=list)
    made: tuple | None = None       # (the session's last plan's fused nodes, this plan's) by key: match.made_node

    def slot(self, name: str) -> int:
        if name not in self.index:
            self.index[name] = len(self.names)
            self.names.append(name)
        return self.index[name]

    def plan(self) -> Plan:
        g = self.graph
        dtypes = {n: np.dtype(g.tensors[n].dtype) for n in g.inputs}
        if self.eager:
            return Plan([], [], {n: 0 for n in g.inputs}, dtypes, {}, [], 0, {n: g.tensors[n].shape for n in g.inputs},
                        None)
        plan = Plan(self.steps, self.slots, {n: self.index[n] for n in g.inputs}, dtypes,
                    {n: self.index[n] for n in g.outputs}, self.names, self.pool_bytes,
                    {n: self.vals[n].shape for n in self.names if n in self.vals}, self.calls, self.ran, self.settings,
                    arena=self.arena, shared=self.shared)
        return plan
