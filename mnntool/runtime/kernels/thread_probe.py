"""The measurement behind runtime/host_tuning: one parallel kernel against its serial twin, back to back
as a run calls them, at sizes from 2K to 1M elements (host_tuning's docstring says what is made of it).
Registered with host_tuning when the kernels load; it lives here because the kernels read the figures."""
from __future__ import annotations

import statistics
import time

from ..host_tuning import BOUNDS, GAIN, REPEATS, SIZES, WORK_PER_ELEMENT


def _best(fn, x, out, repeats: int = REPEATS) -> float:
    fn(x, out)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn(x, out)
        times.append(time.perf_counter() - t)
    return statistics.median(sorted(times)[:max(1, repeats // 2 + 1)])


def measure(threads: int) -> dict:
    """Times the parallel kernel against its serial twin at `threads`: the crossover and the timings."""
    import numba
    import numpy as np

    from .ops.elementwise import sigmoid_blocks
    par, ser = sigmoid_blocks.dispatcher(), sigmoid_blocks.serial().dispatcher()
    before = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    rows, found = [], None
    try:
        rng = np.random.default_rng(0)
        for n in SIZES:
            x = rng.standard_normal(n).astype(np.float32)
            out = np.empty_like(x)
            s = _best(lambda a, b: ser(a, b, False), x, out)
            p = _best(lambda a, b: par(a, b, False), x, out)
            rows.append({"elements": n, "serial_us": round(s * 1e6, 2), "parallel_us": round(p * 1e6, 2)})
            if p <= GAIN * s:
                # two sizes in a row: one lucky timing on a busy host does not set the threshold
                if found is not None:
                    break
                found = n
            else:
                found = None
    finally:
        numba.set_num_threads(before)
    work = (found or SIZES[-1] * 2) * WORK_PER_ELEMENT
    work = min(max(work, BOUNDS[0]), BOUNDS[1])
    return {"parallel_min_work": int(work), "source": "measured", "timings": rows,
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
