"""The ops torch.jit.script leaves for a module's state, optional values and device checks, lowered to the
values they have at conversion: the converted model is the scripted module's first call on a fresh
instance. prim::SetAttr records the value a later prim::GetAttr of the same attribute reads (the state a
call leaves for the next one is not kept: MNN models hold none); a value not known at conversion is
refused in one line naming the op."""
from __future__ import annotations

import numpy as np

from ...errors import MnnToolError
from ..shape_tracking import T
from .context import aten, is_module


def _refuse(ctx, node, why: str):
    raise MnnToolError(f"{ctx.path}: {node.kind()} ({node.scopeName() or 'graph'}): {why}")


@aten("prim::SetAttr")
def set_attr(ctx, node, args):
    owner, value = args
    name = node.s("name")
    if not is_module(owner):
        _refuse(ctx, node, f"'{name}' set on a value that is not a module")
    if ctx.state is None:
        _refuse(ctx, node, f"'{name}' set inside a branch or loop chosen at run time; its value after the call "
                           "is not known at conversion")
    ctx.state[(id(owner), name)] = value
    return []


@aten("prim::Uninitialized")
def uninitialized(ctx, node, args):
    """The placeholder scripting puts where a branch raises: never read on a path that converts."""
    return [None]


@aten("prim::device")
def device(ctx, node, args):
    """Every tensor lives on the CPU here (and in MNN's file, the device is the session's choice)."""
    return ["cpu"]


@aten("prim::dtype")
def dtype(ctx, node, args):
    """torch's scalar-type number of a value: float32 (6) or int64 (4) for a tensor, as the IR carries
    them (floats and integers)."""
    x = args[0]
    if isinstance(x, T):
        return [6 if ctx.val(x).dtype == "float32" else 4]
    kind = np.asarray(x).dtype.kind
    return [{"f": 6, "b": 11}.get(kind, 4)]


@aten("aten::__contains__")
def contains(ctx, node, args):
    container, key = args
    if isinstance(container, T) or isinstance(key, T):
        _refuse(ctx, node, "membership of a value computed at run time is not known at conversion")
    return [key in container]


@aten("aten::format")
def format_(ctx, node, args):
    """str.format, for the messages a scripted model builds (only raised on paths that do not convert)."""
    return [str(args[0]).format(*[a if not isinstance(a, np.ndarray) else a.tolist() for a in args[1:]])]


@aten("prim::DictConstruct")
def dict_construct(ctx, node, args):
    """A dict of outputs (transformers' ModelOutput, traced with strict=False): the values in order."""
    return [dict(zip(args[0::2], args[1::2]))]
