"""Rewrite ops that MNN's runtime computes wrongly into equivalents it gets right.

Measured in MNN 3.6.1 (the pip wheel): BinaryOp LESS on float32 tensors is wrong for about a quarter
of the elements of random data (x < -1 for x = [-2, 0, 1] gives [0, 0, 0]), while GREATER is exact;
so a < b is written as b > a. Runs at every optimization level: it is about meaning, not speed.
"""
from __future__ import annotations

from ..ir.graph import Graph


class MnnWorkaroundsPass:
    name = "mnn_workarounds"

    def __call__(self, g: Graph) -> bool:
        changed = False
        for node in g.nodes:
            if node.op == "BinaryOp" and node.param.get("opType") == "LESS" and len(node.inputs) == 2:
                node.param = dict(node.param, opType="GREATER")
                node.inputs = [node.inputs[1], node.inputs[0]]
                changed = True
        return changed
