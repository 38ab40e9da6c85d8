"""Remove Dropout and Identity ops (inference does not need them), rewiring their consumers."""
from __future__ import annotations

from ..ir.graph import Graph

REMOVABLE = {"Dropout", "Identity"}


class RemoveIdentityPass:
    name = "remove_identity"

    def __call__(self, g: Graph) -> bool:
        changed = False
        for node in list(g.nodes):
            if node.op not in REMOVABLE or len(node.inputs) < 1:
                continue
            src, dst = node.inputs[0], node.outputs[0]
            if dst in g.outputs:
                if src in g.outputs or src in g.inputs or src in g.constants:
                    continue   # an output fed straight by an input or constant keeps its Identity
                producer = next((n for n in g.nodes if src in n.outputs), None)
                if producer is None:
                    continue
                producer.outputs[producer.outputs.index(src)] = dst
                for n in g.nodes:
                    n.inputs = [dst if i == src else i for i in n.inputs]
            else:
                for n in g.nodes:
                    n.inputs = [src if i == dst else i for i in n.inputs]
            g.nodes.remove(node)
            changed = True
        return changed
