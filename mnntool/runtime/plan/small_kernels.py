"""The kernels of the small ops no program took (stage `programs`), each a step of its own."""
from __future__ import annotations

from .kernels import steps_of
from .state import Planning

OPTIONAL = False


def run(p: Planning) -> None:
    steps = []
    for s in p.steps:
        steps += steps_of(p, *s.pending) if s.pending is not None else [s]
    p.steps = steps
