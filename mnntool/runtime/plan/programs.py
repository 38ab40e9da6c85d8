"""Runs of consecutive small float ops (an unrolled LSTM's thirteen ops a time step) as one Program step
each, interpreted in one call over one arena (kernels/program.py); a run of one op is left to
`small_kernels`."""
from __future__ import annotations

from itertools import groupby

from ..kernels.ops.small_op_program import Programs
from .state import Planning, Step

OPTIONAL = True


def _batched(p: Planning, run: list[Step], programs: Programs) -> list[Step]:
    out = []

    def emit(nodes, externals, outputs, k):
        name = nodes[0].name + (f" (+{len(nodes) - 1} ops)" if len(nodes) > 1 else "")
        out.append(Step(name, "Program", k, [p.slot(i) for i in externals], [p.slot(o) for o in outputs]))
    for s in run:
        if programs.nodes and not programs.fits(s.pending[0]):
            emit(*programs.close())
        programs.add(*s.pending)
    emit(*programs.close())
    return out


def run(p: Planning) -> None:
    programs = Programs(p.graph.constants)
    steps = []
    for pending, group in groupby(p.steps, key=lambda s: s.pending is not None):
        group = list(group)
        steps += _batched(p, group, programs) if pending and len(group) > 1 else group
    programs.finish()
    p.steps = steps
