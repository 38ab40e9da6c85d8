"""Calibration over local worker processes (quant --workers N).

The samples are cut into contiguous chunks, each worker runs its chunks in its own runtime session and
returns their statistics (ptq.Statistics: histograms and fixed-point sums), and the driver merges them.
The merge is exact, so the grids and the file are the single process's, bit for bit. Workers start by
spawning (a forked child would inherit the parent's OpenMP and BLAS thread pools).
"""
from __future__ import annotations

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


def _work(args):
    from .ptq import collect
    g, chunk, names, layers, threads = args
    return collect(g, chunk, names, layers, threads)


def collect_sharded(g, samples, names, layers, threads: int, workers: int, progress=None):
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from .ptq import Statistics
    chunks = _chunks(samples, workers * CHUNKS_PER_WORKER)
    stats = Statistics()
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(workers, len(chunks)) or 1, mp_context=ctx) as pool:
        jobs = [pool.submit(_work, (g, chunk, names, layers, threads)) for chunk in chunks]
        for job in as_completed(jobs):
            part = job.result()
            stats.merge(part)
            if progress:
                progress(part.count)
    return stats
