"""prepare (shapes, kernels, memory plan, weight packing) once per input shape; execute many times without
planning. How a plan is made is runtime/plan: a list of named stages. This module keeps the plans (one
or more per input shape, at most MAX_PLANS shapes), lends one to each run, and runs it.
"""
from __future__ import annotations

import gc
import threading
import time
from contextlib import contextmanager
from dataclasses import replace
from dataclasses import replace as copy_info

import numpy as np

from ..errors import InvalidModel, MnnToolError
from ..ir.graph import Graph
from ..ir.ops import Val
from ..ir.shape_inference import infer_node
from . import announce_first_compile
from .kernels import denormals, next_run
from .kernels.compile import aot
from .kernels.weight_cache import Parts, parts_of
from .kernels.ops.control import run_bodies_in, shape_free
from .plan import Plan, Planning, Step, build, check_off
from .plan.int8_store import RAW, raw_reads, rounding, stored_grids, stored_on
from .plan.kernels import generic_kernel, kernel_for
from .plan.arenas import Arenas
from .plan.shapes import check_size
from .plan.threads import ONE_THREAD_BELOW_FLOPS
from .settings import Settings

__all__ = ["Session", "Plan", "Step", "RAW", "ONE_THREAD_BELOW_FLOPS", "check_input_shape",
           "generic_kernel", "kernel_for", "raw_reads", "stored_grids"]


def _one_line(e: Exception, limit: int = 200) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[:limit] + "..."


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


SMALL_OPERAND = 1 << 12     # elements: run-time operands up to this size are passed to factories as values
MAX_PLANS = 8               # input-shape sets a session keeps plans for
# Thread safety: a plan's buffers (its memory pool, its kernels' work arrays) serve one run at a time, so
# a run checks a plan out of its shape's idle list and back in after; a run that finds every plan of its
# shape busy (another thread is in it) prepares one more. Plans kept per shape: at most this many idle
# ones (so at most MAX_PLANS x MAX_IDLE_PER_SHAPE in all, beside those of runs in progress).
MAX_IDLE_PER_SHAPE = 16
MAX_DYNAMIC = 20000         # kernels an eager plan caches (cleared when full; they are rebuilt)
_PREPARE = threading.RLock()    # one prepare at a time in the process: kernel factories compile and load lazily
_CHECKED_COMPILED: list = []    # whether this process looked for compiled kernels yet (a walk of the cache)


BUILD_GEN0 = 100_000     # allocations between the cycle collector's young passes while a plan is built


@contextmanager
def _collector_spaced():
    """Python's cycle collector's young passes spaced to one per BUILD_GEN0 allocations while a plan is built
    (under _PREPARE: one build at a time), its thresholds as they were after, also when the build fails. A
    plan is thousands of new containers (Vals, Steps, kernels' closures, dicts) that all live on: at the usual
    700 their young passes find nothing to collect, and each counts towards the next older pass, so every
    few plans a full pass walks the whole process (EfficientNet-B0, thread CPU of the first run at a new shape
    over the steady run's, median of 45 shapes each, in turns: 2.33x as it was, 2.18x with the collector
    off while planning, 2.20x spaced so). Spaced, not off: a build that compiles kernels (Numba: much cyclic garbage)
    still has it collected. A collector already spaced as far (or off: threshold 0) is left as it is. After a
    build that succeeds, what it made goes to the oldest generation (_promote: PROMOTE_PLANS)."""
    was = gc.get_threshold()
    if was[0] == 0 or was[0] >= BUILD_GEN0:
        yield
        if was[0] and PROMOTE_PLANS:
            _promote()
        return
    gc.set_threshold(BUILD_GEN0, *was[1:])
    try:
        yield
        if PROMOTE_PLANS:
            _promote()
    finally:
        gc.set_threshold(*was)


# A new plan's objects (~2,200 containers on EfficientNet-B0: steps, closures, kernels) live as long as the plan,
# and a plan goes by reference counting (no cycles: a session's evicted plans leave the collector nothing), yet
# each was walked by a young pass right after the build and again by each middle-generation pass over ten plans'
# worth (thread CPU in the collector over 110 new shapes, EfficientNet-B0 128-256 px, AMD EPYC: 0.52 + 0.58 ms a
# shape, ~10% of a run; 0 so). Moved to the oldest generation at once they are walked only by full passes. What
# else is in the younger two then moves too (the objects made since the last middle pass, the build's included):
# cyclic garbage among them waits for a full pass (RSS over 2,000 new shapes: +7.4 MB from shape 20 so, +8.7 MB
# without; tracked objects flat).
PROMOTE_PLANS = True


def _promote() -> None:
    """Every object the collector tracks into its oldest generation, unwalked (freeze, then unfreeze: the
    frozen objects join the oldest generation), the young count reset. Not where the process froze objects
    of its own (a pre-fork server's gc.freeze() keeps them out of every pass for copy-on-write): unfreeze would
    hand those back to the collector."""
    if gc.get_freeze_count():
        return
    gc.freeze()
    gc.unfreeze()


class Session:
    def __init__(self, graph: Graph, threads: int | None = None, off=None):
        """`off`: optional planning stages to skip (runtime/plan; None: those MNNTOOL_PLAN_OFF names)."""
        self.graph = graph
        # read-only constants (an ONNX initializer's view of its protobuf) become writable copies of the same
        # values: a kernel reading one in place would otherwise see another argument type than for a .mnn's
        # weights, one the ahead-of-time kernel library does not hold (kernels/aot.py)
        for name, value in graph.constants.items():
            if isinstance(value, np.ndarray) and not value.flags.writeable:
                graph.constants[name] = value.copy()
        self.settings = Settings.of(threads, off)
        check_off(self.settings.off)
        self._arenas = Arenas()       # plan memory, shared by the plans of every shape (runtime/plan/arenas.py)
        self._parts = Parts()         # the kernels' shape-free parts, kept across shapes (kernels/weight_cache.py)
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
        """The graph with these input shapes, its inputs' tensor facts copied: prepare never writes into
        the graph it was given (planning reads the other tensors' shapes from shape inference's Vals)."""
        tensors = dict(self.graph.tensors)
        for name in self.graph.inputs:
            if name in tensors:
                tensors[name] = copy_info(tensors[name])
        g = replace(self.graph, tensors=tensors)
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
            self._arenas.release(plan.arena)       # not run now: a run reserves it (_checkout)
            plan = self._remember(key, plan)
        self.plan, self._plan_key = plan, key
        return plan

    def _build(self, g: Graph, keep_all: bool) -> Plan:
        with _PREPARE, _collector_spaced():
            return self._build_locked(g, keep_all)

    def _build_locked(self, g: Graph, keep_all: bool) -> Plan:
        """A new plan of the shaped graph `g`: its own kernels, its buffers in an arena reserved for the
        caller (the caller releases it)."""
        if not _CHECKED_COMPILED and (self.settings.threads > 1 or aot.library() is None):
            _CHECKED_COMPILED.append(True)      # once a process: the walk of the cache costs ~0.3 ms a plan
            announce_first_compile()
        p = Planning(g, keep_all, self.settings, self._stored, self._raw, self._arenas)
        try:
            with parts_of(self._parts):
                return build(p)
        except BaseException:
            self._arenas.release(p.arena)      # a plan that failed after taking an arena holds it no more
            raise

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
            idle = self._idle.get(key) or ()
            for k in range(len(idle) - 1, -1, -1):
                # a plan whose arena another run (of another shape) holds waits; another plan serves
                if self._arenas.reserve(idle[k].arena):
                    plan = idle.pop(k)
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
        self._arenas.release(plan.arena)
        with self._lock:
            idle = self._idle.get(key)
            if idle is not None and len(idle) < MAX_IDLE_PER_SHAPE and not any(p is plan for p in idle):
                idle.append(plan)

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
                ins = [stored_on(Val(x.shape, str(x.dtype), x if sm else None),
                                  None if (node.name, i) in self._raw else self._stored.get(i))
                       if x is not None else Val(None) for x, sm, i in zip(xs, small, node.inputs)]
                outs = [stored_on(v, None if o in self._raw_tensors else self._stored.get(o))
                        for v, o in zip(infer_node(node, ins), node.outputs)]
                for name, v in zip(node.outputs, outs):
                    check_size(name, v)
                if not shape_free(node.op) and any(v.shape is None or not all(isinstance(d, int) for d in v.shape)
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
                        env[name] = rounding(grid, self.settings.threads, zero).fn([env[name]])[0]
        names = [n for n in env if not n.endswith(RAW)] if keep_all else g.outputs
        return {n: np.array(env[n]) for n in names if n in env}

    def run(self, feeds: dict[str, np.ndarray], keep_all: bool = False, profile: list | None = None) -> dict:
        """Outputs by name (copies); every tensor when keep_all; per-step seconds appended to `profile`.

        Safe to call from any number of threads at once: each run has a plan (buffers, kernel work
        arrays) of its own for its duration, and gives the answer it would give alone."""
        key, plan = self._checkout(feeds, keep_all)
        flushed = denormals.enter((plan.settings or self.settings).threads)
        try:
            return self._run_plan(plan, feeds, keep_all, profile)
        finally:
            denormals.leave(flushed)
            self._checkin(key, plan)

    def _run_plan(self, plan: Plan, feeds, keep_all: bool, profile) -> dict:
        (plan.settings or self.settings).apply()
        next_run()      # (SharedZeros: which padded planes this run uses)
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


run_bodies_in(Session)    # control flow's bodies run in sessions (the kernels may not import this module)
