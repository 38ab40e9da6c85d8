"""Runs of consecutive small float ops (an unrolled LSTM's thirteen ops a time step) as one Program step
each, interpreted in one call over one arena (kernels/program.py); a run of one op is left to
`small_kernels`."""
from __future__ import annotations

from dataclasses import replace
from itertools import groupby

from ..kernels.ops.small_op_program import Programs
from .state import Planning, Step

OPTIONAL = True


def _as_made(p: Planning, node, made: dict):
    """`node` reading, by the name the open program wrote it under, what it reads by another name of the same
    slot (a layout tag or Identity between two of the program's ops is planned as a name, not a step: read by
    that name, the program took its own output for an input to load before it was written)."""
    inputs = [made.get(p.index.get(i), i) for i in node.inputs]
    return node if inputs == node.inputs else replace(node, inputs=inputs)


def _batched(p: Planning, run: list[Step], programs: Programs) -> list[Step]:
    out = []
    made: dict = {}     # slot -> the name the open program wrote it under

    def emit(nodes, externals, outputs, k):
        name = nodes[0].name + (f" (+{len(nodes) - 1} ops)" if len(nodes) > 1 else "")
        out.append(Step(name, "Program", k, [p.slot(i) for i in externals], [p.slot(o) for o in outputs]))
        made.clear()
    for s in run:
        node, ins, outs = s.pending
        if programs.nodes and not programs.fits(_as_made(p, node, made)):
            emit(*programs.close())
        node = _as_made(p, node, made)
        programs.add(node, ins, outs)
        made.update((p.slot(o), o) for o in node.outputs)
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
