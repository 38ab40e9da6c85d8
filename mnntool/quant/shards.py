"""Calibration over local worker processes (quant --workers N) or a Ray cluster (quant --ray ADDRESS).

The samples are cut into contiguous chunks, each worker runs its chunks in its own runtime session and
returns their statistics (ptq.Statistics: histograms and fixed-point sums), and the driver merges them.
The merge is exact, so the grids and the file are the single process's, bit for bit. The held-out
evaluations (the report, --auto-skip's candidates) split their samples the same way over `pool`.
Workers start by spawning (a forked child would inherit the parent's OpenMP and BLAS thread pools).
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


def _collect(g, chunk, names, layers, threads):
    from .ptq import collect
    return collect(g, chunk, names, layers, threads)


def collect_sharded(g, samples, names, layers, threads: int, workers: int, progress=None):
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from .ptq import Statistics
    chunks = _chunks(samples, workers * CHUNKS_PER_WORKER)
    stats = Statistics()
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(workers, len(chunks)) or 1, mp_context=ctx) as pool:
        jobs = [pool.submit(_collect, g, chunk, names, layers, threads) for chunk in chunks]
        for job in as_completed(jobs):
            part = job.result()
            stats.merge(part)
            if progress:
                progress(part.count)
    return stats


class Pool:
    """Jobs run in order-preserving batches: local spawned processes, or Ray tasks (`ray` an address)."""

    def __init__(self, workers: int, ex=None, ray_mod=None):
        self.workers, self.ex, self.ray = workers, ex, ray_mod

    def map(self, fn, arglists: list) -> list:
        """[fn(*args) for args in arglists], run in parallel, results in the same order."""
        if self.ray is not None:
            task = self.ray.remote(num_cpus=1)(fn)
            refs = [task.remote(*args) for args in arglists]
            return [_ray_get(self.ray, r) for r in refs]
        return [job.result() for job in [self.ex.submit(fn, *args) for args in arglists]]


@contextmanager
def pool(workers: int, ray: str | None = None):
    """A Pool kept for a whole job (auto-skip evaluates many candidates on the held-out samples;
    verify compares many samples), or None for one process."""
    if ray is not None:
        mod = _ray()
        with _ray_session(mod, ray):
            yield Pool(_ray_cpus(mod, workers), ray_mod=mod)
        return
    if workers <= 1:
        yield None
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as ex:
        yield Pool(workers, ex)


def split_map(shards: Pool, fn, samples: list, *args) -> list:
    """fn(chunk, *args) -> a list per sample, over contiguous chunks of the samples (one a worker), in
    sample order."""
    n, parts = len(samples), shards.workers
    bounds = [n * k // parts for k in range(parts + 1)]
    out = shards.map(fn, [(samples[lo:hi], *args) for lo, hi in zip(bounds, bounds[1:]) if hi > lo])
    return [s for part in out for s in part]


@contextmanager
def _ray_session(ray, address: str):
    """Ray connected for the block: 'local' starts one here, 'auto' joins the running one, ray://HOST:PORT
    a remote cluster; shut down after if this call started it."""
    started = not ray.is_initialized()
    if started:
        try:
            ray.init(address=None if address == "local" else address, include_dashboard=False,
                     log_to_driver=False, configure_logging=False)
        except Exception as e:      # noqa: BLE001 - Ray's own errors are many; one line names the address
            raise MnnToolError(f"--ray {address}: cannot reach a Ray cluster ({type(e).__name__}: "
                               f"{' '.join(str(e).split())[:160]})") from None
    try:
        yield
    finally:
        if started:
            ray.shutdown()


def _ray_cpus(ray, workers: int) -> int:
    """Tasks at a time: --workers when given, else the cluster's CPUs."""
    return workers if workers > 1 else max(1, int(ray.cluster_resources().get("CPU", 1)))


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


def _ray():
    import os
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")      # Ray reports usage to its makers unless told not to
    try:
        import ray
    except ImportError:
        raise MnnToolError("--ray needs Ray: pip install 'mnntool[ray]'") from None
    return ray


def collect_ray(g, samples, names, layers, threads: int, address: str, workers: int = 1, progress=None):
    """As collect_sharded, the chunks run as Ray tasks: address 'local' starts a Ray instance on this
    machine for the call, 'auto' joins the one running here, ray://HOST:PORT a remote cluster. Each node
    must have mnntool installed and see the calibration files under the same paths. Chunks: CHUNKS_PER_WORKER
    per CPU of the cluster (or per --workers, when given)."""
    ray = _ray()
    from .ptq import Statistics
    with _ray_session(ray, address):
        cpus = _ray_cpus(ray, workers)
        chunks = _chunks(samples, cpus * CHUNKS_PER_WORKER)
        task = ray.remote(num_cpus=1)(_collect)
        graph = ray.put(g)      # once in the object store, not once per task
        pending = [task.remote(graph, chunk, names, layers, threads) for chunk in chunks]
        stats = Statistics()
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                part = _ray_get(ray, ref)
                stats.merge(part)       # in the order they finish: the merge is exact
                if progress:
                    progress(part.count)
        return stats
