"""Graph passes: each is a small class with a `name` whose call returns whether it changed the graph.

PIPELINES lists them per --optimize level; level 2 repeats the optimizing passes to a fixed point.
"""
from __future__ import annotations

from collections import Counter

from ..errors import MnnToolError
from ..ir.graph import Graph
from ..ir.shape_inference import infer_shapes
from .activation_before_reshape import ActivationBeforeReshapePass
from .approximate_gelu import ApproximateGeluPass
from .constant_fold import ConstantFoldPass
from .dead_code import DeadCodePass
from .floor_masked_softmax import FloorMaskedSoftmaxPass
from .fold_batch_norm import FoldBatchNormPass
from .fuse_conv import FoldAffineIntoConvPass, FuseReluIntoBinaryPass, FuseReluIntoConvPass
from .fuse_pad import FusePadIntoConvPass
from .fuse_pad_pool import FusePadIntoAvgPoolPass
from .fuse_patterns import FuseGeluPass, FuseGeluTanhPass, FuseLayerNormPass
from .fuse_silu import FuseSiluPass
from .layout import LayoutPass
from .matmul_to_conv import MatMulToConvPass
from .merge_parallel_convs import MergeParallelConvsPass
from .mnn_workarounds import MnnWorkaroundsPass
from .remove_noops import RemoveNoopsPass
from .split_few_groups import SplitFewGroupsPass
from .split_grouped_conv import SplitGroupedConvPass

# The one place a pass is registered: its stage lists it, in pipeline order.
STAGES = {
    "lowering": [FoldBatchNormPass],         # ops MNN has no inference kernel for: first, at every level
    "optimizing": [RemoveNoopsPass, ConstantFoldPass, FuseGeluPass, FuseGeluTanhPass, FuseLayerNormPass,
                   FuseSiluPass, FusePadIntoConvPass, FusePadIntoAvgPoolPass,
                   FoldAffineIntoConvPass, MergeParallelConvsPass, FuseReluIntoConvPass, FuseReluIntoBinaryPass, MatMulToConvPass,
                   ActivationBeforeReshapePass,
                   SplitGroupedConvPass, SplitFewGroupsPass, ApproximateGeluPass, FloorMaskedSoftmaxPass,
                   DeadCodePass],            # -O1 once, -O2 to a fixed point
    "required": [MnnWorkaroundsPass, LayoutPass],   # what every written file needs: last, at every level
}
ALL = {p.name: p for stage in STAGES.values() for p in stage}
LOWERING, OPTIMIZING, REQUIRED = ([p.name for p in STAGES[k]] for k in ("lowering", "optimizing", "required"))
PIPELINES = {0: LOWERING + REQUIRED, 1: LOWERING + OPTIMIZING + REQUIRED, 2: LOWERING + OPTIMIZING + REQUIRED}


def _doc(cls) -> str:
    import sys
    text = cls.__doc__ or sys.modules[cls.__module__].__doc__ or ""
    return " ".join(text.strip().split("\n\n")[0].split())


DOCS = {name: _doc(cls) for name, cls in ALL.items()}


def resolve(level: int = 1, passes: list[str] | None = None) -> list[str]:
    if passes is None:
        return list(PIPELINES[level])
    unknown = [p for p in passes if p not in ALL]
    if unknown:
        raise MnnToolError(f"unknown pass(es) {', '.join(unknown)}; available: {', '.join(ALL)}")
    return list(passes)


def run_pipeline(g: Graph, level: int = 1, passes: list[str] | None = None) -> dict:
    """Run the passes; returns {pass name: {"ops_before", "ops_after", "removed": {...}, "added": {...}}}
    for every pass that changed the graph."""
    names = resolve(level, passes)
    report: dict = {}
    infer_shapes(g)
    rounds = 4 if level >= 2 else 1
    for r in range(rounds):
        changed_any = False
        for name in names:
            if name in REQUIRED and r < rounds - 1:
                continue
            before = Counter(n.op for n in g.nodes)
            if ALL[name]()(g):
                changed_any = True
                after = Counter(n.op for n in g.nodes)
                entry = report.setdefault(name, {"ops_before": sum(before.values()), "removed": Counter(),
                                                 "added": Counter()})
                entry["ops_after"] = sum(after.values())
                entry["removed"].update(before - after)
                entry["added"].update(after - before)
                infer_shapes(g)
        if not changed_any:
            break
    for node in g.nodes:        # each body of a control-flow op is a graph of its own
        for sub in node.graphs.values():
            for name, entry in run_pipeline(sub, level, passes).items():
                mine = report.setdefault(name, {"ops_before": 0, "ops_after": 0, "removed": Counter(),
                                                "added": Counter()})
                mine["removed"].update(entry["removed"])
                mine["added"].update(entry["added"])
    return {k: {**v, "removed": dict(v["removed"]), "added": dict(v["added"])} for k, v in report.items()}
