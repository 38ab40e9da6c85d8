"""x * sigmoid(x) (SiLU/Swish as exporters unroll it) -> one UnaryOp SILU, as MNN's converter writes it.

In MNN the pair is two full passes over the activation and a sigmoid tensor in between; SILU is one
(TinyNet-A: 49 Sigmoid+Mul pairs on the widest tensors of the net, the main part of its file's 1.19x MNN's
converter's file in MNN). mnntool's runtime fuses either form into the convolution before it.
"""
from __future__ import annotations

from ..ir.graph import Graph, Node


def _is_sigmoid(n: Node) -> bool:
    return n.op == "Sigmoid" or (n.op == "UnaryOp" and n.param.get("opType") == "SIGMOID")


class FuseSiluPass:
    """Sigmoid(x) read only by Mul(x, sigmoid) or Mul(sigmoid, x)  ->  UnaryOp SILU(x)."""
    name = "fuse_silu"

    def __call__(self, g: Graph) -> bool:
        changed = False
        readers = g.consumers()     # once: a rewrite changes no reader of another Sigmoid's output
        for sig in [n for n in g.nodes if _is_sigmoid(n)]:
            x, s = sig.inputs[0], sig.outputs[0]
            users = readers.get(s, [])
            if s in g.outputs or len(users) != 1:
                continue
            mul = users[0]
            if mul.op != "BinaryOp" or mul.param.get("opType") != "MUL" or \
                    int(mul.param.get("activationType", 0)) or sorted(mul.inputs) != sorted([x, s]) or x == s:
                continue
            xi, oi = g.info(x), g.info(mul.outputs[0])
            if xi.dtype not in (None, "float32") or (xi.shape is not None and oi.shape is not None and
                                                     tuple(xi.shape) != tuple(oi.shape)):
                continue
            g.nodes[g.nodes.index(mul)] = Node("UnaryOp", [x], list(mul.outputs), mul.name,
                                               {"opType": "SILU", "T": "DT_FLOAT"})
            g.nodes.remove(sig)
            changed = True
        return changed
