"""Denormal floats flushed to zero in the threads that run a session (x86 MXCSR: FTZ and DAZ).

An Intel core takes a microcode assist, ~100+ cycles, for every instruction that reads or makes a denormal
float; an AMD Zen core does not. Sigmoid gates of large negative inputs are denormal (sigmoid(-90) ~ 8e-40),
so an EfficientNet's squeeze-excite products hold thousands of them, and the convolution that reads them
ran 8x slower on a 16-core Xeon than on an AMD EPYC (EfficientNetV2-rw-t at 1 thread 56.9 -> 40.2 ms with
denormals flushed, 41.4 -> 24.1 ms at 4 threads, its outputs unchanged; 14 models: no other change beyond
noise but MobileNetV4 1.10x; tmp_dev/xp/ftz.py). A denormal is below 1.2e-38: as zero, no output moves
by more than that times the weights it meets.

The calling thread's two bits are set for the run and restored after it (a user's NumPy code between runs
keeps IEEE behaviour). Numba's worker threads are set once per process, for as many threads as a session
asked for: they run only parallel kernels (a user's own Numba parallel code in the same process runs with
them flushed too). MNNTOOL_DENORMALS=keep leaves both alone (IEEE denormals, as onnxruntime's default).
"""
from __future__ import annotations

import os

import numpy as np

from .compile.jit import intrinsic, njit, numba, prange, types

FLUSH = 0x8040      # MXCSR bit 15 (FTZ: denormal results are zero) and bit 6 (DAZ: denormal inputs read as zero)


def enabled() -> bool:
    """Whether runs flush denormals (MNNTOOL_DENORMALS: flush, the default, or keep)."""
    value = os.environ.get("MNNTOOL_DENORMALS", "flush").strip().lower()
    if value not in ("flush", "keep"):
        from ...errors import MnnToolError
        raise MnnToolError(f"MNNTOOL_DENORMALS={value!r}: expected 'flush' or 'keep'")
    return value == "flush"


@intrinsic
def _update(typingctx, set_bits, clear_bits):
    """MXCSR = (MXCSR | set_bits) & ~clear_bits; the previous MXCSR."""
    sig = types.int64(types.int64, types.int64)

    def codegen(context, builder, sig, args):
        from llvmlite import ir
        i32, p8 = ir.IntType(32), ir.IntType(8).as_pointer()
        cell = builder.alloca(i32)
        at = builder.bitcast(cell, p8)
        fnty = ir.FunctionType(ir.VoidType(), [p8])
        store = builder.module.declare_intrinsic("llvm.x86.sse.stmxcsr", fnty=fnty)
        load = builder.module.declare_intrinsic("llvm.x86.sse.ldmxcsr", fnty=fnty)
        builder.call(store, [at])
        old = builder.load(cell)
        set32, clear32 = builder.trunc(args[0], i32), builder.trunc(args[1], i32)
        builder.store(builder.and_(builder.or_(old, set32), builder.not_(clear32)), cell)
        builder.call(load, [at])
        return builder.zext(old, ir.IntType(64))
    return sig, codegen


@njit(cache=True)
def mxcsr_update(set_bits, clear_bits):
    """This thread's MXCSR with set_bits set and clear_bits cleared; returns the previous value."""
    return _update(set_bits, clear_bits)


@njit(parallel=True, cache=True)
def _flush_all(n, seen):
    """Every iteration sets FLUSH in the thread that runs it and marks that thread in `seen`."""
    for i in prange(n):
        _update(FLUSH, 0)
        seen[numba.get_thread_id()] = 1


_workers_done = [0]


def _flush_workers(threads: int) -> None:
    """FLUSH in the first `threads` workers of Numba's pool, once per process (again when a session
    wants more): iterations until every one of them ran one (OpenMP's static schedule gives each at once)."""
    if threads <= _workers_done[0]:
        return
    seen = np.zeros(threads, np.uint8)
    for _ in range(8):
        _flush_all(64 * threads, seen)
        if seen.all():
            _workers_done[0] = threads
            return


_bound: list = [None]


def _swap(set_bits: int, clear_bits: int) -> int:
    """mxcsr_update through its compiled entry (the library's, else Numba's), bound at the first call: a run's
    enter and leave cost ~0.4 us together, against ~3.9 us through the dispatcher (EPYC)."""
    fn = _bound[0]
    if fn is None:
        from .compile.jit import Bound
        fn = _bound[0] = Bound(mxcsr_update).bind((FLUSH, 0), compiled=True)
    return fn(set_bits, clear_bits)


def enter(threads: int):
    """Before a run: FLUSH in this thread (and in the workers a run at `threads` uses); the bits to give
    back to `leave`, or None when nothing was changed."""
    if _ON[0] is None:
        _ON[0] = enabled()      # read at the first run: a mistyped value is that run's one-line error
    if not _ON[0]:
        return None
    old = _swap(FLUSH, 0)
    if threads > 1:
        _flush_workers(threads)
    return old & FLUSH


def leave(old) -> None:
    """After a run: this thread's two bits as `enter` found them."""
    if old is not None and old != FLUSH:
        _swap(old, FLUSH & ~old)


_ON: list = [None]


def report() -> str:
    """For `bench --json`: "flushed" or "kept"."""
    return "flushed" if (enabled() if _ON[0] is None else _ON[0]) else "kept"
