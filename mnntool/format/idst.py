"""Quantized convolution weights in MNN's IDSTQuan layout, both ways (the file format's codec; the
quantizer decides the values, the runtime reads them back).

Facts of the layout (observed in files from MNN's converter and its loader): `buffer` holds
[ndims:u8][dims:u16 x ndims][table size:u8, 0 = 256][table: int8 x size][indices, bit-packed].
With the full linear table (-2^(b-1) .. 2^(b-1)-1) an 8-bit index is q + 128 and a 4-bit index is
q + 8 with two per byte, high nibble first. `alpha` holds one scale per output channel (symmetric:
w = q * s) or (min, scale) pairs (asymmetric: w = (q - qmin) * scale + min). fp16 weights are
`type` 3 with the raw half floats in `buffer`.
"""
from __future__ import annotations

import numpy as np


def pack(q: np.ndarray, rows: int, bits: int) -> np.ndarray:
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


def unpack(buffer: np.ndarray):
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


def int8_values(qp: dict, rows: int):
    """(q int8 (rows, -1), per-row scale) of a symmetric 8-bit IDSTQuan weight; None for other kinds."""
    alpha = np.asarray(qp.get("alpha", ()), np.float32)
    if int(qp.get("type", 1)) != 1 or alpha.size != rows or int(qp.get("readType", 0) or 0):
        return None
    q, bits = unpack(np.asarray(qp["buffer"]).astype(np.int8))
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
    q, bits = unpack(buf.astype(np.int8))
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
