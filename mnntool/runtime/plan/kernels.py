"""A step per op with its kernel: the op's fast kernel where it has one that takes this case, else its
definition's compute. Inputs carry the int8 grid their values lie on (a kernel of an int8 grid's
values may run by table) and outputs the grid the file stores them on (int8_store). Small float ops
that a program may run together (kernels/program.py) get their kernels later, in `programs` or
`small_kernels`."""
from __future__ import annotations

from ...errors import InvalidModel, MnnToolError
from ...ir.ops import REGISTRY, Val, keeps_values
from ..concat_in_place import concat_layout
from ..fallbacks import fell_back
from ..kernels import KERNELS, PLAN_ONLY, Kernel, by_definition
from ..kernels.ops.small_op_program import accepts
from ..kernels.ops.tensor import passthrough as _passthrough
from ..settings import Settings
from .int8_store import RAW, quantized_by_readers, rounding, stored_on
from . import reuse
from .state import Planning, Step

OPTIONAL = False

generic_kernel = by_definition


def kernel_for(node, ins, outs, settings: Settings) -> Kernel:
    """The fast kernel of the op where it has one that takes this case, else its definition's compute."""
    factory = KERNELS.get(node.op) or PLAN_ONLY.get(node.op)
    if factory is None:
        return generic_kernel(node)
    if not outs and node.op in REGISTRY:    # a file whose node writes nothing: its definition says what that means
        return generic_kernel(node)
    try:
        return factory(node, ins, outs, settings)
    except (ImportError, NameError, InvalidModel):     # mnntool's own defect, or a file that contradicts itself
        raise
    except MnnToolError as e:
        if node.op in REGISTRY:
            fell_back(node, e, declined=True)       # counted; bench --json reports it
            return generic_kernel(node)
        raise
    except Exception as e:
        if node.op in REGISTRY:
            fell_back(node, e, declined=False)      # a kernel's defect: raises under the tests
            return generic_kernel(node)
        raise MnnToolError(f"{node.op} '{node.name}': cannot prepare ({type(e).__name__}: {e})") from None


def read_as(p: Planning, node, i: str) -> str:
    """The unrounded version of a stored tensor for a reader in raw_reads."""
    return i + RAW if (node.name, i) in p.raw and i + RAW in p.index else i


_UNKNOWN = Val(None)


def _with_grid(v: Val, grid) -> Val:
    """A copy of v with `grid` (as dataclasses.replace, at a fifth of its cost: planned at every new shape)."""
    return Val(v.shape, v.dtype, v.value, grid, v.zero)


def _as_read(v: Val) -> Val:
    """v as an input without a grid (itself where it has none)."""
    return v if v.grid is None else _with_grid(v, None)


def operands(p: Planning, node, raw_read: set | None = None) -> tuple[list, list]:
    """What the op's kernel factory is told of its inputs (with their grids) and outputs (with the grid
    the file stores them on). raw_read: the tensors of p.raw (made once by `run`)."""
    vals, grids = p.vals, p.grids
    if not p.raw and not grids:     # (a float model: every Val as inference left it, grid None; Vals are never
        # written, so the kernel is told those very objects: no copies at every new shape)
        ins = [_as_read(vals.get(i) or _UNKNOWN) for i in node.inputs]
    elif not p.raw:       # (the common case, planned at every new shape: read_as is the name itself)
        ins = [_with_grid(vals.get(i) or _UNKNOWN, grids.get(i)) for i in node.inputs]
    else:
        ins = [_with_grid(vals.get(i) or _UNKNOWN, None if read_as(p, node, i) != i else grids.get(i))
               for i in node.inputs]
    if not p.stored:
        return ins, [vals.get(o) or Val(None) for o in node.outputs]
    if raw_read is None:
        raw_read = {t for _, t in p.raw}
    # an output some reader takes unrounded (raw_reads) is not the kernel's to round: no grid told
    outs = [stored_on(vals.get(o) or Val(None), None if o in raw_read else p.stored.get(o)) for o in node.outputs]
    return ins, outs


def steps_of(p: Planning, node, ins, outs) -> list[Step]:
    """The op's step, and a rounding step for each output the file stores on a grid its kernel does not
    round to; records the grids of its outputs."""
    k, entry, built = reuse.kernel(p, node, ins, outs, lambda: kernel_for(node, ins, outs, p.settings))
    if k.writes_out and any(v.shape is None or not all(isinstance(d, int) for d in v.shape) for v in outs):
        raise MnnToolError(f"{node.op} '{node.name}': output shape unknown at prepare time")
    if k.out_grid:
        p.grids[node.outputs[0]] = k.out_grid
    elif ins and ins[0].grid is not None and keeps_values(node.op):
        # its output holds its input's values, so lies on the input's int8 grid: a GELU reading an int8
        # Linear's output through its reshape runs by table (kernels.ops.mnn_math)
        p.grids[node.outputs[0]] = ins[0].grid
    # an output the file stores on a grid the kernel does not round to is written under its raw name and
    # rounded into its own slot by a step of its own (rounding in place could change a tensor the output
    # is a view of; rounding into the producer's slot made the next run's rounding read the last run's
    # result)
    rounded = [o for o in node.outputs if p.stored.get(o, (None,))[0] not in (None, p.grids.get(o))
               and o not in quantized_by_readers(p)] if p.stored else ()
    for o in rounded:
        p.vals[o + RAW] = p.vals.get(o, Val(None))
    slot = p.slot
    steps = [Step(node.name, node.op, k, [slot(read_as(p, node, i) if p.raw else i) if i else -1 for i in node.inputs],
                  [p.slot(o + RAW if o in rounded else o) for o in node.outputs],
                  concat=concat_layout(node, ins, outs) if node.op == "Concat" and k.writes_out and
                  not p.keep_all else None, shared=entry, source=None if entry is None else (node, ins, outs, built))]
    for o in rounded:
        p.grids[o] = grid = p.stored[o][0]
        steps.append(Step(node.name + " (int8 store)", "Int8Store", rounding(grid, p.settings.threads, p.stored[o][1]),
                          [p.slot(o + RAW)], [p.slot(o)]))
    return steps


def batchable(p: Planning, node, ins, outs) -> bool:
    """A small float op a program may run (kernels/program.py), read and stored plainly."""
    return accepts(node, ins, outs, p.graph.constants) and not any(o in p.stored for o in node.outputs) and \
        not any(read_as(p, node, i) != i for i in node.inputs)


# A node whose kernel is kernels/ops/tensor.py's `passthrough` (ConvertTensor, MNN's layout tag: NCHW <-> NC4HW4,
# the same array here; Identity, Dropout) hands its input on as its output: MNN's files put a ConvertTensor around
# every op of the other layout, 57 of EfficientNet-B0's 170 steps. Its output's name is made another name of its
# input's slot instead of a step: each cost ~18 us of planning at every new input shape (operands, kernel, memory,
# binding its view), ~1 ms a shape.
ALIAS_PASSTHROUGH = True        # (the tests switch it off to compare)
_PASSES: dict = {}              # op -> whether its kernel is `passthrough`


def aliased(p: Planning, node, outputs: set, raw_read: set) -> bool:
    """Where the node's kernel is `passthrough` and no one needs its output under its own name (not a graph
    output, not stored on an int8 grid or read unrounded, not computed at prepare, not under keep_all), its
    output is given its input's slot (and grid) and no step: the readers get the very array the view step
    handed on."""
    passes = _PASSES.get(node.op)
    if passes is None:
        passes = _PASSES[node.op] = KERNELS.get(node.op) is _passthrough
    if not passes or len(node.inputs) != 1 or len(node.outputs) != 1 or p.keep_all:
        return False
    i, o = node.inputs[0], node.outputs[0]
    if not i or not o or o in outputs or o in p.index or i in p.known or o in p.known or \
            (p.stored and (i in p.stored or o in p.stored)) or (raw_read and (i in raw_read or o in raw_read)):
        return False
    p.index[o] = p.slot(i)
    grid = p.grids.get(i)
    if grid is not None:        # (steps_of's keeps_values: the output lies on its input's grid)
        p.grids[o] = grid
    return True


def run(p: Planning) -> None:
    raw_read = {t for _, t in p.raw}
    outputs = set(p.graph.outputs) if ALIAS_PASSTHROUGH else None
    for node in p.nodes:
        if outputs is not None and _PASSES.get(node.op, True) and aliased(p, node, outputs, raw_read):
            continue
        ins, outs = operands(p, node, raw_read)
        if batchable(p, node, ins, outs):
            p.steps.append(Step(node.name, node.op, None, [p.slot(i) if i else -1 for i in node.inputs],
                                [p.slot(o) for o in node.outputs], pending=(node, ins, outs)))
        else:
            p.steps += steps_of(p, node, ins, outs)
