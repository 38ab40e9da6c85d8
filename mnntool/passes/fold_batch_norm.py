"""Lower BatchNorm, which every frontend emits, to MNN's per-channel Scale (MNN's inference runtime has
no BatchNorm kernel). Runs first at every level, so the affine folds into convolutions after it."""
from __future__ import annotations

from ..ir.graph import Graph
from ..ir.ops.norm import batch_norm_affine


class FoldBatchNormPass:
    name = "fold_batch_norm"

    def __call__(self, g: Graph) -> bool:
        changed = False
        for node in g.nodes:
            if node.op != "BatchNorm":
                continue
            s, b = batch_norm_affine(node.param)
            node.op, node.param_type = "Scale", None
            node.param = {"channels": int(s.size), "scaleData": s, "biasData": b}
            changed = True
        return changed
