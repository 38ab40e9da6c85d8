"""What every TorchScript op converter gets: the op table and the context with the values so far."""
from __future__ import annotations

from ...registry import registrar
from ..shape_tracking import ShapedCtx

ATEN = {}


aten = registrar(ATEN)


class TorchCtx(ShapedCtx):
    """Besides the shaped context: `state`, the module attributes a scripted model has set so far in this
    conversion (prim::SetAttr), read back by later prim::GetAttr; None where state may not be written (a
    branch or loop body chosen at run time)."""
    state: dict | None = None
    readable: dict | None = None

    def __init__(self, graph, path, parent: "TorchCtx | None" = None):
        super().__init__(graph, path)
        self.state = {} if parent is None else None
        self.readable = self.state if parent is None else parent.readable

    def out(self, node, k=0) -> str:
        name = node.outputsAt(k).debugName()
        return self.g.fresh_name(name.replace(".", "_"))


def torch_for(path, what: str):
    """torch, once the file is known to exist; one line naming what needs it otherwise."""
    from pathlib import Path

    from ...errors import MnnToolError
    try:
        import torch
    except ImportError:
        raise MnnToolError(f"{what} needs torch: pip install 'mnntool[torch]'") from None
    if not Path(path).exists():
        raise MnnToolError(f"{path}: no such file")
    return torch


def is_module(value) -> bool:
    """A scripted module as Python sees it, or as a frozen module's attribute (the C++ object)."""
    import torch
    return isinstance(value, (torch.nn.Module, torch._C.ScriptModule))


def attribute(ctx, owner, name: str):
    """An attribute of a loaded module as data: a submodule stays an object, a tensor becomes a constant
    array, a number or list stays a Python value (nothing of the model's code runs); a value set earlier in
    this conversion by prim::SetAttr wins."""
    import torch

    from ...errors import MnnToolError
    if not is_module(owner):
        raise MnnToolError(f"{ctx.path}: prim::GetAttr '{name}' on a value that is not a module")
    key = (id(owner), name)
    if ctx.readable is not None and key in ctx.readable:
        return ctx.readable[key]
    value = getattr(owner, name)
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    if isinstance(value, (list, dict)) and ctx.readable is not None:
        ctx.readable[key] = value       # each read of a module's list or dict copies it: one object, as in Python
    return value


# ops whose result is boolean whatever their operands (a saved trace types its values only as Tensor)
BOOL_RESULT = {"aten::eq", "aten::ne", "aten::lt", "aten::gt", "aten::le", "aten::ge", "aten::logical_not",
               "aten::logical_and", "aten::logical_or", "aten::logical_xor", "aten::isnan", "aten::isinf",
               "aten::bool"}
# ops whose result has their first operand's type
SAME_TYPE = {"aten::bitwise_not", "aten::__and__", "aten::__or__", "aten::__xor__", "aten::bitwise_and",
             "aten::bitwise_or", "aten::bitwise_xor", "aten::expand", "aten::expand_as", "aten::repeat",
             "aten::unsqueeze", "aten::squeeze", "aten::view", "aten::reshape", "aten::slice", "aten::select",
             "aten::contiguous", "aten::clone", "aten::detach", "aten::permute", "aten::transpose", "aten::flatten",
             "aten::index"}


def is_bool(value, depth: int = 64) -> bool:
    """Whether a TorchScript value holds booleans: its type when recorded, else what made it."""
    if "Bool" in str(value.type()):
        return True
    n = value.node()
    k = n.kind()
    if k in BOOL_RESULT:
        return True
    if k in ("aten::to", "aten::_to_copy", "aten::new_ones", "aten::new_zeros", "aten::new_full"):
        dtype = next((i.toIValue() for i in list(n.inputs())[1:4] if i.node().kind() == "prim::Constant"
                      and type(i.toIValue()) is int), None)
        return dtype == 11
    if k in SAME_TYPE and depth:
        return is_bool(n.inputsAt(0), depth - 1)
    return False


def _ivalue(node):
    v = node.output().toIValue()
    try:
        import torch
        if isinstance(v, torch.Tensor):
            # a 0-d tensor constant is how tracing records a number (an index, a size): a Python number
            return v.item() if v.dim() == 0 else v.detach().cpu().numpy()
    except ImportError:
        pass
    return v
