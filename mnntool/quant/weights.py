"""Float weights quantized per channel, per tensor or per block into MNN's IDSTQuan table (its byte
layout: format/idst.py), or stored as fp16."""
from __future__ import annotations

import numpy as np

from ..format.idst import pack
from .hqq import hqq_minimum


def quantize_weight(w: np.ndarray, bits: int = 8, asymmetric: bool = False, rows: int | None = None,
                    per_tensor: bool = False, chunk: int | None = None, hqq: bool = False) -> dict:
    """Per output channel (or one per tensor, or one per `chunk` consecutive weights of a channel:
    block-wise) quantization of a float weight -> the IDSTQuan table. `hqq` (asymmetric only) moves
    each row's minimum by half-quadratic optimisation (quant.hqq)."""
    rows = rows or w.shape[0]
    flat = np.asarray(w, np.float64).reshape(rows, -1)
    header_rows = rows
    x = flat.reshape(-1, chunk) if chunk else flat
    rows = x.shape[0]
    if asymmetric:
        qmin, levels = -(1 << (bits - 1)), (1 << bits) - 1
        lo, hi = x.min(1), x.max(1)
        scale = np.where(hi > lo, (hi - lo) / levels, 1e-8)
        if hqq:
            lo = hqq_minimum(x, lo, scale, bits)
        q = np.clip(np.round((x - lo[:, None]) / scale[:, None]) + qmin, qmin, qmin + levels)
        alpha = np.stack([lo, scale], 1).reshape(-1)
        extra = {"aMin": qmin, "readType": rows}     # any non-zero readType: MNN reads (min, scale) pairs
    else:
        qmax = (1 << (bits - 1)) - 1
        absmax = np.full(rows, np.abs(x).max()) if per_tensor else np.abs(x).max(1)
        scale = np.where(absmax > 0, absmax / qmax, 1e-8)
        q = np.clip(np.round(x / scale[:, None]), -qmax, qmax)
        alpha = scale
        extra = {"aMin": 0, "readType": 0}
    return idst_table(q, alpha, header_rows, bits, **extra)


def idst_table(q: np.ndarray, alpha: np.ndarray, rows: int, bits: int = 8, aMin: int = 0, readType: int = 0) -> dict:
    """Integer weights (any shape with `rows` output channels) and their scales as MNN's IDSTQuan table."""
    return {"buffer": pack(np.asarray(q).astype(np.int8).reshape(rows, -1), rows, bits),
            "alpha": np.asarray(alpha, np.float32), "type": 1,
            "useInt32": False, "quantScale": 1.0, "aMaxOrBits": bits, "has_scaleInt": False, "shapeInt32": False,
            "aMin": aMin, "readType": readType}


def fp16_weight(w: np.ndarray) -> dict:
    return {"buffer": np.ascontiguousarray(np.asarray(w, np.float16).reshape(-1)).view(np.int8), "type": 3}
