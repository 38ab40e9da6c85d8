"""Remove ops whose results nobody uses, and constants nobody reads."""
from __future__ import annotations

from ..ir.graph import Graph


class DeadCodePass:
    name = "dead_code"

    def __call__(self, g: Graph) -> bool:
        changed = False
        while True:
            used = {i for n in g.nodes for i in n.inputs} | set(g.outputs)
            dead = [n for n in g.nodes if not any(o in used for o in n.outputs)]
            if not dead:
                break
            for n in dead:
                g.nodes.remove(n)
            changed = True
        used = {i for n in g.nodes for i in n.inputs} | set(g.outputs)
        for name in [c for c in g.constants if c not in used]:
            del g.constants[name]      # unused constants are not written anyway: no change to report
        return changed
