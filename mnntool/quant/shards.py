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


@contextmanager
def pool(workers: int):
    """(executor, workers): processes kept for a whole quantization (auto-skip evaluates many
    candidates on the held-out samples), or None for one process."""
    if workers <= 1:
        yield None
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as ex:
        yield ex, workers


def sample_sums_sharded(shards, fn, fp32, quant, samples: list, threads: int) -> list:
    """fn(fp32, quant, chunk, threads) -> a list per sample, over contiguous chunks in the pool, in order."""
    ex, parts = shards
    n = len(samples)
    bounds = [n * k // parts for k in range(parts + 1)]
    jobs = [ex.submit(fn, fp32, quant, samples[lo:hi], threads) for lo, hi in zip(bounds, bounds[1:]) if hi > lo]
    return [s for job in jobs for s in job.result()]


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
    started = not ray.is_initialized()
    if started:
        try:
            ray.init(address=None if address == "local" else address, include_dashboard=False,
                     log_to_driver=False, configure_logging=False)
        except Exception as e:      # noqa: BLE001 - Ray's own errors are many; one line names the address
            raise MnnToolError(f"--ray {address}: cannot reach a Ray cluster ({type(e).__name__}: "
                               f"{' '.join(str(e).split())[:160]})") from None
    try:
        cpus = workers if workers > 1 else max(1, int(ray.cluster_resources().get("CPU", 1)))
        chunks = _chunks(samples, cpus * CHUNKS_PER_WORKER)
        task = ray.remote(num_cpus=1)(_collect)
        graph = ray.put(g)      # once in the object store, not once per task
        pending = [task.remote(graph, chunk, names, layers, threads) for chunk in chunks]
        stats = Statistics()
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                try:
                    part = ray.get(ref)
                except ray.exceptions.RayTaskError as e:    # a bad sample: the worker's own one line
                    cause = getattr(e, "cause", None)
                    if isinstance(cause, MnnToolError):
                        raise MnnToolError(str(cause)) from None
                    raise MnnToolError(f"--ray: a calibration task failed ({type(cause or e).__name__}: "
                                       f"{' '.join(str(cause or e).split())[:160]})") from None
                stats.merge(part)       # in the order they finish: the merge is exact
                if progress:
                    progress(part.count)
        return stats
    finally:
        if started:
            ray.shutdown()
