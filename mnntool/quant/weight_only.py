"""Weight-only compression: convolution weights stored as int8/int4 (per output channel) or fp16, the
way MNN's converter stores them (quanParameter); activations stay float."""
from __future__ import annotations

import numpy as np

from ..errors import MnnToolError
from ..ir.graph import Graph
from .weights import fp16_weight, quantize_weight

CONVS = ("Convolution", "ConvolutionDepthwise")


def compress_weights(g: Graph, bits: int | None = None, fp16: bool = False, asymmetric: bool = False,
                     skip: set[str] = frozenset()) -> int:
    """Replace float weights in place; returns the number of layers changed."""
    if bits not in (None, 8, 4):
        raise MnnToolError(f"--weight-bits {bits}: only 8 and 4 are supported")
    changed = 0
    for n in g.nodes:
        if n.op not in CONVS or n.name in skip or n.outputs[0] in skip:
            continue
        w = n.param.get("weight")
        if w is None or len(w) == 0:
            continue
        rows = n.param["common"]["outputCount"]
        qp = fp16_weight(np.asarray(w)) if fp16 else quantize_weight(np.asarray(w), bits, asymmetric, rows)
        n.param["quanParameter"] = qp
        n.param.pop("weight")
        changed += 1
    return changed
