"""Weight-only block quantization of a language model's linear layers, in the values MNN-LLM reads.

One (output channel, block of `block` input channels) shares a scale (and, asymmetric, a zero). The
formula is llmexport's, so that a bundle's numbers can be compared with llmexport's and with a torch
model fake-quantized the same way:

    symmetric:   q = clip(round(w / s), -(2^(b-1) - 1), 2^(b-1) - 1),  s = max|w| / (2^(b-1) - 1)
    asymmetric:  u = clip(round((w - min) / s), 0, 2^b - 1),          s = (max - min) / (2^b - 1)
    stored byte value (either) = q + 2^(b-1)  (asymmetric: u),  dequantized = (stored - 2^(b-1)) * s + z

with z = min + 2^(b-1) * s (asymmetric) or 0. MNN reads this with `aMin` 1 and `readType` 1
(asymmetric) or 0 (symmetric). 4-bit values are packed two to a byte, high nibble first.

`block` 0 means one block per output channel; a block that does not divide the input channels is
halved until it does (as llmexport does), and the report says which block was used.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..quant.hqq import hqq_minimum

ROWS_PER_CHUNK = 1 << 12        # rows quantized at a time: bounds the float64-free temporaries


@dataclass
class Quantized:
    """A linear weight (oc, ic) quantized: `stored` uint8 values (packed for 4 bits), `alpha` fp32
    per block (symmetric: scale; asymmetric: zero, scale interleaved), and the settings used."""
    stored: np.ndarray
    alpha: np.ndarray
    bits: int
    block: int
    symmetric: bool
    shape: tuple[int, int]


def effective_block(ic: int, block: int) -> int:
    b = ic if block <= 0 else min(block, ic)
    while ic % b:
        b //= 2
    return max(b, 1)


def quantize(w: np.ndarray, bits: int, block: int, symmetric: bool = False, hqq: bool = False) -> Quantized:
    """Quantize a float weight (oc, ic). Rows are done in chunks so a 150k-row head needs no more than a
    few of its own size in temporaries."""
    if bits not in (4, 8):
        raise ValueError(f"weight bits {bits}: 4 or 8")
    oc, ic = w.shape
    blk = effective_block(ic, block)
    stored = np.empty((oc, ic), np.uint8)
    nblocks = ic // blk
    alpha = np.empty((oc, nblocks) if symmetric else (oc, nblocks, 2), np.float32)
    for r0 in range(0, oc, ROWS_PER_CHUNK):
        x = np.asarray(w[r0:r0 + ROWS_PER_CHUNK], np.float32).reshape(-1, blk)
        s_out, a_out = _quantize_blocks(x, bits, symmetric, hqq)
        stored[r0:r0 + ROWS_PER_CHUNK] = s_out.reshape(-1, ic)
        alpha[r0:r0 + ROWS_PER_CHUNK] = a_out.reshape(alpha[r0:r0 + ROWS_PER_CHUNK].shape)
    if bits == 4:
        stored = (stored.reshape(-1, 2)[:, 0] << 4 | stored.reshape(-1, 2)[:, 1]).astype(np.uint8)
    return Quantized(stored.reshape(-1), alpha.reshape(-1), bits, blk, symmetric, (oc, ic))


def _quantize_blocks(x: np.ndarray, bits: int, symmetric: bool, hqq: bool):
    offset = 1 << (bits - 1)
    if symmetric:
        clip = offset - 1
        scale = np.abs(x).max(1) / clip
        safe = np.where(scale == 0, 1, scale)
        q = np.clip(np.round(x / safe[:, None]), -clip, clip)
        return (q + offset).astype(np.uint8), scale.astype(np.float32)
    levels = (1 << bits) - 1
    lo, hi = x.min(1), x.max(1)
    scale = (hi - lo) / levels
    safe = np.where(scale == 0, 1, scale).astype(np.float32)
    if hqq:
        lo = hqq_minimum(x, lo, safe, bits).astype(np.float32)
    u = np.clip(np.round((x - lo[:, None]) / safe[:, None]), 0, levels)
    zero = lo + offset * scale
    return u.astype(np.uint8), np.stack([zero, scale], 1).astype(np.float32)


def dequantize(qz: Quantized) -> np.ndarray:
    """The float weight MNN computes with (the fake-quantized reference of tests and `llm eval`)."""
    oc, ic = qz.shape
    s = qz.stored
    if qz.bits == 4:
        s = np.stack([s >> 4, s & 0xF], 1).reshape(-1)
    q = s.astype(np.float32).reshape(-1, qz.block) - (1 << (qz.bits - 1))
    if qz.symmetric:
        return (q * qz.alpha[:, None]).reshape(oc, ic)
    a = qz.alpha.reshape(-1, 2)
    return (q * a[:, 1:2] + a[:, 0:1]).reshape(oc, ic)


def header(oc: int, ic: int, bits: int) -> bytes:
    """The bytes before a quantized weight in MNN's layout: 2 dims, the shape (int16, int32 above
    65535), and the value table (its size, 0 meaning 256, then the signed values)."""
    dims = np.array([oc, ic], np.int32 if wide_shape(oc, ic) else np.int16).tobytes()
    n = 1 << bits
    table = np.arange(-(n // 2), n // 2, dtype=np.int8).tobytes()
    return b"\x02" + dims + bytes([0 if n == 256 else n]) + table


def wide_shape(oc: int, ic: int) -> bool:
    return oc > 65535 or ic > 65535
