"""Tensors the file stores as int8: MNN stores such a tensor as int8 whoever computes it, so its readers
see its values rounded to the grid. The stage `kernels` writes such an output under its raw name and
adds a rounding step (`rounding`) where the producing kernel does not round itself; the readers in
`raw_reads` keep reading the raw tensor."""
from __future__ import annotations

from dataclasses import replace
from weakref import WeakKeyDictionary

import numpy as np

from ...ir.graph import Graph, consumers_of
from ...ir.ops import Val, int8_in_float, is_convolution
from ..kernels import Kernel, sized
from ..kernels.micro.epilogue import grid_of, to_grid, to_grid_z

RAW = " (before int8 store)"     # a stored tensor's name as its producer writes it, before rounding


def _file_grid(g: Graph, t: str) -> dict | None:
    info = g.tensors.get(t) if t else None
    q = info.quant if info is not None else None
    return q if q and q.get("type", "DT_INT8") == "DT_INT8" and q.get("scale") else None


def stored_grids(g: Graph) -> dict[str, tuple]:
    """The int8 grid and zero point of each computed tensor the file gives one (a TensorQuantInfo of
    type int8), as (grid, zero).

    MNN stores such a tensor as int8 whoever computes it: its readers see its values rounded to the
    grid, not only the int8 convolution it was calibrated for (DBNet's FPN: an Add feeding both a
    convolution and an upsampling; the upsampling reads the rounded sum in MNN). The exceptions are
    raw_reads."""
    grids = {}
    for n in g.nodes:
        for o in n.outputs:
            q = _file_grid(g, o)
            if q:
                zero = float(q.get("zero", 0))
                grids[o] = (grid_of(float(q["scale"]), float(q.get("min", -128)) - zero,
                                    float(q.get("max", 127)) - zero), zero)
    return grids


def raw_reads(g: Graph) -> set[tuple[str, str]]:
    """(reader, tensor) pairs where MNN's reader sees the tensor unrounded though the file gives it a
    grid: a float elementwise op (one with an operand the file gives no grid) reading a tensor MNN
    computed in float, which is an elementwise op of that kind (a SiLU's x * sigmoid(x)) or a
    convolution kept float (`quant --skip`, `--auto-skip`) whose own input has no grid. MNN keeps
    those results in float and rounds them only for its int8 readers. Measured end to end: a gate's
    product reading a SiLU's output agreed with MNN at cosine 0.99998 rounded, 1 - 1e-14 unrounded;
    EfficientNet-B0 with 43 layers kept float 0.99979 -> 0.99997 (a residual Add read a kept-float
    layer's output 0.023 off in a range of 0.16 where the grid clamped). A kept-float convolution
    whose input has a grid MNN rounds for every reader (tests/quant/test_int8_agreement.py)."""
    def float_elementwise(n) -> bool:
        return int8_in_float(n.op) and not all(_file_grid(g, i) for i in n.inputs)

    computed_float = set()
    for n in g.nodes:
        if float_elementwise(n) or n.op == "UnaryOp" or (is_convolution(n.op) and "symmetricQuan"
                                    not in n.param and n.inputs and not _file_grid(g, n.inputs[0])):
            computed_float.update(o for o in n.outputs if _file_grid(g, o))
    return {(n.name, i) for n in g.nodes if float_elementwise(n) for i in n.inputs if i in computed_float}


def stored_on(v: Val, stored: tuple | None) -> Val:
    """v with the int8 grid and zero point the file stores its tensor on, if any: a kernel whose
    arithmetic MNN does on int8 bytes (the average pooling) follows it."""
    return v if stored is None else replace(v, grid=stored[0], zero=stored[1])


def rounding(grid: tuple, threads: int, zero: float = 0.0) -> Kernel:
    """A step that gives readers the tensor on its int8 grid (a copy: the tensor may be a view), cast as
    MNN casts it when the grid has a zero point (grid.mnn_cast)."""
    z = np.float32(zero)

    def run(inputs):
        x = np.ascontiguousarray(inputs[0], np.float32)
        out = np.empty_like(x)
        rows = x.reshape(-1, x.shape[-1]) if x.ndim else x.reshape(1, 1)
        if z:
            sized(to_grid_z, x.size, threads)(rows, grid, z, out.reshape(rows.shape))
        else:
            sized(to_grid, x.size, threads)(rows, grid, out.reshape(rows.shape))
        return [out]
    return Kernel(run, False, grid)


_QUANTIZED_BY_READERS: WeakKeyDictionary = WeakKeyDictionary()


def quantized_by_readers(p) -> set[str]:
    """Stored tensors (p.stored) no rounding step needs to round: every reader among the planned nodes is
    an int8 convolution whose input grid and zero point are the ones the file stores the tensor on,
    and such a convolution casts its input to that grid itself (the integer kernel's quantize, a float
    kernel's `_grid_input`, the depthwise kernel's steps), where the cast of a rounded value is the cast
    of the value. Not a graph output, and none when every tensor is wanted (keep_all: the tensor is
    read as the file stores it). EfficientNet-B0's squeeze-excitation products and the network input
    were rounded by a step of their own before the convolution that reads them quantized them again."""
    if p not in _QUANTIZED_BY_READERS:
        from ..kernels.micro.epilogue import grid_of
        from ..kernels.ops.conv import int8_scales
        readers = consumers_of(p.nodes)
        done = set()
        for t, (grid, zero) in p.stored.items():
            us = readers.get(t, [])
            if p.keep_all or not us or t in p.graph.outputs:
                continue
            ok = True
            for n in us:
                q = int8_scales(n) if is_convolution(n.op) and n.inputs[:1] == [t] and t not in n.inputs[1:] else None
                if q is None or grid_of(*q.input) != grid or float(q.zero_in) != float(zero):
                    ok = False
                    break
            if ok:
                done.add(t)
        _QUANTIZED_BY_READERS[p] = done
    return _QUANTIZED_BY_READERS[p]
