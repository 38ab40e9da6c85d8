"""The Runner interface."""
from __future__ import annotations

import numpy as np

from ..ir.graph import Graph


class Runner:
    """A model loaded on one engine. `graph` is mnntool's IR of the model (input names and shapes for
    feeds, FLOPs); `name` is what reports call the engine."""
    name = ""
    graph: Graph

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The model's outputs by name."""
        raise NotImplementedError

    def run_all(self, feeds: dict[str, np.ndarray], wanted: list[str] | None = None) -> tuple[dict, list]:
        """Every tensor this engine can expose (or those of `wanted` it can), and [(tensor, op)] in the
        graph's order; engines that expose only outputs return those."""
        out = self.run(feeds)
        return out, [(n, "output") for n in out]

    def prepare(self, shapes: dict[str, tuple]) -> None:
        """Do the per-shape work (planning, packing) now rather than in the first run."""

    def profile(self, feeds: dict[str, np.ndarray]) -> list | None:
        """One run with [(step name, op, seconds)] per step, or None where the engine gives no profile."""
        return None
