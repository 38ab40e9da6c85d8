"""Graph passes. Each pass is a callable object with a `name` whose call returns whether it changed the graph."""
from __future__ import annotations

from ..ir.graph import Graph
from ..ir.shape_inference import infer_shapes
from .fuse_conv import FoldScaleIntoConvPass, FuseReluIntoConvPass
from .layout import LayoutPass
from .remove_identity import RemoveIdentityPass

PIPELINES = {
    0: [LayoutPass],
    1: [RemoveIdentityPass, FoldScaleIntoConvPass, FuseReluIntoConvPass, LayoutPass],
    2: [RemoveIdentityPass, FoldScaleIntoConvPass, FuseReluIntoConvPass, LayoutPass],
}


def run_pipeline(g: Graph, level: int = 1) -> list[str]:
    """Run the passes of an optimization level; returns the names of those that changed the graph."""
    changed = []
    infer_shapes(g)
    for cls in PIPELINES[level]:
        p = cls()
        if p(g):
            changed.append(p.name)
            infer_shapes(g)
    return changed
