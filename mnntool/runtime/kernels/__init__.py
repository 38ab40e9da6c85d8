"""Kernel registry: op name -> factory that, at prepare time, returns the function that runs the op.

A factory gets the node, what shape inference knows of its inputs and outputs, and the session's
`Settings` (its thread count: nothing reads a process-wide one), does the one-time
work (weight packing, index tables) and returns a Kernel. A kernel either writes into output
buffers that the planner owns (`writes_out`), or returns arrays (views, tiny shape tensors).
"""
from __future__ import annotations

import mmap
import threading
import weakref
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ...registry import registrar
from .. import host_tuning
from .compile.jit import Bound, JitFunction, compiled_entry

KERNELS: dict[str, Callable] = {}
# kernels of steps the planner makes from several ops (runtime/fusion.py): no op of the file has them
PLAN_ONLY: dict[str, Callable] = {}


@dataclass
class Kernel:
    fn: Callable
    writes_out: bool = False   # fn(inputs, outputs) fills preallocated outputs; else fn(inputs) -> outputs
    out_grid: tuple | None = None   # the int8 grid (grid.grid_of) the first output is rounded to, if any
    # fn(inputs) -> outputs that are views of its inputs fixed by shapes alone (reshapes, splits): the
    # planner calls it once where its inputs sit in the same buffers every run, and drops the step
    view: bool = False


kernel = registrar(KERNELS)


# Handing a parallel loop to OpenMP's workers has a fixed cost (about 50 us per loop, measured when they
# slept between kernels; they now spin through a run, threadpool.py, and the bound was not re-tuned), so a
# kernel with less than ~100 us of single-thread work runs its serial twin: MobileNetV2 has ~70 per run.
PARALLEL_MIN_WORK = 250_000      # element operations: the default; the host's own is measured (host_tuning)


def serial(fn: JitFunction) -> JitFunction:
    """The same kernel compiled without `parallel` (prange runs as range), cached on its own
    (JitFunction.serial)."""
    return fn.serial()


# At one thread a parallel kernel still enters OpenMP's region (~0.5 us a call: 0.85 against 0.38 us
# for a 256-float add); below this much work that is a share worth saving, so the twin runs. Not above:
# some twins are slower than their parallel kernel on large work (DenseNet-121 42 -> 68 ms with twins
# everywhere at one thread).
SERIAL_AT_ONE_MAX_WORK = 16_384


def sized(fn: JitFunction, work: int, threads: int):
    """The code to call for `fn` (a parallel kernel) at `threads`: at one thread a `Bound` kernel (the
    ahead-of-time library's, else the serial twin for tiny work, SERIAL_AT_ONE_MAX_WORK, or `fn`);
    above, `fn` when `work` pays for waking the threads, else its serial twin (Bound too); near the host's
    threshold a step_timing.Timed of both, which keeps the one its first calls found faster."""
    if threads <= 1:
        return Bound(serial(fn) if work < SERIAL_AT_ONE_MAX_WORK else fn)
    # the serial twin is the same code at any thread count: the library's, where it has it; near the
    # threshold the step times both and keeps the faster (step_timing)
    from .step_timing import Timed, one_thread_form, timed
    threshold = host_tuning.parallel_min_work(threads)
    if timed(work, threshold):
        par = fn.dispatcher()
        return Timed(par, one_thread_form(fn, par, Bound(serial(fn)), threads), 0 if work >= threshold else 1)
    return fn.dispatcher() if work >= threshold else Bound(serial(fn))


def direct(fn, *example):
    """`fn`'s compiled code for the argument types of `example`, called without a dispatcher: Numba's
    type resolution costs ~0.5-0.8 us a call (11 arguments), more than the arithmetic of a tiny
    transformer's linear layer (16 x 64 x 64: 2.04 -> 1.22 us). Only for calls whose every argument
    type prepare fixes: the compiled code reads an argument as the type it was compiled for. fn: a
    `sized` result, or a kernel (a parallel one runs at the session's thread count)."""
    if isinstance(fn, JitFunction):
        fn = Bound(fn) if not fn.targetoptions.get("parallel") else fn.dispatcher()
    from .step_timing import OneThread, Timed
    if isinstance(fn, (Timed, OneThread)):
        return fn.map(lambda f: direct(f, *example))
    if isinstance(fn, Bound):
        return fn.bind(example, compiled=True)
    return compiled_entry(fn, example)


CACHE_LINE = 64
MAPPED_FROM = 1 << 20      # bytes: aligned_empty maps buffers this large (page-aligned) rather than malloc them


def aligned_empty(count: int, dtype=np.float32) -> np.ndarray:
    """A flat array of `count` elements starting on a cache line (NumPy's own start 16 bytes into one, so
    every zmm access of a kernel would straddle two lines: the 16->96 pointwise layer at 112x112 ran
    0.61 ms on such buffers, 0.55 ms aligned)."""
    dtype = np.dtype(dtype)
    if count * dtype.itemsize >= MAPPED_FROM:
        # pages of its own, given back to the system when the array goes: large buffers from malloc's heap
        # (plan arenas, padded planes of each new input shape) left holes there that kept the process
        # growing over thousands of shapes (a text detector: +72 MB over 300 shapes, flat this way)
        return np.frombuffer(mmap.mmap(-1, count * dtype.itemsize), np.uint8).view(dtype)
    raw = np.empty(count * dtype.itemsize + CACHE_LINE, np.uint8)
    start = -raw.ctypes.data % CACHE_LINE
    return raw[start:start + count * dtype.itemsize].view(dtype)


def aligned_copy(a: np.ndarray) -> np.ndarray:
    """`a`, C-contiguous, in an array of the same shape that starts on a cache line."""
    out = aligned_empty(a.size, a.dtype).reshape(a.shape)
    out[...] = a
    return out


def aligned_lanes(rows: np.ndarray) -> np.ndarray:
    """(n, m) -> float32 (ceil(n/16), m, 16) on a cache line, rows 16 at a time side by side in a vector's
    lanes (zeros past n): the weights of the kernels with outputs or channels in the lanes (micro.matvec_lanes,
    micro.depthwise_lanes), one aligned zmm load per column."""
    n, m = rows.shape
    nb = -(-n // 16)
    padded = np.zeros((nb * 16, m), np.float32)
    padded[:n] = rows
    out = aligned_empty(nb * m * 16).reshape(nb, m, 16)
    out[:] = padded.reshape(nb, 16, m).transpose(0, 2, 1)
    return out


_SCRATCH = threading.local()


def scratch(name: str, shape: tuple) -> np.ndarray:
    """A float32 work buffer (contents undefined) shared by every kernel on this thread that asks for
    `name`: one Winograd buffer for all layers stays in cache, where one per layer would be cold. Ask
    at run time, not at prepare: the buffer grows when a larger layer asks."""
    size = 1
    for d in shape:
        size *= d
    buf = _SCRATCH.__dict__.get(name)
    if buf is None or buf.size < size:
        buf = _SCRATCH.__dict__[name] = aligned_empty(size)
    return buf[:size].reshape(shape)


class Scratch:
    """A kernel's handle on `scratch(name, shape)`, asked for at every run but rebuilt only when the
    shared buffer changed (another thread, a larger layer): ~0.2 us a call against ~1.5."""

    def __init__(self, name: str, shape: tuple):
        self.name, self.shape, self.cached = name, tuple(shape), (None, None)

    def __call__(self) -> np.ndarray:
        base, view = self.cached       # one read: another thread may replace the pair meanwhile
        if base is None or _SCRATCH.__dict__.get(self.name) is not base:
            view = scratch(self.name, self.shape)
            self.cached = (_SCRATCH.__dict__[self.name], view)
        return view


# keys of the SharedZeros objects alive (in some plan's kernels) -> how many: a thread's table keeps
# buffers of these keys only. Without it every new input shape left its padded planes behind for good
# (an open-shape model grew ~0.5 MB a shape: benchmarks/soak.py).
_LIVE_ZEROS: dict = {}
_LIVE_LOCK = threading.Lock()
SPARE_ZEROS = 8      # dead SharedZeros buffers a thread keeps for new geometries
# Past this many bytes of SharedZeros buffers on a thread, a new geometry takes over the buffer of a key no call
# of the current run used (a plan of another shape, kept by its session): new pages fault every 4 KB on a new
# shape's first run (~3 us each on a VM: a text detector's stride-2 stem at 800 px, ~3,500 faults), a warm
# buffer is re-zeroed (~0.06 ms a MB); that key's next call takes a buffer again
ZEROS_BUDGET = 64 << 20


def next_run() -> None:
    """A run starts on this thread (Session._run_plan): SharedZeros counts which keys this run used."""
    _SCRATCH.run = getattr(_SCRATCH, "run", 0) + 1


def _release_zeros(key) -> None:
    with _LIVE_LOCK:
        n = _LIVE_ZEROS.get(key, 0) - 1
        if n > 0:
            _LIVE_ZEROS[key] = n
        else:
            _LIVE_ZEROS.pop(key, None)


def _within_budget(table: dict, flat: dict, spare: list, need: int, used: dict, run: int) -> None:
    """Drops this thread's zero buffers, the largest first, until they and `need` more floats fit
    ZEROS_BUDGET: dead keys' spares first, then the buffers of keys the current run has not used (plans of
    other shapes; such a key's next call maps a new one). A take-over needs an idle buffer at least as large
    as the new geometry's; without this, every larger geometry mapped a new buffer past the budget (a text
    detector held ~120 MB of planes after 300 shapes against 64). Buffers of the current run stay: a run
    needing more than the budget holds what it needs, and no more."""
    total = need + sum(b.size for b in flat.values()) + sum(b.size for b in spare)
    if 4 * total <= ZEROS_BUDGET:
        return
    spare.sort(key=lambda b: b.size)
    while spare:
        total -= spare.pop().size
        if 4 * total <= ZEROS_BUDGET:
            return
    for k in sorted((k for k in flat if used.get(k, -1) != run), key=lambda k: -flat[k].size):
        total -= flat.pop(k).size
        table.pop(k, None)
        used.pop(k, None)
        if 4 * total <= ZEROS_BUDGET:
            return


class SharedZeros:
    """A zero-filled float32 buffer shared on this thread by every kernel that asks with the same key:
    for buffers whose writers leave the same part zero (a padding border) and rewrite the rest at every
    call, so convolutions of one geometry share their padded input planes, kept in cache, where one
    per layer was cold at every run. The key must fix everything that decides what is written.

    Bound: a thread holds buffers only for keys some live plan's kernels use (those of plans a session
    dropped go at the thread's next new key), so at most one buffer per geometry of the plans kept."""

    def __init__(self, key: tuple, shape: tuple):
        self.key, self.shape = ("zeros",) + tuple(key) + tuple(shape), tuple(shape)
        with _LIVE_LOCK:
            _LIVE_ZEROS[self.key] = _LIVE_ZEROS.get(self.key, 0) + 1
        weakref.finalize(self, _release_zeros, self.key)

    def __call__(self) -> np.ndarray:
        table = _SCRATCH.__dict__.setdefault("zeros", {})
        buf = table.get(self.key)
        _SCRATCH.__dict__.setdefault("zeros_used", {})[self.key] = _SCRATCH.__dict__.get("run", 0)
        if buf is None:
            with _LIVE_LOCK:
                dead = [k for k in table if k not in _LIVE_ZEROS]
            # a dead key's buffer serves the next new geometry, zeroed again: its pages are warm, where a
            # new one faults every 4 KB on the new shape's first run (a text detector's 3-channel 640 px
            # stem: ~1,700 faults, 4 ms); the last SPARE_ZEROS kept (runtime/plan/arenas.py does the same
            # for the plans' own buffers)
            flat, spare = _SCRATCH.__dict__.setdefault("zeros_flat", {}), _SCRATCH.__dict__.setdefault("spare", [])
            for k in dead:
                del table[k]
                spare.append(flat.pop(k))
                _SCRATCH.__dict__["zeros_used"].pop(k, None)
            n = 1
            for d in self.shape:
                n *= d
            fits = [b for b in spare if n <= b.size <= 2 * n + 65536]
            used, run = _SCRATCH.__dict__["zeros_used"], _SCRATCH.__dict__.get("run", 0)
            if not fits and 4 * (n + sum(b.size for b in list(flat.values()) + spare)) > ZEROS_BUDGET:
                idle = [k for k, b in flat.items() if b.size >= n and used.get(k, -1) != run]
                if idle:        # (that key's next call takes another buffer)
                    k = min(idle, key=lambda k: flat[k].size)
                    del table[k]
                    fits = [flat.pop(k)]
                    spare.append(fits[0])
            whole = min(fits, key=lambda b: b.size) if fits else None
            spare[:] = [b for b in spare if b is not whole][-SPARE_ZEROS:]
            _within_budget(table, flat, spare, n if whole is None else whole.size, used, run)
            if whole is None:
                whole = aligned_empty(n)
            flat[self.key] = whole
            buf = table[self.key] = whole[:n].reshape(self.shape)
            if fits or n * 4 < MAPPED_FROM:     # (a new mapping reads as zeros already)
                buf[...] = 0
        return buf


def by_definition(node) -> Kernel:
    """The op's own definition (ir/ops) as its kernel: numpy, for the ops and variants (integer types,
    run-time operands) that no fast kernel covers."""
    from ...errors import MnnToolError
    from ...ir.ops import REGISTRY
    from .micro.epilogue import POST
    opdef = REGISTRY.get(node.op)
    if opdef is None:
        raise MnnToolError(f"op {node.op} ('{node.name}') is not supported by the runtime")
    post = node.param.get(POST)
    if post is None:
        return Kernel(lambda i: opdef.evaluate(node, i), False)

    def then_post(inputs):      # a convolution the planner gave an activation (runtime/fusion.py)
        from .micro.activation_ir import post_flat
        y = np.array(opdef.evaluate(node, inputs)[0], np.float32)
        post_flat(y.reshape(-1), int(post[0]), np.float32(post[1]), np.float32(post[2]))
        return [y]
    return Kernel(then_post, False)


def returns(fn) -> Kernel:
    return Kernel(fn, False)


def writes(fn) -> Kernel:
    return Kernel(fn, True)


def views(fn) -> Kernel:
    return Kernel(fn, False, view=True)


from .ops import attention, control, conv, elementwise, matmul, norm, pool, pool_mixer, resize, scale, tensor, token_depthwise  # noqa: E402,F401  (registration)
from . import thread_probe  # noqa: E402

host_tuning.use_probe(thread_probe.measure)     # the thresholds' measurement: its kernels are these
