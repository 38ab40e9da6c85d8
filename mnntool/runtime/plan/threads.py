"""A plan of fewer floating-point operations than ONE_THREAD_BELOW_FLOPS is built for one thread,
whatever the session's count: no kernel of it has the work to pay for a second
(kernels.PARALLEL_MIN_WORK), and with workers spinning beside it the tiny transformers of
benchmarks/zoo_speed.py (2-4 MFLOP, ~0.1 ms) ran 0.94-1.15x their 1-thread time at 2 threads."""
from __future__ import annotations

from dataclasses import replace

from ...ir.shape_inference import flops
from .. import host_tuning
from .state import Planning

OPTIONAL = True
ONE_THREAD_BELOW_FLOPS = host_tuning.ONE_THREAD_BELOW_FLOPS     # the default; the host's own: host_tuning


def run(p: Planning) -> None:
    if p.settings.threads > 1 and flops(p.graph, p.vals) < host_tuning.one_thread_below_flops(p.settings.threads):
        p.settings = replace(p.settings, threads=1)
