"""Per step, the faster of a kernel's parallel form and its one-thread form, timed where the step runs.

The host's threshold (host_tuning.parallel_min_work) is measured on one compute-bound kernel; a step's
work units (kernels.sized) only estimate its one-thread time, and what threads gain differs by kernel
family and by where the inputs were written (another core's cache). On a 16-core Xeon at 4 threads some
steps ran slower than at one (issue 46: FastViT's 7x7 depthwise on 14x14 maps 175 -> 247 us, RexNet's
Concat 37 -> 75 us, EfficientViT's ReLU 23 -> 33 us, its small residual convolutions 56 -> 78 us), so a
step whose work is near the threshold times both forms on its first calls of a session, in turns, and
keeps the faster: "no step slower at more threads than at one", decided per step and per host.

Both forms give the same bits, so the choice changes the time, never the output: the parallel steps'
kernels reproduce NumPy's operations, and a parallel kernel and its serial twin run the same loop body in
IEEE arithmetic, except under fastmath, where LLVM may contract and vectorize the two builds differently
(GELU's erf_flat: 1 ulp apart on FastViT). A fastmath kernel's one-thread form is therefore its parallel
build run on the calling thread alone (`OneThread`: what a one-thread session runs for work this size, so
the same bits), unless its arithmetic is all in explicit LLVM IR (EXACT_FASTMATH: its fastmath covers
only copies; the twin saves the region's ~0.5 us). Off under
MNNTOOL_STEP_TIMING=off, with MNNTOOL_HOST_TUNING=defaults (the test suite: plans that do not depend on
how loaded the machine is) and with MNNTOOL_PARALLEL_MIN_WORK set (a forced threshold is obeyed)."""
from __future__ import annotations

import os
import time

import numpy as np

# work (in the threshold's units) from which a step is timed, and up to which: below WINDOW_LOW x the
# threshold the serial form runs untimed, from WINDOW_HIGH x it the parallel form. The units only estimate
# time, both ways: HRNet's 1x1 64->32 on 56x56 counts 401K (float_gemm: MACs / 16) for 201 us at one thread
# on the Xeon, and ran serial at 4 threads (203 us); the steps threads made slower were under 64x.
WINDOW_LOW, WINDOW_HIGH = 0.125, 64
SAMPLES = 2         # timed calls of each form (the first call untimed): settled after 5 calls, within
                    # `mnntool bench`'s 5 warm-up runs
MAX_CALLS = 32      # calls without SAMPLES of each form at the first call's shapes: keep the threshold's form
MARGIN = 0.95       # the parallel form must take at most this share of the serial form's best time


# fastmath kernels whose twin gives the same bits: their arithmetic is the IR micro-kernels', their own
# loops only copy (tests/runtime/test_parallel_splits.py checks conv_im2col's twin bit for bit)
EXACT_FASTMATH = frozenset({"micro.float_gemm.conv_im2col", "micro.float_gemm.phase_split"})


def exact_twin(fn) -> bool:
    """Whether kernel `fn` (a JitFunction) and its serial twin give the same bits."""
    return not fn.targetoptions.get("fastmath") or fn.name in EXACT_FASTMATH


class OneThread:
    """`fn` (a parallel kernel's dispatcher or compiled entry) run with Numba's count for the calling thread at
    1 for the call (the region does not wake the workers), then `threads` again: ~0.5 us a call over the
    kernel for the two settings."""

    __slots__ = ("fn", "threads", "set")

    def __init__(self, fn, threads: int):
        import numba
        self.fn, self.threads, self.set = fn, min(threads, numba.config.NUMBA_NUM_THREADS), None

    def __repr__(self):
        return f"<one thread: {self.fn!r}>"

    def __call__(self, *args):
        if self.set is None:
            # Numba's own setter less its checks (~0.25 against ~1 us a call), once its pool has started
            import numba
            numba.set_num_threads(self.threads)
            from numba.np.ufunc import parallel
            self.set = getattr(parallel, "_set_num_threads", None) or numba.set_num_threads
        self.set(1)
        try:
            return self.fn(*args)
        finally:
            self.set(self.threads)

    def map(self, how):
        return OneThread(how(self.fn), self.threads)


def one_thread_form(fn, dispatcher, serial, threads: int):
    """The one-thread form a Timed compares kernel `fn`'s parallel `dispatcher` against: its serial twin
    (`serial`) where the two builds give the same bits, else the parallel build on one thread."""
    return serial if exact_twin(fn) else OneThread(dispatcher, threads)


def enabled() -> bool:
    """Whether sessions time their steps' forms (see the module's docstring for what turns it off)."""
    if os.environ.get("MNNTOOL_STEP_TIMING", "on").strip().lower() in ("off", "0", "no", "false"):
        return False
    if os.environ.get("MNNTOOL_HOST_TUNING", "measure").strip().lower() in ("defaults", "default", "off", "0"):
        return False
    return not os.environ.get("MNNTOOL_PARALLEL_MIN_WORK", "").strip()


# no timing below this work: a one-thread session runs the serial twin there (kernels.SERIAL_AT_ONE_MAX_WORK),
# which a fastmath kernel's one-thread form (its parallel build) might not match bit for bit
MIN_WORK = 16_384


def timed(work: int, threshold: int) -> bool:
    """Whether a step of `work` times its two forms (near the host's `threshold`, with timing on)."""
    return max(MIN_WORK, WINDOW_LOW * threshold) <= work < WINDOW_HIGH * threshold and enabled()


class Timed:
    """Calls `parallel` and `serial` (same arguments, same result) in turns on its first calls, the first
    untimed, and from then on only the faster: parallel where its best time is at most
    MARGIN x the serial one's, once each form has SAMPLES timed calls of the first call's array shapes (a
    kernel called several times a step on pieces of other sizes, Winograd's last chunk of tile rows, is not
    compared on unequal work). The first call runs the form the threshold alone would run (`first`: 0
    parallel, 1 serial), so a Timed made for one call (a kernel sized at run time) runs what it ran before;
    past MAX_CALLS calls without enough samples (shapes that never repeat) it keeps that form."""

    __slots__ = ("parallel", "serial", "first", "calls", "best", "count", "key", "chosen", "kept")

    def __init__(self, parallel, serial, first: int = 0):
        self.parallel, self.serial, self.first = parallel, serial, first
        self.calls, self.best, self.count, self.key = 0, [float("inf"), float("inf")], [0, 0], None
        self.chosen, self.kept = None, None

    def __repr__(self):
        state = {None: "timing", True: "parallel", False: "serial"}[self.chosen]
        return f"<timed {state}: {self.parallel!r} / {self.serial!r}>"

    def _keep(self, parallel: bool) -> None:
        self.chosen = parallel
        self.kept = self.parallel if parallel else self.serial

    def __call__(self, *args):
        kept = self.kept        # once chosen (~0.13 us a call over a bare call: the Python frame)
        if kept is not None:
            return kept(*args)
        n = self.calls
        self.calls = n + 1
        form = (n + self.first) & 1     # 0: parallel, 1: serial
        fn = self.serial if form else self.parallel
        key = tuple(a.shape for a in args if type(a) is np.ndarray)
        if n == 0:      # cold (and the threshold's form): untimed; the other form's cold call is timed,
            self.key = key      # its second call is the sample that counts (the best of SAMPLES)
            return fn(*args)
        if key != self.key:
            out = fn(*args)
        else:
            t = time.perf_counter()
            out = fn(*args)
            dt = time.perf_counter() - t
            if dt < self.best[form]:
                self.best[form] = dt
            self.count[form] += 1
            if min(self.count) >= SAMPLES:
                self._keep(self.best[0] <= MARGIN * self.best[1])
                return out
        if n + 1 >= MAX_CALLS:
            self._keep(self.first == 0)
        return out

    def map(self, how):
        """The same choice over `how(parallel)` and `how(serial)` (kernels.direct: the compiled entries)."""
        return Timed(how(self.parallel), how(self.serial), self.first)


def choose(parallel, serial, work: int, threshold: int):
    """`parallel` or `serial` by the threshold alone, or a Timed of both where `work` is near it."""
    if timed(work, threshold):
        return Timed(parallel, serial, 0 if work >= threshold else 1)
    return parallel if work >= threshold else serial
