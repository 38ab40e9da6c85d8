"""Planning: a shaped graph becomes a Plan (steps, kernels, memory, bound arguments) through the stages
below, in order, each a module of this package with one function `run(p: Planning) -> None` that
reads what the stages before it left in `p` and adds its part (state.py). The fuse_* stages only rewrite
the node list (chains of ops as one node): their run is match.rewriting(fuse).

A stage whose module says OPTIONAL = True can be switched off on its own, for a session
(`Settings.of(threads, off=[...])`) or the process (MNNTOOL_PLAN_OFF=fuse_silu,programs): the plan
then computes the same outputs, more slowly (tests/runtime/test_plan_stages.py checks each against
onnxruntime). The required ones make a plan at all. A stage whose module names STARTS (the ops its
matches start from) is skipped for a plan without any of them: it is planned again at every new input
shape, and most stages have nothing to do in most models."""
from __future__ import annotations

from ...errors import MnnToolError
from ..kernels.weight_cache import session_memo
from . import (bind, bind_views, constants, fuse_activations, fuse_add_layer_norm, fuse_attention, fuse_channel_scale,
               fuse_channel_shuffle, fuse_index_wrap, fuse_int8_tables, fuse_linear_scale, fuse_pool_mixer,
               fuse_residual_add, fuse_scalar_affine, fuse_silu, fuse_token_depthwise, fuse_transposed_weights, kernels,
               memory, place_concats, programs, shapes, small_kernels, threads)
from .state import Plan, Planning, Step

STAGES = [
    shapes,                 # shape inference at the input shapes (or: run op by op)
    threads,                # one thread for a plan too small to share
    fuse_attention,         # chains of ops as one step each, in the order each needs
    fuse_pool_mixer,
    fuse_token_depthwise,
    fuse_index_wrap,
    fuse_channel_shuffle,
    fuse_add_layer_norm,
    fuse_silu,
    fuse_linear_scale,
    fuse_activations,
    fuse_int8_tables,       # a table op (SiLU) in the epilogue of the int8 convolution it reads
    fuse_scalar_affine,
    fuse_channel_scale,
    fuse_residual_add,      # a residual Add (and ReLU) after the convolution that feeds it
    fuse_transposed_weights,
    constants,              # shape arithmetic computed now, not at run time
    kernels,                # a step and kernel per op, int8 stores rounded
    programs,               # runs of small ops as one program
    small_kernels,          # the small ops no program took
    place_concats,          # Concat inputs written in place
    memory,                 # the buffer pool and the views every step writes
    bind_views,             # views of fixed arrays made once
    bind,                   # the call list run() walks
]


def name_of(stage) -> str:
    return stage.__name__.rsplit(".", 1)[-1]


NAMES = [name_of(s) for s in STAGES]
OPTIONAL = [name_of(s) for s in STAGES if s.OPTIONAL]


def check_off(off) -> None:
    """Stages a user asked to switch off must exist and be optional (one line naming them, else)."""
    bad = [n for n in off if n not in OPTIONAL]
    if bad:
        raise MnnToolError(f"cannot switch off planning stage(s) {', '.join(bad)}; optional stages: "
                           f"{', '.join(OPTIONAL)}")


def build(p: Planning) -> Plan:
    """The plan of `p`, its stages run top to bottom (those in p.settings.off skipped)."""
    off = p.settings.off
    ops, seen = None, None
    if p.memory is not None and p.arena is None:
        p.arena = p.memory.take(0)      # the arena its buffers will lie in: its kernels may be shared (reuse.py)
    made = session_memo("fused nodes") if not p.keep_all else None
    if made is not None:        # the fused nodes of the last plan (match.made_node), those of this one
        made["last"], made["now"] = made.get("now", {}), {}
        p.made = (made["last"], made["now"])
    for stage in STAGES:
        if p.eager:
            break
        if off and name_of(stage) in off:
            continue
        starts = getattr(stage, "STARTS", None)
        if starts is not None:      # a stage that says which ops its matches start from runs only where one is
            if seen is not p.nodes:     # (stages rewrite p.nodes as a new list)
                ops, seen = {n.op for n in p.nodes}, p.nodes
            if not starts & ops:
                continue
        stage.run(p)
    if p.eager and p.arena is not None:      # a plan run op by op has no buffers
        p.memory.release(p.arena)
        p.arena = None
    return p.plan()


__all__ = ["STAGES", "NAMES", "OPTIONAL", "Plan", "Planning", "Step", "build", "check_off"]
