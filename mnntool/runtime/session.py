"""prepare (shapes, kernels, memory plan, weight packing) once; execute many times without planning.

The memory plan gives every tensor that a kernel writes a view into a shared pool of flat buffers,
reused once the tensor (and every view of it) is dead, so steady-state runs allocate only where a
kernel returns a fresh array (small shape tensors, gathers).
"""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field, replace
from dataclasses import replace as copy_info

import numpy as np

from ..errors import InvalidModel, MnnToolError
from ..ir.graph import Graph
from ..ir.ops import REGISTRY, Val
from ..ir.shape_inference import flops, infer_node, infer_shapes
from ..ir.validate import MAX_TENSOR_BYTES
from .kernels import KERNELS, PLAN_ONLY, Kernel, aligned_empty, aot, by_definition, sized
from .kernels.grid import grid_of, to_grid, to_grid_z
from . import announce_first_compile
from .fusion import MOVES, fused_nodes
from .kernels.control import SHAPE_FREE
from .concat_in_place import concat_layout, placements
from .kernels.program import Programs
from .settings import Settings


@dataclass
class Step:
    name: str
    op: str
    kernel: Kernel
    ins: list[int]
    outs: list[int]
    out_views: list = field(default_factory=list)
    concat: list | None = None      # a Concat's input slices in bytes (concat_in_place), else None
    elided: bool = False            # its output written in place by its inputs' producers


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


generic_kernel = by_definition


def kernel_for(node, ins, outs, settings: Settings) -> Kernel:
    """The fast kernel of the op where it has one that takes this case, else its definition's compute."""
    factory = KERNELS.get(node.op) or PLAN_ONLY.get(node.op)
    if factory is None:
        return generic_kernel(node)
    try:
        return factory(node, ins, outs, settings)
    except (ImportError, NameError, InvalidModel):     # mnntool's own defect, or a file that contradicts itself
        raise
    except MnnToolError:
        if node.op in REGISTRY:
            return generic_kernel(node)
        raise
    except Exception as e:
        if node.op in REGISTRY:
            return generic_kernel(node)
        raise MnnToolError(f"{node.op} '{node.name}': cannot prepare ({type(e).__name__}: {e})") from None


def _file_grid(g: Graph, t: str) -> dict | None:
    info = g.tensors.get(t) if t else None
    q = info.quant if info is not None else None
    return q if q and q.get("type", "DT_INT8") == "DT_INT8" and q.get("scale") else None


def stored_grids(g: Graph) -> dict[str, tuple]:
    """The int8 grid and zero point of each computed tensor the file gives one (a TensorQuantInfo of
    type int8), as (grid, zero).

    MNN stores such a tensor as int8 whoever computes it: its readers see its values rounded to the
    grid, not only the int8 convolution it was calibrated for (DBNet's FPN: an Add feeding both a
    convolution and an upsampling; the upsampling reads the rounded sum in MNN). The exceptions are
    raw_reads."""
    grids = {}
    for n in g.nodes:
        for o in n.outputs:
            q = _file_grid(g, o)
            if q:
                zero = float(q.get("zero", 0))
                grids[o] = (grid_of(float(q["scale"]), float(q.get("min", -128)) - zero,
                                    float(q.get("max", 127)) - zero), zero)
    return grids


ELEMENTWISE = ("BinaryOp", "UnaryOp", "Eltwise")


def raw_reads(g: Graph) -> set[tuple[str, str]]:
    """(reader, tensor) pairs where MNN's reader sees the tensor unrounded though the file gives it a
    grid: a float elementwise op (one with an operand the file gives no grid) reading a tensor MNN
    computed in float, which is an elementwise op of that kind (a SiLU's x * sigmoid(x)) or a
    convolution kept float (`quant --skip`, `--auto-skip`) whose own input has no grid. MNN keeps
    those results in float and rounds them only for its int8 readers. Measured end to end: a gate's
    product reading a SiLU's output agreed with MNN at cosine 0.99998 rounded, 1 - 1e-14 unrounded;
    EfficientNet-B0 with 43 layers kept float 0.99979 -> 0.99997 (a residual Add read a kept-float
    layer's output 0.023 off in a range of 0.16 where the grid clamped). A kept-float convolution
    whose input has a grid MNN rounds for every reader (tests/quant/test_int8_agreement.py)."""
    def float_elementwise(n) -> bool:
        return n.op in ELEMENTWISE and not all(_file_grid(g, i) for i in n.inputs)

    computed_float = set()
    for n in g.nodes:
        if float_elementwise(n) or (n.op in ("Convolution", "ConvolutionDepthwise") and "symmetricQuan"
                                    not in n.param and n.inputs and not _file_grid(g, n.inputs[0])):
            computed_float.update(o for o in n.outputs if _file_grid(g, o))
    return {(n.name, i) for n in g.nodes if float_elementwise(n) for i in n.inputs if i in computed_float}


def _stored_on(v: Val, stored: tuple | None) -> Val:
    """v with the int8 grid and zero point the file stores its tensor on, if any: a kernel whose
    arithmetic MNN does on int8 bytes (the average pooling) follows it."""
    return v if stored is None else replace(v, grid=stored[0], zero=stored[1])


def _rounding(grid: tuple, threads: int, zero: float = 0.0) -> Kernel:
    """A step that gives readers the tensor on its int8 grid (a copy: the tensor may be a view), cast as
    MNN casts it when the grid has a zero point (grid.mnn_cast)."""
    z = np.float32(zero)

    def run(inputs):
        x = np.ascontiguousarray(inputs[0], np.float32)
        out = np.empty_like(x)
        rows = x.reshape(-1, x.shape[-1]) if x.ndim else x.reshape(1, 1)
        if z:
            sized(to_grid_z, x.size, threads)(rows, grid, z, out.reshape(rows.shape))
        else:
            sized(to_grid, x.size, threads)(rows, grid, out.reshape(rows.shape))
        return [out]
    return Kernel(run, False, grid)


def _computed_at_prepare(node, vals: dict, stored: dict) -> bool:
    """Integer outputs whose values shape inference already has for this plan's shapes (Shape and
    the arithmetic on it: a Linear on open dims reshapes by Shape(x)[:-1] ++ [N]): constants of the
    plan, not steps (a dim-512 decoder's step ran 75 of them, 0.2 ms)."""
    if node.graphs or not node.outputs or any(o in stored for o in node.outputs):
        return False
    for o in node.outputs:
        v = vals.get(o)
        if not o or v is None or v.value is None or v.shape is None or np.dtype(v.dtype).kind not in "iub":
            return False
    return True


def _bind_views(step: Step, ins: tuple, slots: list, fixed: set) -> bool:
    """A view step whose inputs are in the same arrays every run gets its outputs once, here: a step
    costs ~1.5 us of Python, and half of a small transformer's ~110 steps are reshapes and splits. Not
    where the view would be a copy (a reshape of a strided input)."""
    if not all(i in fixed for i in ins):
        return False
    args = [slots[i] for i in ins]
    try:
        outs = step.kernel.fn(args)
    except Exception:       # noqa: BLE001 - a file whose shapes contradict: the step fails at run, named
        return False
    if not all(isinstance(o, np.ndarray) and o.size and np.may_share_memory(o, args[0]) for o in outs):
        return False
    for o, v in zip(step.outs, outs):
        slots[o] = v
    fixed.update(step.outs)
    return True


def _one_line(e: Exception, limit: int = 200) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[:limit] + "..."


def _check_size(name: str, v: Val) -> None:
    if v.shape is None or not all(isinstance(d, int) for d in v.shape):
        return
    size = 1
    for d in v.shape:
        size *= max(d, 0)
    nbytes = size * (np.dtype(v.dtype).itemsize if v.dtype else 4)
    if nbytes > MAX_TENSOR_BYTES:
        raise InvalidModel(f"tensor '{name}' would have shape {list(v.shape)} ({nbytes / 2**30:.1f} GB): "
                           "the model's shapes are corrupt or the input shape is far too large")


def check_input_shape(g: Graph, name: str, shape) -> None:
    """A shape given for an input: it must be an input, of the declared rank, agreeing with every
    declared (positive) dim; open dims take any size."""
    if name not in g.inputs:
        raise MnnToolError(f"input '{name}' is not an input of the model ({', '.join(g.inputs)})")
    declared = g.tensors[name].shape
    if declared is not None and len(declared) != len(shape):
        raise MnnToolError(f"input '{name}': rank {len(shape)} does not match the model's {list(declared)}")
    if declared is not None and any(isinstance(d, int) and d > 0 and d != s for d, s in zip(declared, shape)):
        raise MnnToolError(f"input '{name}': shape {list(shape)} does not match the model's {list(declared)}")


# ops whose output holds their input's values, so it lies on the input's int8 grid: a GELU reading an
# int8 Linear's output through its reshape runs by table (kernels.mnn_math)
SAME_VALUES = set(MOVES) | {"Identity", "Permute", "Transpose"}
RAW = " (before int8 store)"     # a stored tensor's name as its producer writes it, before rounding
SMALL_OPERAND = 1 << 12     # elements: run-time operands up to this size are passed to factories as values
MAX_PLANS = 8               # input-shape sets a session keeps plans for
# Thread safety: a plan's buffers (its memory pool, its kernels' work arrays) serve one run at a time, so
# a run checks a plan out of its shape's idle list and back in after; a run that finds every plan of its
# shape busy (another thread is in it) prepares one more. Plans kept per shape: at most this many idle
# ones (so at most MAX_PLANS x MAX_IDLE_PER_SHAPE in all, beside those of runs in progress).
MAX_IDLE_PER_SHAPE = 16
MAX_DYNAMIC = 20000         # kernels an eager plan caches (cleared when full; they are rebuilt)
_PREPARE = threading.RLock()    # one prepare at a time in the process: kernel factories compile and load lazily
# a plan of fewer floating-point operations is built for one thread, whatever the session's count: no
# kernel of it has the work to pay for a second (kernels.PARALLEL_MIN_WORK), and with workers spinning
# beside it the tiny transformers of benchmarks/zoo_speed.py (2-4 MFLOP, ~0.1 ms) ran 0.94-1.15x their
# 1-thread time at 2 threads
ONE_THREAD_BELOW_FLOPS = 16_000_000


class Session:
    def __init__(self, graph: Graph, threads: int | None = None):
        self.graph = graph
        # read-only constants (an ONNX initializer's view of its protobuf) become writable copies of the same
        # values: a kernel reading one in place would otherwise see another argument type than for a .mnn's
        # weights, one the ahead-of-time kernel library does not hold (kernels/aot.py)
        for name, value in graph.constants.items():
            if isinstance(value, np.ndarray) and not value.flags.writeable:
                graph.constants[name] = value.copy()
        self.settings = Settings.of(threads)
        self.plan: Plan | None = None       # the plan last prepared or run (a run uses its own, checked out)
        self._plan_key = None
        self._plans: dict = {}        # input-shape key -> its first plan (insertion order: oldest first)
        self._idle: dict = {}         # input-shape key -> plans of it no run is using
        self._lock = threading.Lock()   # guards _plans and _idle (held for a few dict operations)
        self._stored = stored_grids(graph)     # tensors every reader sees on their int8 grid: (grid, zero)
        self._raw = raw_reads(graph)            # ... but these readers unrounded
        self._raw_tensors = {t for _, t in self._raw}

    @property
    def input_names(self) -> list[str]:
        return list(self.graph.inputs)

    @property
    def output_names(self) -> list[str]:
        return list(self.graph.outputs)

    # ------------------------------------------------------------------------------------- prepare
    def _shaped(self, shapes: dict | None) -> Graph:
        """The graph with these input shapes, its tensor facts copied: prepare never writes into the
        graph it was given."""
        g = replace(self.graph, tensors={k: copy_info(v) for k, v in self.graph.tensors.items()})
        for name, shape in (shapes or {}).items():
            check_input_shape(g, name, shape)
            g.tensors[name].shape = tuple(int(s) for s in shape)
        for name in g.inputs:
            shape = g.tensors[name].shape
            if shape is None or not all(isinstance(d, int) and d >= 0 for d in shape):
                raise MnnToolError(f"input '{name}' has an unknown shape {shape}; give it with --input-shape")
        return g

    def prepare(self, shapes: dict[str, tuple] | None = None, keep_all: bool = False) -> Plan:
        g = self._shaped(shapes)
        key = (tuple((n, tuple(g.tensors[n].shape)) for n in g.inputs), keep_all)
        with self._lock:
            plan = self._plans.get(key)
        if plan is None:
            plan = self._build(g, keep_all)
            plan = self._remember(key, plan)
        self.plan, self._plan_key = plan, key
        return plan

    def _build(self, g: Graph, keep_all: bool) -> Plan:
        with _PREPARE:
            return self._build_locked(g, keep_all)

    def _build_locked(self, g: Graph, keep_all: bool) -> Plan:
        """A new plan of the shaped graph `g`: its own kernels and buffers, shared with no other plan."""
        if self.settings.threads > 1 or aot.library() is None:     # else the kernels are compiled already
            announce_first_compile()
        vals = infer_shapes(g)
        for name, v in vals.items():
            _check_size(name, v)
        if any(vals.get(o) is None or vals[o].shape is None or not all(isinstance(d, int) for d in vals[o].shape)
               for n in g.nodes for o in n.outputs if o):
            # an output shape depends on values known only at run time: run op by op (see _run_eager)
            return Plan([], [], {n: 0 for n in g.inputs}, {n: np.dtype(g.tensors[n].dtype) for n in g.inputs},
                        {}, [], 0, {n: g.tensors[n].shape for n in g.inputs}, None)
        settings = self.settings if flops(g, vals) >= ONE_THREAD_BELOW_FLOPS else Settings(1)
        names: list[str] = []
        index: dict[str, int] = {}

        def slot(name: str) -> int:
            if name not in index:
                index[name] = len(names)
                names.append(name)
            return index[name]
        for name in list(g.inputs) + list(g.constants):
            slot(name)
        steps: list[Step] = []
        grids: dict[str, float] = {}
        programs, run = Programs(g.constants), []   # run: consecutive small elementwise nodes (kernels.program)
        stored = self._stored

        def build(node, ins, outs):
            k = kernel_for(node, ins, outs, settings)
            if k.writes_out and any(v.shape is None or not all(isinstance(d, int) for d in v.shape) for v in outs):
                raise MnnToolError(f"{node.op} '{node.name}': output shape unknown at prepare time")
            if k.out_grid:
                grids[node.outputs[0]] = k.out_grid
            elif node.op in SAME_VALUES and ins and ins[0].grid is not None:
                grids[node.outputs[0]] = ins[0].grid
            # an output the file stores on a grid the kernel does not round to is written under its raw
            # name and rounded into its own slot by a step of its own (rounding in place could change
            # a tensor the output is a view of; rounding into the producer's slot made the next run's
            # rounding read the last run's result)
            rounded = [o for o in node.outputs if stored.get(o, (None,))[0] not in (None, grids.get(o))]
            for o in rounded:
                vals[o + RAW] = vals.get(o, Val(None))
            steps.append(Step(node.name, node.op, k, [slot(read_as(node, i)) if i else -1 for i in node.inputs],
                              [slot(o + RAW if o in rounded else o) for o in node.outputs],
                              concat=concat_layout(node, ins, outs) if node.op == "Concat" and k.writes_out and
                              not keep_all else None))
            for o in rounded:
                grids[o] = grid = stored[o][0]
                steps.append(Step(node.name + " (int8 store)", "Int8Store", _rounding(grid, settings.threads,
                                                                                stored[o][1]),
                                  [slot(o + RAW)], [slot(o)]))

        def read_as(node, i: str) -> str:
            """The unrounded version of a stored tensor for a reader in raw_reads."""
            return i + RAW if (node.name, i) in self._raw and i + RAW in index else i

        def emit(nodes, externals, outputs, k):
            name = nodes[0].name + (f" (+{len(nodes) - 1} ops)" if len(nodes) > 1 else "")
            steps.append(Step(name, "Program", k, [slot(i) for i in externals], [slot(o) for o in outputs]))

        def flush():
            if len(run) > 1:
                for item in run:
                    if programs.nodes and not programs.fits(item[0]):
                        emit(*programs.close())
                    programs.add(*item)
                emit(*programs.close())
            else:
                for item in run:
                    build(*item)
            run.clear()
        # keep_all (verify) wants every tensor: nothing fused away
        fused = g.nodes if keep_all else fused_nodes(g, vals, stored)
        known: dict[str, np.ndarray] = {}
        for node in fused:
            if _computed_at_prepare(node, vals, stored):
                for o in node.outputs:
                    known[o] = np.asarray(vals[o].value).astype(vals[o].dtype)
                    slot(o)
                continue
            ins = [replace(vals.get(i, Val(None)), grid=None if read_as(node, i) != i else grids.get(i))
                   for i in node.inputs]
            outs = [_stored_on(vals.get(o, Val(None)), stored.get(o)) for o in node.outputs]
            if programs.accepts(node, ins, outs) and not any(o in stored for o in node.outputs) and \
                    not any(read_as(node, i) != i for i in node.inputs):
                run.append((node, ins, outs))
                continue
            flush()
            build(node, ins, outs)
        flush()
        programs.finish()
        slots: list = [None] * (len(names) + 1)     # the last stays None: what an absent input (-1) reads
        for name, value in list(g.constants.items()) + list(known.items()):
            slots[index[name]] = value
        pool_bytes = self._plan_memory(steps, names, vals, [index[o] for o in g.outputs], keep_all)
        calls, ran = [], []
        fixed = {index[n] for n in list(g.constants) + list(known)}     # slots holding the same array every run
        for s in steps:
            ins = tuple(i if i >= 0 else len(names) for i in s.ins)
            if s.kernel.writes_out:     # its outputs are the same views every run: in their slots once
                for o, v in zip(s.outs, s.out_views):
                    slots[o] = v
                fixed.update(s.outs)
                if s.elided:
                    continue
            elif s.kernel.view and not keep_all and _bind_views(s, ins, slots, fixed):
                continue
            # a step whose inputs all sit in fixed slots gets its argument list once, not every run
            # (~0.3 us a step: a tiny transformer's 30 steps of 1-3 us)
            bound = [slots[i] for i in ins] if all(i in fixed for i in ins) else None
            calls.append((s.kernel.fn, ins, s.out_views if s.kernel.writes_out else None, s.outs, bound))
            ran.append(s)
        return Plan(steps, slots, {n: index[n] for n in g.inputs},
                    {n: np.dtype(g.tensors[n].dtype) for n in g.inputs}, {n: index[n] for n in g.outputs},
                    names, pool_bytes, {n: vals[n].shape for n in names if n in vals}, calls, ran, settings)

    def _remember(self, key, plan: Plan, idle: bool = True) -> Plan:
        """Keep `plan` as the plan of `key`, idle unless a run holds it (a run with these shapes uses it:
        without it the first run after prepare() prepared again); the plan kept, another thread's if it
        was first."""
        with self._lock:
            if key in self._plans:
                return self._plans[key]
            self._plans[key] = plan
            self._idle[key] = [plan] if idle else []
            while len(self._plans) > MAX_PLANS:
                old = next(iter(self._plans))
                del self._plans[old]
                self._idle.pop(old, None)
        return plan

    def _checkout(self, feeds, keep_all: bool):
        """(key, plan) for a run with these feeds: a plan no other run is using, prepared if none is."""
        key = (tuple((n, tuple(np.shape(feeds[n]))) for n in self.graph.inputs if n in feeds), keep_all)
        with self._lock:
            idle = self._idle.get(key)
            if idle:
                plan = idle.pop()
                self.plan, self._plan_key = plan, key
                return key, plan
            known = key in self._plans
        for name in self.graph.inputs:
            if name not in feeds:
                raise MnnToolError(f"missing input '{name}' (inputs: {', '.join(self.graph.inputs)})")
        g = self._shaped({n: tuple(np.shape(v)) for n, v in feeds.items()})
        plan = self._build(g, keep_all)
        if not known:
            self._remember(key, plan, idle=False)
        self.plan, self._plan_key = plan, key
        return key, plan

    def _checkin(self, key, plan: Plan) -> None:
        with self._lock:
            idle = self._idle.get(key)
            if idle is not None and len(idle) < MAX_IDLE_PER_SHAPE and not any(p is plan for p in idle):
                idle.append(plan)

    @staticmethod
    def _plan_memory(steps, names, vals, output_slots, keep_all) -> int:
        n_steps = len(steps)
        last = {}
        for k, s in enumerate(steps):
            for i in s.ins:
                last[i] = k
        for o in output_slots:
            last[o] = n_steps
        roots: dict[int, set] = {}
        buf_end: dict[int, int] = {}
        buf_size: list[int] = []
        free: list[int] = []
        views = []      # (step, out position, buffer id, shape, dtype, byte offset)

        def nbytes_of(slot):
            v = vals[names[slot]]
            return max(math.prod(int(d) for d in v.shape) * np.dtype(v.dtype).itemsize, 1)
        placed, elided = placements(steps, output_slots, nbytes_of)     # no Step.concat under keep_all
        for k in elided:
            steps[k].elided = True
        host_end: dict[int, int] = {}       # a Concat host's bytes live until its last part is read
        for t, (h, _) in placed.items():
            host_end[h] = max(host_end.get(h, 0), last.get(t, 0))
        host_buf: dict[int, int] = {}

        def allocate(nbytes, end):
            fits = [b for b in free if buf_size[b] >= nbytes]
            if fits:
                b = min(fits, key=lambda x: buf_size[x])
                free.remove(b)
            elif free:      # grow a free buffer: its start is still in cache, a new one is cold
                b = max(free, key=lambda x: buf_size[x])
                free.remove(b)
                buf_size[b] = nbytes
            else:
                b = len(buf_size)
                buf_size.append(nbytes)
            buf_end[b] = end
            return b
        for k, s in enumerate(steps):
            for pos, o in enumerate(s.outs):
                end = n_steps if keep_all else last.get(o, k)
                if s.kernel.writes_out:
                    v = vals[names[o]]
                    dtype = np.dtype(v.dtype)
                    if o in placed:
                        h, offset = placed[o]
                        if h not in host_buf:
                            host_buf[h] = allocate(nbytes_of(h), host_end[h])
                        b = host_buf[h]
                    else:
                        b, offset = allocate(nbytes_of(o), end), 0
                    roots[o] = {b}
                    views.append((k, pos, b, tuple(v.shape), dtype, offset))
                else:
                    roots[o] = set().union(*(roots.get(i, set()) for i in s.ins if i >= 0)) if s.ins else set()
                    for b in roots[o]:
                        buf_end[b] = max(buf_end[b], end)
            for b, end in list(buf_end.items()):
                if end <= k and b not in free:
                    free.append(b)
                    del buf_end[b]
        buffers = [aligned_empty(size, np.uint8) for size in buf_size]
        for s in steps:
            s.out_views = [None] * len(s.outs)
        for k, pos, b, shape, dtype, offset in views:
            count = math.prod(int(d) for d in shape)
            steps[k].out_views[pos] = buffers[b][offset:offset + count * dtype.itemsize].view(dtype).reshape(shape)
        return int(sum(buf_size))

    # ------------------------------------------------------------------------------------- execute
    def _feed(self, plan: Plan, feeds: dict[str, np.ndarray]) -> None:
        for name, k in plan.input_slots.items():
            if name not in feeds:
                raise MnnToolError(f"missing input '{name}' (inputs: {', '.join(plan.input_slots)})")
            x = np.asarray(feeds[name])
            if tuple(x.shape) != tuple(plan.shapes[name]):
                raise MnnToolError(f"input '{name}' has shape {list(x.shape)}, prepared for {list(plan.shapes[name])}")
            plan.slots[k] = np.asarray(x, dtype=plan.input_dtypes[name], order="C")   # ascontiguousarray makes 0-d 1-d

    def _run_eager(self, plan: Plan, feeds, keep_all: bool) -> dict:
        """Op by op with the values at hand: for graphs whose shapes depend on run-time values (a
        Reshape to a computed shape, NonZero). Kernels are cached by their operands' shapes and small
        values, so a repeated run builds nothing."""
        g = self.graph
        env = dict(g.constants)
        for name in g.inputs:
            env[name] = np.asarray(feeds[name], dtype=np.dtype(g.tensors[name].dtype), order="C")
        for k, node in enumerate(g.nodes):
            missing = [i for i in node.inputs if i and i not in env]
            if missing:
                raise InvalidModel(f"{node.op} '{node.name}' reads '{missing[0]}', which no earlier op produces")
            xs = [env.get(i + RAW, env[i]) if (node.name, i) in self._raw else env[i] if i else None
                  for i in node.inputs]
            small = [x is not None and x.size <= SMALL_OPERAND for x in xs]
            key = (k,) + tuple((x.shape, x.dtype.str, x.tobytes() if sm else None) if x is not None else None
                               for x, sm in zip(xs, small))
            built = plan.dynamic.get(key)
            if built is None:
                ins = [_stored_on(Val(x.shape, str(x.dtype), x if sm else None),
                                  None if (node.name, i) in self._raw else self._stored.get(i))
                       if x is not None else Val(None) for x, sm, i in zip(xs, small, node.inputs)]
                outs = [_stored_on(v, self._stored.get(o)) for v, o in zip(infer_node(node, ins), node.outputs)]
                for name, v in zip(node.outputs, outs):
                    _check_size(name, v)
                if node.op not in SHAPE_FREE and any(v.shape is None or not all(isinstance(d, int) for d in v.shape)
                                                     for v in outs):
                    built = (generic_kernel(node), outs)
                else:
                    built = (kernel_for(node, ins, outs, self.settings), outs)
                if len(plan.dynamic) >= MAX_DYNAMIC:
                    plan.dynamic.clear()
                plan.dynamic[key] = built
            kern, outs = built
            try:
                if kern.writes_out:
                    res = [np.empty(v.shape, np.dtype(v.dtype)) for v in outs]
                    kern.fn(xs, res)
                else:
                    res = kern.fn(xs)
            except MnnToolError:
                raise
            except Exception as e:
                raise MnnToolError(f"{node.op} '{node.name}' failed: {type(e).__name__}: {_one_line(e)}") from None
            for name, v in zip(node.outputs, res):
                if name:
                    env[name] = np.asarray(v)
                    grid, zero = self._stored.get(name, (None, 0.0))
                    if grid is not None and kern.out_grid != grid:
                        if name in self._raw_tensors:
                            env[name + RAW] = env[name]
                        env[name] = _rounding(grid, self.settings.threads, zero).fn([env[name]])[0]
        names = [n for n in env if not n.endswith(RAW)] if keep_all else g.outputs
        return {n: np.array(env[n]) for n in names if n in env}

    def run(self, feeds: dict[str, np.ndarray], keep_all: bool = False, profile: list | None = None) -> dict:
        """Outputs by name (copies); every tensor when keep_all; per-step seconds appended to `profile`.

        Safe to call from any number of threads at once: each run has a plan (buffers, kernel work
        arrays) of its own for its duration, and gives the answer it would give alone."""
        key, plan = self._checkout(feeds, keep_all)
        try:
            return self._run_plan(plan, feeds, keep_all, profile)
        finally:
            self._checkin(key, plan)

    def _run_plan(self, plan: Plan, feeds, keep_all: bool, profile) -> dict:
        (plan.settings or self.settings).apply()
        if plan.calls is None:
            return self._run_eager(plan, feeds, keep_all)
        self._feed(plan, feeds)
        slots = plan.slots
        timer = time.perf_counter
        fn = None
        try:
            for fn, ins, views, outs, bound in plan.calls:
                args = bound if bound is not None else [slots[i] for i in ins]
                t0 = timer() if profile is not None else 0.0
                if views is not None:
                    fn(args, views)
                else:
                    for o, v in zip(outs, fn(args)):
                        slots[o] = v
                if profile is not None:
                    profile.append(timer() - t0)
        except MnnToolError:
            raise
        except Exception as e:      # the loop variable names the step that failed (no cost while none does)
            step = next((s for s in plan.steps if s.kernel.fn is fn), None)
            where = f"{step.op} '{step.name}'" if step else "a step"
            raise MnnToolError(f"{where} failed: {type(e).__name__}: {_one_line(e)}") from None
        if keep_all:
            return {n: np.array(slots[i]) for i, n in enumerate(plan.names) if slots[i] is not None and not n.endswith(RAW)}
        return {n: np.array(slots[i]) for n, i in plan.output_slots.items()}

