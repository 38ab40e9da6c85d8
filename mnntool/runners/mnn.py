"""The real MNN runtime (the `mnn` package); a source model is converted to a temporary .mnn first."""
from __future__ import annotations

import tempfile
from pathlib import Path

from .base import Runner


class MnnRunner(Runner):
    name = "mnn"

    def __init__(self, path: Path, threads: int | None, shapes: dict):
        from ..api import convert
        from ..loading import load_graph
        from ..runtime.mnn_backend import MnnSession
        self.path, self.threads = path, threads
        if path.suffix.lower() != ".mnn":
            self._tmp = tempfile.TemporaryDirectory()
            self.path = Path(self._tmp.name) / "model.mnn"
            convert(path, self.path, input_shapes=shapes)
        self.graph = load_graph(self.path, input_shapes=shapes)
        self.session = MnnSession(str(self.path), self.graph.inputs, self.graph.outputs, threads=threads)

    def run(self, feeds):
        return self.session.run(feeds)

    def run_all(self, feeds, wanted=None):
        """The tensors of `wanted` the file produces (MNN keeps a tensor only when asked for it by name at
        load), else the outputs when MNN cannot give them."""
        g = self.graph
        produced = {o for n in g.nodes for o in n.outputs}
        names = [n for n in (wanted or []) if n in produced] or list(g.outputs)
        names += [o for o in g.outputs if o not in names]
        order = [(o, n.op) for n in g.nodes for o in n.outputs if o in set(names)]
        try:
            self.name = "mnn"
            from ..runtime.mnn_backend import MnnSession
            return MnnSession(str(self.path), g.inputs, names, self.threads).run(feeds), order
        except Exception:
            self.name = "mnn (outputs only)"
            return self.run(feeds), [(o, "output") for o in g.outputs]
