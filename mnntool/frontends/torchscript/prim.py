"""prim:: ops and Python-valued aten ops (sizes, lists, conditions) evaluated at conversion time."""
from __future__ import annotations

import numpy as np

from ...errors import MnnToolError
from ..shape_tracking import T
from .context import ATEN, aten


@aten("prim::NumToTensor", "aten::Int", "aten::Float", "aten::contiguous", "aten::dropout", "aten::detach",
      "aten::alias", "aten::lift_fresh_copy", "aten::lift_fresh", "aten::ScalarImplicit",
      "aten::clone")
def passthrough(ctx, node, args):
    return [args[0]]


# TorchScript's scalar-type numbers
SCALAR_TYPES = {0: np.uint8, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.int64, 5: np.float16, 6: np.float32,
                7: np.float64, 11: np.bool_, 15: np.float32}


@aten("aten::to", "aten::_to_copy", "aten::type_as")
def to(ctx, node, args):
    """A type change (device and layout arguments mean nothing here): floats become float32, integers and
    booleans int32, as the IR carries them."""
    x = args[0]
    if node.kind() == "aten::type_as":
        code = 6 if ctx.val(args[1]).dtype == "float32" else 3
    else:
        code = next((a for a in args[1:4] if type(a) is int and a in SCALAR_TYPES), None)
    if code is None:
        return [x]
    floating = np.dtype(SCALAR_TYPES[code]).kind == "f"
    if not isinstance(x, T):
        return [np.asarray(x).astype(SCALAR_TYPES[code])]
    if (ctx.val(x).dtype == "float32") == floating:
        return [x]
    return ctx.emit("Cast", [x], [ctx.out(node)], {"dstT": "DT_FLOAT" if floating else "DT_INT32"})


def _py(fn):
    def conv(ctx, node, args):
        if any(isinstance(a, T) for a in args):
            raise MnnToolError(f"{ctx.path}: {node.kind()} on tensors is not supported")
        return [fn(*args)]
    return conv


for _k, _f in {"aten::len": len, "aten::__not__": lambda a: not a, "aten::__is__": lambda a, b: a is b,
               "aten::__isnot__": lambda a, b: a is not b, "prim::unchecked_cast": lambda a: a}.items():
    ATEN[_k] = _py(_f)


@aten("aten::_assert_tensor_metadata", "aten::_assert_scalar", "aten::_assert_async",
      "aten::sym_constrain_range_for_size", "aten::sym_constrain_range")
def check_only(ctx, node, args):
    """Run-time checks a torch.export program carries; with shapes fixed at conversion they hold."""
    return [None]


@aten("aten::dim")
def dim(ctx, node, args):
    return [len(ctx.shape_of(args[0]))]


@aten("aten::numel")
def numel(ctx, node, args):
    return [int(np.prod(ctx.shape_of(args[0]), dtype=np.int64))]


@aten("aten::size")
def size(ctx, node, args):
    shape = ctx.shape_of(args[0])
    return [shape[args[1]] if len(args) > 1 and args[1] is not None else list(shape)]


@aten("aten::zeros", "aten::ones")
def zeros(ctx, node, args):
    fill = 0.0 if node.kind() == "aten::zeros" else 1.0
    return [np.full([int(d) for d in args[0]], fill, np.float32)]


@aten("aten::new_ones", "aten::new_zeros", "aten::new_full", "aten::new_empty")
def new_filled(ctx, node, args):
    """x.new_ones(size, dtype=...) and its kin: a constant of the size (shapes are static here), of the
    dtype given or else x's."""
    k = node.kind()
    x, size = args[0], [int(d) for d in args[1]]
    fill = args[2] if k == "aten::new_full" else (1 if k == "aten::new_ones" else 0)
    code = args[3] if k == "aten::new_full" else args[2]
    if code in SCALAR_TYPES:
        dtype = SCALAR_TYPES[code]
    else:
        dtype = np.float32 if (ctx.val(x).dtype if isinstance(x, T) else np.asarray(x).dtype.kind) in ("float32", "f") \
            else np.int64
    return [np.full(size, fill, dtype)]


@aten("prim::ListUnpack", "prim::TupleUnpack")
def unpack(ctx, node, args):
    return list(args[0])


@aten("prim::ListConstruct", "prim::TupleConstruct")
def construct(ctx, node, args):
    return [list(args)]


@aten("prim::TupleIndex", "aten::__getitem__")
def getitem(ctx, node, args):
    return [args[0][args[1]]]


# ---- Python containers and values in scripted code (lists, dicts, strings, integer math) ------------------

@aten("aten::append")
def append(ctx, node, args):
    """list.append: the list object itself changes (later readers of it see the item), as in Python."""
    args[0].append(args[1])
    return [args[0]]


@aten("aten::_set_item")
def set_item(ctx, node, args):
    args[0][args[1]] = args[2]
    return []


@aten("aten::list", "aten::copy")
def copy_list(ctx, node, args):
    return [list(args[0]) if isinstance(args[0], (list, tuple)) else args[0]]


@aten("aten::dict")
def new_dict(ctx, node, args):
    return [dict(args[0]) if args else {}]


@aten("aten::str")
def to_str(ctx, node, args):
    return [str(args[0])]


@aten("prim::min", "prim::max")
def py_min_max(ctx, node, args):
    """Python's min/max in scripted code (of two numbers, or of a list)."""
    if any(isinstance(a, T) for a in args):
        raise MnnToolError(f"{ctx.path}: {node.kind()} on tensors is not supported")
    fn = min if node.kind() == "prim::min" else max
    return [fn(args[0]) if len(args) == 1 else fn(*args)]


# TorchScript type kinds -> the Python values this frontend holds for them
_KINDS = {"TensorType": (T, np.ndarray), "ListType": (list, tuple), "TupleType": (list, tuple), "IntType": (int,),
          "FloatType": (float,), "BoolType": (bool,), "StringType": (str,), "NoneType": (type(None),),
          "DictType": (dict,)}


@aten("prim::isinstance")
def isinstance_(ctx, node, args):
    """isinstance(v, types) on a value whose type scripting left open (a Union, an Optional)."""
    kinds = [t.kind() for t in node.tys("types")]
    unknown = [k for k in kinds if k not in _KINDS]
    if unknown:
        raise MnnToolError(f"{ctx.path}: prim::isinstance against {', '.join(unknown)} is not supported")
    v = args[0]
    return [any(isinstance(v, _KINDS[k]) and not (k == "IntType" and isinstance(v, bool)) for k in kinds)]
