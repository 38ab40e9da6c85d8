"""Per step, the faster of a kernel's parallel form and its one-thread form, timed where the step runs.

The host's threshold (host_tuning.parallel_min_work) is measured on one compute-bound kernel; a step's
work units (kernels.sized) only estimate its one-thread time, and what threads gain differs by kernel
family and by where the inputs were written (another core's cache). On a 16-core Xeon at 4 threads some
steps ran slower than at one (issue 46: FastViT's 7x7 depthwise on 14x14 maps 175 -> 247 us, RexNet's
Concat 37 -> 75 us, EfficientViT's ReLU 23 -> 33 us, its small residual convolutions 56 -> 78 us), so a
step whose work is near the threshold times both forms on its first calls of a session, in turns, and
keeps the faster: "no step slower at more threads than at one", decided per step and per host.

Both forms give the same bits (a parallel kernel and its serial twin run the same loop body; the parallel
steps' kernels reproduce NumPy's operations), so the choice changes the time, never the output. Off under
MNNTOOL_STEP_TIMING=off, with MNNTOOL_HOST_TUNING=defaults (the test suite: plans that do not depend on
how loaded the machine is) and with MNNTOOL_PARALLEL_MIN_WORK set (a forced threshold is obeyed)."""
from __future__ import annotations

import os
import time

# work (in the threshold's units) from which a step is timed, and up to which: below WINDOW_LOW x the
# threshold the serial form runs untimed, from WINDOW_HIGH x it the parallel form (a convolution of
# ~100 us of one-thread work was 20-30x the threshold on both hosts; the steps that lost were under it)
WINDOW_LOW, WINDOW_HIGH = 0.25, 64
SAMPLES = 2         # timed calls of each form, after one untimed (cold) call of each
MARGIN = 0.95       # the parallel form must take at most this share of the serial form's best time


def enabled() -> bool:
    """Whether sessions time their steps' forms (see the module's docstring for what turns it off)."""
    if os.environ.get("MNNTOOL_STEP_TIMING", "on").strip().lower() in ("off", "0", "no", "false"):
        return False
    if os.environ.get("MNNTOOL_HOST_TUNING", "measure").strip().lower() in ("defaults", "default", "off", "0"):
        return False
    return not os.environ.get("MNNTOOL_PARALLEL_MIN_WORK", "").strip()


def timed(work: int, threshold: int) -> bool:
    """Whether a step of `work` times its two forms (near the host's `threshold`, with timing on)."""
    return WINDOW_LOW * threshold <= work < WINDOW_HIGH * threshold and enabled()


class Timed:
    """Calls `parallel` and `serial` (same arguments, same result) in turns on its first calls, one untimed
    call of each then SAMPLES timed ones, and from then on only the faster: parallel where its best time is
    at most MARGIN x the serial one's. The first call runs the form the threshold alone would run (`first`:
    0 parallel, 1 serial), so a Timed made for one call (a kernel sized at run time) runs what it ran
    before. For call sites that call it once per step (or with the same arguments' sizes every call): calls
    of different sizes would compare the two forms on different work."""

    __slots__ = ("parallel", "serial", "first", "calls", "best", "chosen", "kept")

    def __init__(self, parallel, serial, first: int = 0):
        self.parallel, self.serial, self.first = parallel, serial, first
        self.calls, self.best, self.chosen, self.kept = 0, [float("inf"), float("inf")], None, None

    def __repr__(self):
        state = {None: "timing", True: "parallel", False: "serial"}[self.chosen]
        return f"<timed {state}: {self.parallel!r} / {self.serial!r}>"

    def __call__(self, *args):
        kept = self.kept        # once chosen (~0.13 us a call over a bare call: the Python frame)
        if kept is not None:
            return kept(*args)
        n = self.calls
        self.calls = n + 1
        form = (n + self.first) & 1     # 0: parallel, 1: serial
        fn = self.serial if form else self.parallel
        if n < 2:
            return fn(*args)
        t = time.perf_counter()
        out = fn(*args)
        dt = time.perf_counter() - t
        if dt < self.best[form]:
            self.best[form] = dt
        if n + 1 >= 2 + 2 * SAMPLES:
            self.chosen = self.best[0] <= MARGIN * self.best[1]
            self.kept = self.parallel if self.chosen else self.serial
        return out

    def map(self, how):
        """The same choice over `how(parallel)` and `how(serial)` (kernels.direct: the compiled entries)."""
        return Timed(how(self.parallel), how(self.serial), self.first)


def choose(parallel, serial, work: int, threshold: int):
    """`parallel` or `serial` by the threshold alone, or a Timed of both where `work` is near it."""
    if timed(work, threshold):
        return Timed(parallel, serial, 0 if work >= threshold else 1)
    return parallel if work >= threshold else serial
