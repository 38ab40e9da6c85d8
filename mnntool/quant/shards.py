"""Work over local worker processes (--workers N) or a Ray cluster (--ray ADDRESS): calibration
(quant), the held-out evaluations (quant's report, --auto-skip), verify --calib and llm eval.

Two shapes of job:
- `merge_on(pool, fn, samples, args, into)`: the samples are cut into contiguous chunks, each worker
  returns fn(chunk, *args), an object with `.merge(other)` and `.count` (calibration's ptq.Statistics:
  histograms and fixed-point sums), and the driver merges them as they finish. The merge is exact, so
  the result is the single process's, bit for bit, in any order.
- `split_map(pool, fn, items, *args)`: fn(chunk, *args) returns a list per item; the lists come back in
  item order (verify's per-sample sums, llm eval's per-window statistics, the calibrators' grids).

What the driver does outside the parallel part limits how far a cluster scales (issue 50: 4 raylets
must give 3x one), so each job's arguments are sent once, not once per task: `Pool.share` puts a value
in Ray's object store (or pickles it once for local processes) and hands the tasks a `Shared` handle,
which each worker process resolves once and keeps for the job's later tasks; `kept` ties what a worker
derives from such a value to it (calibration builds its Session of the shared graph once per worker,
not once per chunk). A pool opened inside another of the same kind is that pool (quant holds one for the
whole command: calibration, grids and report then share its workers and what they keep).

This module knows nothing of what it runs (the caller passes its functions), so nothing here imports
the calibrator that imports it. Local workers start by spawning (a forked child would inherit the
parent's OpenMP and BLAS thread pools). Connecting to Ray, with its failures in one line, is cluster.py's.
`timed()` records the wall-clock spans of the parallel parts (benchmarks/ray_scaling.py: the driver's
serial share).
"""
from __future__ import annotations

import pickle
import time
import uuid
from collections import OrderedDict
from contextlib import contextmanager

from ..errors import MnnToolError

CHUNKS_PER_WORKER = 4       # a worker's share is cut this fine at the end (sizes): its last chunk is short
KEEP = 4                    # shared values a worker process keeps (a job shares one or two graphs)


def sizes(n: int, workers: int) -> list[int]:
    """Chunk sizes for n samples over `workers`, largest first (guided scheduling): each chunk takes half a
    worker's share of what is left, down to 1/CHUNKS_PER_WORKER of half a worker's share of the whole. The
    tasks run in this order, so the chunks that finish last are the short ones and a worker that is a
    little slower (the head's node runs the driver too) keeps the others waiting for a short chunk only.
    The merge is exact, so any cut gives the same result."""
    least = max(1, n // (2 * CHUNKS_PER_WORKER * workers))
    out, left = [], n
    while left > 0:
        k = min(left, max(least, -(-left // (2 * workers))))
        out.append(k)
        left -= k
    return out


def _chunks(samples, cut: list[int]) -> list:
    """The samples in contiguous chunks of the sizes `cut` (a reader's split; nothing is read here)."""
    try:
        parts, rest = [], samples
        for size in cut[:-1]:
            head, rest = rest.split(size)
            parts.append(head)
        parts.append(rest)
    except (NotImplementedError, AttributeError, TypeError):
        raise MnnToolError("--workers needs calibration data that can be split (a folder or a list of "
                           "samples; a custom CalibrationReader must implement split)") from None
    return [p for p in parts if len(p)]


# ------------------------------------------------------------------ values sent once, kept by the workers

_KEPT: OrderedDict = OrderedDict()      # Shared.key -> its value, in this (worker) process
_DERIVED: dict = {}                     # Shared.key -> {key: what kept() made of the value}


class Shared:
    """A task argument sent once and resolved once per worker process: a reference into Ray's object
    store (inside a list, so Ray hands it to the task unresolved) or the value pickled once in the
    driver (local processes get the bytes with each job, unpickled only by the first job of each)."""

    def __init__(self, value, ray_mod=None):
        self.key = uuid.uuid4().hex
        self.ref = [ray_mod.put(value)] if ray_mod is not None else None
        self.blob = None if ray_mod is not None else pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)

    def value(self):
        if self.key in _KEPT:
            _KEPT.move_to_end(self.key)
            return _KEPT[self.key]
        if self.ref is not None:
            import ray
            v = ray.get(self.ref[0])
        else:
            v = pickle.loads(self.blob)
        _KEPT[self.key] = v
        while len(_KEPT) > KEEP:
            old, _ = _KEPT.popitem(last=False)
            _DERIVED.pop(old, None)
        return v


def kept(value, key, make):
    """make(), built once per worker process for as long as it keeps `value` (a Shared argument's value):
    a Session of the shared graph serves every chunk of the job. Elsewhere (one process) make() itself."""
    for k, v in _KEPT.items():
        if v is value:
            made = _DERIVED.setdefault(k, {})
            if key not in made:
                made[key] = make()
            return made[key]
    return make()


def _plain(v, depth: int = 0) -> bool:
    """Whether v is a small value of Python's own types (numbers, strings, their short lists)."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return True
    return depth < 2 and isinstance(v, (list, tuple)) and len(v) <= 4096 and all(_plain(x, depth + 1) for x in v)


def _call(fn, *args):
    """fn(*args) in a worker, each Shared argument replaced by its value."""
    return fn(*[a.value() if isinstance(a, Shared) else a for a in args])


# ------------------------------------------------------------------------------------------- pools

class Pool:
    """Jobs run in parallel: local spawned processes (`ex`), or Ray tasks (`ray` the connected module)."""

    def __init__(self, workers: int, ex=None, ray_mod=None):
        self.workers, self.ex, self.ray = workers, ex, ray_mod
        self._task = None       # _call as a Ray remote function (exported to the cluster once)

    def share(self, value):
        """`value` as a task argument sent once (see Shared); plain small values (a thread count, a list
        of tensor names) go with each task as they are, keeping the workers' slots for graphs."""
        return value if _plain(value) else Shared(value, self.ray)

    def submit(self, fn, *args):
        """A handle on fn(*args) running (a Ray reference or a future)."""
        if self.ray is not None:
            if self._task is None:
                # SPREAD: the chunks go round the nodes from the start, instead of queueing on the driver's
                # node until Ray spills them over (small chunks then all ran on the head)
                self._task = self.ray.remote(num_cpus=1, scheduling_strategy="SPREAD")(_call)
            return self._task.options(name=fn.__name__).remote(fn, *args)     # the task named for what it runs
        return self.ex.submit(_call, fn, *args)

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


_OPEN: list = []        # (kind, Pool) of the pools open in this process, innermost last


@contextmanager
def pool(workers: int, ray: str | None = None):
    """A Pool kept for a whole job (auto-skip evaluates many candidates on the held-out samples; verify
    compares many samples), or None for one process. With `ray`, as many tasks at once as --workers
    when given, else as the cluster has CPUs. Inside a pool of the same kind, that pool."""
    kind = (workers, ray)
    if ray is None and workers <= 1:
        yield None
        return
    if _OPEN and _OPEN[-1][0] == kind:
        yield _OPEN[-1][1]
        return
    if ray is not None:
        from .cluster import connected, cpus
        with connected(ray) as mod, _open(kind, Pool(workers if workers > 1 else cpus(mod), ray_mod=mod)) as p:
            yield p
        return
    from ..interrupts import process_pool
    with process_pool(workers) as ex, _open(kind, Pool(workers, ex)) as p:     # stopped at once on an interrupt
        yield p


@contextmanager
def _open(kind, p: Pool):
    _OPEN.append((kind, p))
    try:
        yield p
    finally:
        _OPEN.remove((kind, p))


def merged(fn, samples, args: tuple, into, workers: int = 1, ray: str | None = None, progress=None):
    """`into` merged with fn(chunk, *args) of every chunk of the samples (cut by `sizes`),
    run on `workers` local processes or, with `ray` an address, as Ray tasks (the args sent once, not
    once per task). Each node of a cluster must have mnntool installed and see the sample files under
    the same paths. `progress(count)` after each chunk."""
    with pool(workers, ray) as on:
        if on is None:
            part = fn(samples, *args)
            into.merge(part)
            if progress:
                progress(part.count)
            return into
        return merge_on(on, fn, samples, args, into, progress)


# ---------------------------------------------------------------------- the driver's serial share

_SPANS: list | None = None


@contextmanager
def timed():
    """Records the spans of parallel work done in this process during the block: a list of dicts
    {"fn", "tasks", "start", "end" (time.perf_counter), "driver_s" (the driver's own time inside, merging)}.
    The block's time outside them is the driver's serial share."""
    global _SPANS
    saved, _SPANS = _SPANS, []
    try:
        yield _SPANS
    finally:
        _SPANS = saved


def _span(fn, tasks: int, start: float, driver_s: float = 0.0) -> None:
    if _SPANS is not None:
        _SPANS.append({"fn": fn.__name__, "tasks": tasks, "start": start, "end": time.perf_counter(),
                       "driver_s": driver_s})


def merge_on(shards: Pool, fn, samples, args: tuple, into, progress=None, chunks=None):
    """merged() on a pool the caller holds (calibration keeps one for the statistics and the grids)."""
    start = time.perf_counter()
    chunks = chunks or _chunks(samples, sizes(len(samples), shards.workers))
    shared = [shards.share(a) for a in args]
    merging = 0.0
    for part in shards.as_completed([shards.submit(fn, chunk, *shared) for chunk in chunks]):
        t = time.perf_counter()
        into.merge(part)        # in the order they finish: the merge is exact
        merging += time.perf_counter() - t
        if progress:
            progress(part.count)
    _span(fn, len(chunks), start, merging)
    return into


def split_map(shards: Pool, fn, samples: list, *args, align: int = 1) -> list:
    """fn(chunk, *args) -> a list per sample, over contiguous chunks of the samples (one a worker, each
    starting at a multiple of `align`), in sample order."""
    start = time.perf_counter()
    n, parts = len(samples), shards.workers
    bounds = [min(n, -(-(n * k // parts) // align) * align) for k in range(parts + 1)]
    shared = [shards.share(a) for a in args]
    out = shards.map(fn, [(samples[lo:hi], *shared) for lo, hi in zip(bounds, bounds[1:]) if hi > lo])
    _span(fn, sum(hi > lo for lo, hi in zip(bounds, bounds[1:])), start)
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
