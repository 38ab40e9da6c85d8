"""The bundle's weights as the engine keeps them: quantized, as `llm.mnn.weight` stores them.

A linear layer's record (weightfile.py, MNN's ConvolutionCommon layout) is a header, the packed stored
values, fp32 alpha per (output channel, block) ([zero, scale] pairs, or scales alone when symmetric),
then an fp32 bias. The stored values are read in place from a memory map (4 bits: two per byte, high
nibble first; 8 bits: one byte), never unpacked or repacked; alpha and bias are copied out (they sit at
unaligned offsets, and they are small: 8 bytes per 64 weights at block 64). The engine computes

    w[o, i] = (stored[o, i] - 2^(bits-1)) * scale[o, b] + zero[o, b]  =  stored * scale + offset

with offset = zero - 2^(bits-1) * scale computed once here in fp32 (kept instead of zero: the kernels
read scale and offset, as many bytes per block as the file's pair). 16-bit layers are fp16 in the
file and kept as fp16 (converted per use).
"""
from __future__ import annotations

import mmap
import os
from dataclasses import dataclass

import numpy as np

from ...errors import MnnToolError
from .graph import LinearOp, NormOp


class WeightFile:
    """A read-only memory map of a weight file; `at(offset, count, dtype)` views or copies into it."""

    def __init__(self, path):
        self.path = str(path)
        try:
            f = open(self.path, "rb")
        except OSError as e:
            raise MnnToolError(f"{self.path}: cannot read ({e.strerror})") from None
        with f:
            self.size = os.fstat(f.fileno()).st_size
            self.map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if self.size else b""
        self.buf = np.frombuffer(self.map, np.uint8) if self.size else np.zeros(0, np.uint8)

    def check(self, offset: int, nbytes: int, what: str) -> None:
        if offset < 0 or nbytes < 0 or offset + nbytes > self.size:
            raise MnnToolError(f"{self.path}: {what} at bytes {offset}..{offset + nbytes} is past the end "
                               f"({self.size} bytes): the weight file does not belong to this graph or is cut short")

    def bytes_view(self, offset: int, nbytes: int, what: str) -> np.ndarray:
        self.check(offset, nbytes, what)
        return self.buf[offset:offset + nbytes]

    def copy(self, offset: int, count: int, dtype, what: str) -> np.ndarray:
        dt = np.dtype(dtype)
        raw = self.bytes_view(offset, count * dt.itemsize, what)
        return np.frombuffer(raw.tobytes(), dt).copy()

    def release(self, view: np.ndarray) -> None:
        """The pages under `view` (a view of this file) dropped from the process (MADV_DONTNEED): a layer
        repacked at load no longer reads them; they come back from the page cache if read again."""
        if not self.size or not hasattr(self.map, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
            return
        start = view.__array_interface__["data"][0] - self.buf.__array_interface__["data"][0]
        if start < 0 or start + view.nbytes > self.size:
            return
        page = mmap.PAGESIZE
        lo, hi = -(-start // page) * page, (start + view.nbytes) // page * page
        if hi > lo:
            try:
                self.map.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
            except (OSError, ValueError):
                pass

    def advise_willneed(self) -> None:
        if self.size and hasattr(self.map, "madvise") and hasattr(mmap, "MADV_WILLNEED"):
            try:
                self.map.madvise(mmap.MADV_WILLNEED)
            except OSError:
                pass


@dataclass
class QWeight:
    """One linear layer, y = x @ w.T + bias, w (oc, ic)."""
    name: str
    oc: int
    ic: int
    bits: int                   # 4 | 8 | 16
    block: int                  # input channels per scale (0 for 16 bits)
    codes: np.ndarray           # 4: uint8 (oc, ic/2) as stored; 8: uint8 (oc, ic); 16: float16 (oc, ic)
    scale: np.ndarray | None    # float32 (oc, nb)
    offset: np.ndarray | None   # float32 (oc, nb): zero - 2^(bits-1) * scale
    bias: np.ndarray | None     # float32 (oc,)
    symmetric: bool = False
    zero: np.ndarray | None = None  # the file's zeros (kept for tests; None when symmetric)

    @property
    def nblocks(self) -> int:
        return 0 if self.scale is None else self.scale.shape[1]

    @property
    def nbytes(self) -> int:
        """Bytes read per full pass over the layer (values, scales, offsets, bias)."""
        n = self.codes.nbytes
        for a in (self.scale, self.offset, self.bias):
            n += 0 if a is None else a.nbytes
        return n

    def dequantize(self, rows: slice = slice(None)) -> np.ndarray:
        """float32 w[rows] (oc, ic), the values the engine computes with."""
        if self.bits == 16:
            return np.asarray(self.codes[rows], np.float32)
        return dequantize_rows(self.codes[rows], self.scale[rows], self.offset[rows], self.bits, self.ic)


def unpack(codes: np.ndarray, bits: int, ic: int) -> np.ndarray:
    """Stored values (rows, ic) as uint8 0..2^bits-1 from the file's bytes (4 bits: high nibble first)."""
    if bits == 8:
        return np.asarray(codes).reshape(-1, ic)
    c = np.asarray(codes).reshape(-1, ic // 2)
    return np.stack([c >> 4, c & 0xF], -1).reshape(-1, ic)


def dequantize_rows(codes, scale, offset, bits: int, ic: int) -> np.ndarray:
    u = unpack(codes, bits, ic).astype(np.float32)
    rows, nb = scale.shape
    blk = ic // nb
    w = u.reshape(rows, nb, blk) * scale[:, :, None] + offset[:, :, None]
    return w.reshape(rows, ic)


def _header(wf: WeightFile, off: int, oc: int, ic: int, bits: int, wide: bool, name: str) -> int:
    """Parse the quantized record's header; returns its length."""
    head = wf.bytes_view(off, 1, name)
    if int(head[0]) != 2:
        raise MnnToolError(f"{wf.path}: {name}: weight header says {int(head[0])} dims (expected 2)")
    dt = np.int32 if wide else np.int16
    dims = np.frombuffer(wf.bytes_view(off + 1, 2 * np.dtype(dt).itemsize, name).tobytes(), dt)
    if [int(dims[0]), int(dims[1])] != [oc, ic]:
        raise MnnToolError(f"{wf.path}: {name}: weight header shape {dims.tolist()} != the op's [{oc}, {ic}]")
    p = off + 1 + dims.nbytes
    n = int(wf.bytes_view(p, 1, name)[0]) or 256
    table = np.frombuffer(wf.bytes_view(p + 1, n, name).tobytes(), np.int8)
    if n != 1 << bits or not np.array_equal(table, np.arange(-(n // 2), n // 2)):
        raise MnnToolError(f"{wf.path}: {name}: value table of {n} entries is not the {bits}-bit range "
                           "(an MNN table the engine does not read)")
    return p + 1 + n - off


def read_linear(wf: WeightFile, op: LinearOp) -> QWeight:
    q = op.quan
    off, wlen, alen, blen = op.external[:4]
    oc, ic = op.oc, op.ic
    bias = wf.copy(off + wlen + alen, blen // 4, np.float32, op.name) if blen else None
    if bias is not None and bias.size != oc:
        raise MnnToolError(f"{wf.path}: {op.name}: bias of {bias.size} values for {oc} outputs")
    qtype = int(q.get("type", 0) or 0)
    if qtype == 3 or (qtype == 0 and wlen == oc * ic * 2 and alen == 0):
        if wlen != oc * ic * 2:
            raise MnnToolError(f"{wf.path}: {op.name}: fp16 weight of {wlen} bytes for {oc}x{ic}")
        raw = wf.bytes_view(off, wlen, op.name)
        codes = raw.view(np.float16).reshape(oc, ic) if off % 2 == 0 else \
            np.frombuffer(raw.tobytes(), np.float16).reshape(oc, ic)
        return QWeight(op.name, oc, ic, 16, 0, codes, None, None, bias, True)
    if qtype != 1:
        raise MnnToolError(f"{wf.path}: {op.name}: quantization type {qtype} is not read (1: weight-only "
                           "blocks, 3: fp16)")
    bits = int(q.get("aMaxOrBits", 0) or 0)
    if bits not in (4, 8):
        raise MnnToolError(f"{wf.path}: {op.name}: {bits}-bit weights (4 or 8 are read)")
    hl = _header(wf, off, oc, ic, bits, bool(q.get("shapeInt32", False)), op.name)
    packed = oc * ic * bits // 8
    if hl + packed != wlen:
        raise MnnToolError(f"{wf.path}: {op.name}: {wlen} weight bytes, expected {hl} + {packed}")
    codes = wf.bytes_view(off + hl, packed, op.name).reshape(oc, ic * bits // 8)
    asym = int(q.get("readType", 0) or 0) != 0 or int(q.get("aMin", 0) or 0) != 0
    count = alen // 4
    per = 2 if asym else 1
    if count % (oc * per):
        raise MnnToolError(f"{wf.path}: {op.name}: {count} alpha values for {oc} outputs")
    nb = count // (oc * per)
    if nb == 0 or ic % nb:
        raise MnnToolError(f"{wf.path}: {op.name}: {nb} blocks do not divide {ic} inputs")
    alpha = wf.copy(off + wlen, count, np.float32, op.name).reshape(oc, nb, per)
    half = np.float32(1 << (bits - 1))
    if asym:
        zero, scale = np.ascontiguousarray(alpha[:, :, 0]), np.ascontiguousarray(alpha[:, :, 1])
        offset = (zero - half * scale).astype(np.float32)
    else:
        zero, scale = None, np.ascontiguousarray(alpha[:, :, 0])
        offset = (-half * scale).astype(np.float32)
    _flat_blocks(codes, scale, offset, bits, ic // nb, zero)
    return QWeight(op.name, oc, ic, bits, ic // nb, codes, scale, offset, bias, not asym, zero)


FLAT_SCALE = 1e3    # no real weight block needs a step this large: llmexport writes 1e8 for a constant block


def _flat_blocks(codes, scale, offset, bits: int, block: int, zero) -> None:
    """A block whose values are all equal (a zeroed padding row) may carry an absurd scale (llmexport:
    1e8 with every stored value at the midpoint): its values are exact as (stored - 2^(b-1)) * scale
    + zero, but stored * scale + offset cancels ~1e10 against ~1e10 in float32. Such a block becomes
    scale 0 and offset its constant value (the same numbers, computed safely)."""
    bad = np.argwhere(np.abs(scale) > FLAT_SCALE)
    if not bad.size:
        return
    half = 1 << (bits - 1)
    for r, b in bad:
        u = unpack(codes[r], bits, codes.shape[1] * 8 // bits)[0, b * block:(b + 1) * block]
        if np.all(u == u[0]):
            value = np.float32((int(u[0]) - half) * np.float32(scale[r, b]) + (zero[r, b] if zero is not None else 0))
            scale[r, b], offset[r, b] = 0, value


@dataclass
class NormWeights:
    gamma: np.ndarray
    beta: np.ndarray | None     # None: zero (or RMS norm)
    eps: float
    rms: bool


def read_norm(wf: WeightFile, op: NormOp, dim: int) -> NormWeights:
    if op.external is not None:
        off, glen, blen = op.external[:3]
        gamma = wf.copy(off, glen // 4, np.float32, op.name)
        beta = wf.copy(off + glen, blen // 4, np.float32, op.name) if blen else None
    else:
        gamma, beta = op.gamma, op.beta
    if gamma is None or gamma.size != dim:
        raise MnnToolError(f"{wf.path}: norm {op.name}: {0 if gamma is None else gamma.size} weights for {dim} channels")
    if beta is not None:
        if beta.size != dim:
            raise MnnToolError(f"{wf.path}: norm {op.name}: {beta.size} biases for {dim} channels")
        if not np.any(beta):
            beta = None
    return NormWeights(np.ascontiguousarray(gamma, np.float32), beta, float(op.eps), op.rms)


class Embeddings:
    """Token rows as float32: bf16 table (embeddings_bf16.bin), quantized rows (the tied head or
    embeddings_int*.bin, llm_config's tie_embeddings = [values offset, alpha offset, alpha bytes, bits,
    block]), or fp16 rows of a 16-bit tied head."""

    def __init__(self, vocab: int, hidden: int, kind: str, **kw):
        self.vocab, self.hidden, self.kind = vocab, hidden, kind
        self.__dict__.update(kw)

    @classmethod
    def bf16(cls, path, vocab: int, hidden: int) -> Embeddings:
        wf = WeightFile(path)
        if wf.size != vocab * hidden * 2:
            raise MnnToolError(f"{path}: {wf.size} bytes, expected {vocab} x {hidden} bf16 values")
        return cls(vocab, hidden, "bf16", wf=wf, table=wf.buf.view(np.uint16).reshape(vocab, hidden))

    @classmethod
    def quantized(cls, wf: WeightFile, tie: list, vocab: int, hidden: int) -> Embeddings:
        woff, aoff, alen, bits, block = (int(x) for x in tie[:5])
        if bits == 16:
            raw = wf.bytes_view(woff, vocab * hidden * 2, "tied fp16 embeddings")
            table = raw.view(np.float16).reshape(vocab, hidden) if woff % 2 == 0 else \
                np.frombuffer(raw.tobytes(), np.float16).reshape(vocab, hidden)
            return cls(vocab, hidden, "fp16", wf=wf, table=table)
        if bits not in (4, 8):
            raise MnnToolError(f"llm_config.json: tie_embeddings with {bits} bits")
        block = block or hidden
        nb = hidden // block
        codes = wf.bytes_view(woff, vocab * hidden * bits // 8, "embeddings").reshape(vocab, hidden * bits // 8)
        count = alen // 4
        per = count // (vocab * nb) if vocab * nb else 0
        if per not in (1, 2) or per * vocab * nb != count:
            raise MnnToolError(f"llm_config.json: tie_embeddings alpha of {count} values for {vocab} rows x {nb} blocks")
        alpha = wf.bytes_view(aoff, alen, "embedding scales")
        return cls(vocab, hidden, "quant", wf=wf, codes=codes, alpha=alpha, per=per, nb=nb, bits=bits)

    def rows(self, ids) -> np.ndarray:
        ids = np.asarray(ids, np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab):
            raise MnnToolError(f"token id {int(ids.max() if ids.max() >= self.vocab else ids.min())} is outside "
                               f"the vocabulary (0..{self.vocab - 1})")
        if self.kind == "bf16":
            return (self.table[ids].astype(np.uint32) << 16).view(np.float32)
        if self.kind == "fp16":
            return self.table[ids].astype(np.float32)
        # all the rows at once (a prompt's 512 rows took ~25 ms one by one): the rows' bytes gathered
        # (a copy, so the float32 view of their scales is aligned), unpacked, scaled per block
        per, nb, n = self.per, self.nb, ids.size
        half = np.float32(1 << (self.bits - 1))
        a = np.ascontiguousarray(self.alpha.reshape(self.vocab, nb * per * 4)[ids]).view(np.float32).reshape(n, nb, per)
        if per == 2:
            zero, scale = a[:, :, 0], a[:, :, 1]
        else:
            zero, scale = np.zeros((n, nb), np.float32), a[:, :, 0]
        u = unpack(self.codes[ids], self.bits, self.hidden).astype(np.float32).reshape(n, nb, -1)
        return ((u - half) * scale[:, :, None] + zero[:, :, None]).reshape(n, self.hidden)
