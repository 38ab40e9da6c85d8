"""Weight-only compression: convolution weights stored as int8/int4 (per output channel, or per block
of input channels) or fp16, the way MNN's converter stores them (quanParameter); activations stay float.

A block is `block` input channels of one output channel with all their kernel taps: consecutive
weights in MNN's (O, I, kh, kw) order, which is how MNN's loader spreads the scales (one per equal run).
"""
from __future__ import annotations

import numpy as np

from ..errors import MnnToolError
from ..ir.graph import Graph
from ..ir.ops import is_convolution, keeps_values
from .weights import fp16_weight, quantize_weight



def head_layers(g: Graph) -> set[str]:
    """Convolutions whose output is a graph output up to reshapes: a classifier's last FC, a language
    model's vocabulary projection. Their error reaches the outputs undiluted; with int4 elsewhere a
    decoder's logits lose most of their accuracy there (measured: 0.9976 -> 0.9996 cosine with the
    head at 8 bits), which is why llama.cpp and MNN's LLM export give the head more bits."""
    readers = g.consumers()
    heads = set()
    for n in g.nodes:
        if not is_convolution(n.op):
            continue
        t = n.outputs[0]
        while t not in g.outputs and len(readers.get(t, [])) == 1 and keeps_values(readers[t][0].op) \
                and readers[t][0].inputs[0] == t:
            t = readers[t][0].outputs[0]
        if t in g.outputs:
            heads.add(n.name)
    return heads


def compress_weights(g: Graph, bits: int | None = None, fp16: bool = False, asymmetric: bool = False,
                     skip: set[str] = frozenset(), block: int | None = None, hqq: bool = False,
                     head_bits: int | None = None, plan: dict | None = None) -> tuple[int, int]:
    """Replace float weights in place; returns (layers changed, layers quantized block-wise). Layers
    whose input channels do not split into whole blocks keep one scale per output channel; the
    head_layers get `head_bits` when given. A `plan` ({name: compression_params.LayerPlan}, bits 0:
    float) sets bits, block and asymmetry layer by layer instead."""
    if bits not in (None, 8, 4) or head_bits not in (None, 8, 4):
        raise MnnToolError(f"--weight-bits {bits} / --head-bits {head_bits}: only 8 and 4 are supported")
    heads = head_layers(g) if head_bits else set()
    if block is not None and (block < 1 or fp16 or bits is None):
        raise MnnToolError(f"--block-size {block}: needs --weight-bits and a positive size")
    if hqq and bits is None:
        raise MnnToolError("--hqq optimises weight-only zero points: add --weight-bits 8|4")
    asymmetric = asymmetric or hqq       # HQQ moves a zero point: there must be one
    changed = blocked = 0
    for n in g.nodes:
        if not is_convolution(n.op) or n.name in skip or n.outputs[0] in skip:
            continue
        w = n.param.get("weight")
        if w is None or len(w) == 0:
            continue
        if plan is not None:
            lp = plan.get(n.name)
            if lp is None or lp.bits == 0:
                continue
            bits, block, asymmetric = lp.bits, lp.block, lp.asymmetric or hqq
        c = n.param["common"]
        rows = c["outputCount"]
        per_row = np.asarray(w).size // rows
        taps = c.get("kernelX", 1) * c.get("kernelY", 1)
        cin = per_row // taps if per_row % taps == 0 else per_row
        chunk = block * (per_row // cin) if block and cin > block and cin % block == 0 else None
        nbits = head_bits if n.name in heads else bits
        qp = fp16_weight(np.asarray(w)) if fp16 else quantize_weight(np.asarray(w), nbits, asymmetric, rows,
                                                                      chunk=chunk, hqq=hqq)
        n.param["quanParameter"] = qp
        n.param.pop("weight")
        changed += 1
        blocked += chunk is not None
    return changed, blocked
