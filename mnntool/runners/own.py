"""mnntool's own runtime."""
from __future__ import annotations

from pathlib import Path

from .base import Runner


class OwnRunner(Runner):
    name = "numba"

    def __init__(self, path: Path, threads: int | None, shapes: dict):
        from ..loading import load_graph
        from ..runtime.session import Session
        self.graph = load_graph(path, input_shapes=shapes)
        if path.suffix.lower() != ".mnn":
            from ..passes import run_pipeline
            run_pipeline(self.graph, 1)      # a source model runs as `convert` would write it
        self.session = Session(self.graph, threads)

    def run(self, feeds):
        return self.session.run(feeds)

    def run_all(self, feeds, wanted=None):
        return self.session.run(feeds, keep_all=True), [(o, n.op) for n in self.graph.nodes for o in n.outputs if o]

    def prepare(self, shapes):
        self.session.prepare(shapes)

    def profile(self, feeds):
        seconds: list = []
        self.session.run(feeds, profile=seconds)
        return [(s.name, s.op, dt) for s, dt in zip(self.session.plan.ran, seconds)]
