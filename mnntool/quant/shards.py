"""Work over local worker processes (--workers N) or a Ray cluster (--ray ADDRESS): calibration
(quant), the held-out evaluations (quant's report, --auto-skip), verify --calib and llm eval.

Two shapes of job:
- `merged(fn, samples, args, into)`: the samples are cut into contiguous chunks, each worker returns
  fn(chunk, *args), an object with `.merge(other)` and `.count` (calibration's ptq.Statistics:
  histograms and fixed-point sums), and the driver merges them as they finish. The merge is exact, so
  the result is the single process's, bit for bit, in any order.
- `split_map(pool, fn, items, *args)`: fn(chunk, *args) returns a list per item; the lists come back in
  item order (verify's per-sample sums, llm eval's per-window statistics).
This module knows nothing of what it runs (the caller passes its functions), so nothing here imports
the calibrator that imports it. Local workers start by spawning (a forked child would inherit the
parent's OpenMP and BLAS thread pools). Connecting to Ray, with its failures in one line, is cluster.py's.
"""
from __future__ import annotations

from contextlib import contextmanager

from ..errors import MnnToolError

CHUNKS_PER_WORKER = 4       # more chunks than workers: progress moves, and a slow chunk does not idle the rest


def _chunks(samples, count: int) -> list:
    try:
        n = len(samples)
        parts, rest = [], samples
        sizes = [n // count + (1 if k < n % count else 0) for k in range(count)]
        for size in sizes[:-1]:
            head, rest = rest.split(size)
            parts.append(head)
        parts.append(rest)
    except (NotImplementedError, AttributeError, TypeError):
        raise MnnToolError("--workers needs calibration data that can be split (a folder or a list of "
                           "samples; a custom CalibrationReader must implement split)") from None
    return [p for p in parts if len(p)]


class Pool:
    """Jobs run in parallel: local spawned processes (`ex`), or Ray tasks (`ray` the connected module)."""

    def __init__(self, workers: int, ex=None, ray_mod=None):
        self.workers, self.ex, self.ray = workers, ex, ray_mod
        self._tasks: dict = {}      # fn -> its Ray remote function (exported to the cluster once)

    def share(self, value):
        """`value` as a task argument sent once: in Ray's object store (a reference each task resolves),
        or as it is for local processes (pickled per job)."""
        return self.ray.put(value) if self.ray is not None else value

    def submit(self, fn, *args):
        """A handle on fn(*args) running (a Ray reference or a future)."""
        if self.ray is not None:
            if fn not in self._tasks:
                # SPREAD: the chunks go round the nodes from the start, instead of queueing on the driver's
                # node until Ray spills them over (small chunks then all ran on the head)
                self._tasks[fn] = self.ray.remote(num_cpus=1, scheduling_strategy="SPREAD")(fn)
            return self._tasks[fn].remote(*args)
        return self.ex.submit(fn, *args)

    def result(self, handle):
        return _ray_get(self.ray, handle) if self.ray is not None else handle.result()

    def as_completed(self, handles: list):
        """The results in the order they finish."""
        if self.ray is not None:
            pending = list(handles)
            while pending:
                done, pending = self.ray.wait(pending, num_returns=1)
                for ref in done:
                    yield _ray_get(self.ray, ref)
            return
        from concurrent.futures import as_completed
        for job in as_completed(handles):
            yield job.result()

    def map(self, fn, arglists: list) -> list:
        """[fn(*args) for args in arglists], run in parallel, results in the same order."""
        return [self.result(h) for h in [self.submit(fn, *args) for args in arglists]]


@contextmanager
def pool(workers: int, ray: str | None = None):
    """A Pool kept for a whole job (auto-skip evaluates many candidates on the held-out samples; verify
    compares many samples), or None for one process. With `ray`, as many tasks at once as --workers
    when given, else as the cluster has CPUs."""
    if ray is not None:
        from .cluster import connected, cpus
        with connected(ray) as mod:
            yield Pool(workers if workers > 1 else cpus(mod), ray_mod=mod)
        return
    if workers <= 1:
        yield None
        return
    from ..interrupts import process_pool
    with process_pool(workers) as ex:      # stopped at once on an interrupt
        yield Pool(workers, ex)


def merged(fn, samples, args: tuple, into, workers: int = 1, ray: str | None = None, progress=None):
    """`into` merged with fn(chunk, *args) of every chunk of the samples (CHUNKS_PER_WORKER a worker),
    run on `workers` local processes or, with `ray` an address, as Ray tasks (the args put in the
    object store once, not once per task). Each node of a cluster must have mnntool installed and see
    the sample files under the same paths. `progress(count)` after each chunk."""
    if ray is not None:
        with pool(workers, ray) as shards:
            return merge_on(shards, fn, samples, args, into, progress)
    from ..interrupts import process_pool
    chunks = _chunks(samples, workers * CHUNKS_PER_WORKER)
    with process_pool(min(workers, len(chunks)) or 1) as ex:     # stopped at once on an interrupt
        return merge_on(Pool(workers, ex), fn, samples, args, into, progress, chunks)


def merge_on(shards: Pool, fn, samples, args: tuple, into, progress=None, chunks=None):
    """merged() on a pool the caller holds (calibration keeps one for the statistics and the grids)."""
    chunks = chunks or _chunks(samples, shards.workers * CHUNKS_PER_WORKER)
    shared = [shards.share(a) for a in args]
    for part in shards.as_completed([shards.submit(fn, chunk, *shared) for chunk in chunks]):
        into.merge(part)        # in the order they finish: the merge is exact
        if progress:
            progress(part.count)
    return into


def split_map(shards: Pool, fn, samples: list, *args, align: int = 1) -> list:
    """fn(chunk, *args) -> a list per sample, over contiguous chunks of the samples (one a worker, each
    starting at a multiple of `align`), in sample order."""
    n, parts = len(samples), shards.workers
    bounds = [min(n, -(-(n * k // parts) // align) * align) for k in range(parts + 1)]
    shared = [shards.share(a) for a in args]
    out = shards.map(fn, [(samples[lo:hi], *shared) for lo, hi in zip(bounds, bounds[1:]) if hi > lo])
    return [s for part in out for s in part]


def _ray_get(ray, ref):
    """A task's result; a worker's own one-line error comes back as that line."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as e:
        cause = getattr(e, "cause", None)
        if isinstance(cause, MnnToolError):
            raise MnnToolError(str(cause)) from None
        raise MnnToolError(f"--ray: a task failed ({type(cause or e).__name__}: "
                           f"{' '.join(str(cause or e).split())[:160]})") from None
