"""Quantized convolution weights in MNN's IDSTQuan layout, both ways.

Facts of the layout (observed in files from MNN's converter and its loader): `buffer` holds
[ndims:u8][dims:u16 x ndims][table size:u8, 0 = 256][table: int8 x size][indices, bit-packed].
With the full linear table (-2^(b-1) .. 2^(b-1)-1) an 8-bit index is q + 128 and a 4-bit index is
q + 8 with two per byte, high nibble first. `alpha` holds one scale per output channel (symmetric:
w = q * s) or (min, scale) pairs (asymmetric: w = (q - qmin) * scale + min). fp16 weights are
`type` 3 with the raw half floats in `buffer`.
"""
from __future__ import annotations

import numpy as np


def _pack(q: np.ndarray, rows: int, bits: int) -> np.ndarray:
    q = q.reshape(rows, -1)
    header = [2, rows & 0xFF, rows >> 8, q.shape[1] & 0xFF, q.shape[1] >> 8]
    if rows > 0xFFFF or q.shape[1] > 0xFFFF:
        raise ValueError("weight dimensions above 65535 need the 32-bit shape form")
    lo = -(1 << (bits - 1))
    table = np.arange(lo, -lo, dtype=np.int8)
    idx = (q.reshape(-1).astype(np.int16) - lo).astype(np.uint8)
    if bits == 8:
        body = idx
    else:
        if idx.size % 2:
            idx = np.append(idx, np.uint8(0))
        body = (idx[0::2] << 4 | idx[1::2]).astype(np.uint8)
    size_byte = 0 if table.size == 256 else table.size
    return np.concatenate([np.array(header + [size_byte], np.uint8), table.view(np.uint8), body]).view(np.int8)


def _unpack(buffer: np.ndarray):
    b = np.asarray(buffer).view(np.uint8) if np.asarray(buffer).dtype == np.int8 else np.asarray(buffer, np.uint8)
    ndims = int(b[0])
    dims = [int(b[1 + 2 * k]) | int(b[2 + 2 * k]) << 8 for k in range(ndims)]
    pos = 1 + 2 * ndims
    size = int(b[pos]) or 256
    table = np.sort(b[pos + 1:pos + 1 + size].view(np.int8).astype(np.int16))
    body = b[pos + 1 + size:]
    count = int(np.prod(dims))
    bits = max(int(np.ceil(np.log2(size))), 1)
    if bits == 8:
        idx = body[:count]
    elif bits == 4:
        idx = np.stack([body >> 4, body & 0xF], 1).reshape(-1)[:count]
    else:   # general MSB-first bit packing
        bitstream = np.unpackbits(body)[:count * bits].reshape(count, bits)
        idx = bitstream @ (1 << np.arange(bits - 1, -1, -1))
    return table[idx.astype(np.int64)].reshape(dims), bits


def quantize_weight(w: np.ndarray, bits: int = 8, asymmetric: bool = False, rows: int | None = None,
                    per_tensor: bool = False, chunk: int | None = None) -> dict:
    """Per output channel (or one per tensor, or one per `chunk` consecutive weights of a channel:
    block-wise) quantization of a float weight -> the IDSTQuan table."""
    rows = rows or w.shape[0]
    flat = np.asarray(w, np.float64).reshape(rows, -1)
    header_rows = rows
    x = flat.reshape(-1, chunk) if chunk else flat
    rows = x.shape[0]
    if asymmetric:
        qmin, levels = -(1 << (bits - 1)), (1 << bits) - 1
        lo, hi = x.min(1), x.max(1)
        scale = np.where(hi > lo, (hi - lo) / levels, 1e-8)
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
    return {"buffer": _pack(q.astype(np.int8).reshape(header_rows, -1), header_rows, bits),
            "alpha": alpha.astype(np.float32), "type": 1,
            "useInt32": False, "quantScale": 1.0, "aMaxOrBits": bits, "has_scaleInt": False, "shapeInt32": False,
            **extra}


def fp16_weight(w: np.ndarray) -> dict:
    return {"buffer": np.ascontiguousarray(np.asarray(w, np.float16).reshape(-1)).view(np.int8), "type": 3}


def int8_values(qp: dict, rows: int):
    """(q int8 (rows, -1), per-row scale) of a symmetric 8-bit IDSTQuan weight; None for other kinds."""
    alpha = np.asarray(qp.get("alpha", ()), np.float32)
    if int(qp.get("type", 1)) != 1 or alpha.size != rows or int(qp.get("readType", 0) or 0):
        return None
    q, bits = _unpack(np.asarray(qp["buffer"]).astype(np.int8))
    if bits != 8:
        return None
    return q.reshape(rows, -1).astype(np.int8), alpha


def dequantize(qp: dict, rows: int) -> np.ndarray:
    """IDSTQuan -> float weight (rows, -1), as MNN's loader reads it."""
    kind = int(qp.get("type", 1))
    buf = np.asarray(qp["buffer"])
    if kind == 3:
        return buf.astype(np.int8).view(np.float16).astype(np.float32).reshape(rows, -1)
    if kind != 1:
        raise ValueError(f"IDSTQuan type {kind} is not supported")
    q, bits = _unpack(buf.astype(np.int8))
    alpha = np.asarray(qp["alpha"], np.float64)
    # as MNN's loader: readType != 0 means (min, scale) pairs; each scale covers an equal run of weights
    asymmetric = int(qp.get("readType", 0) or 0) != 0
    groups = alpha.size // 2 if asymmetric else alpha.size
    if groups == 0 or q.size % groups or groups % rows:
        raise ValueError(f"{alpha.size} scales do not divide {q.size} weights of {rows} output channels")
    q = q.reshape(groups, -1).astype(np.float64)
    if not asymmetric:
        return (q * alpha[:, None]).reshape(rows, -1).astype(np.float32)
    qmin = int(qp.get("aMin", 0) or 0) or -128          # MNN reads aMin 0 as the old -128
    lo, scale = alpha[0::2][:, None], alpha[1::2][:, None]
    return ((q - qmin) * scale + lo).reshape(rows, -1).astype(np.float32)
