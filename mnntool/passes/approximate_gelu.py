"""GELU written in its tanh form (MNN's UnaryOp GELU), as MNN's converter writes it by default
(`useGeluApproximation`, on unless turned off), instead of the erf form (GELU_STANDARD).

MNN 3.6's CPU backend computes GELU_STANDARD one element at a time with libm's erf and GELU with a
vectorised rational tanh: 16.1 ms against 0.38 ms for 393,216 elements at 1 thread (AMD EPYC), which made
FastViT-T8's file 2x slower in MNN than the file MNN's converter writes. The two differ by at most
4.7e-4 (near x = +-2), about what fp16 storage of activations costs. `convert --exact-gelu` keeps the erf
form (this pass off); -O0 does too."""
from __future__ import annotations

from ..ir.graph import Graph


class ApproximateGeluPass:
    name = "approximate_gelu"

    def __call__(self, g: Graph) -> bool:
        changed = False
        for node in g.nodes:
            if node.op == "UnaryOp" and node.param.get("opType") == "GELU_STANDARD":
                node.param = dict(node.param, opType="GELU")
                changed = True
        return changed
