"""Weight-only int4 / int8 (and fp16) linear layers on the weight file's bytes as they lie in the memory
map, in Numba, with float32 inputs: the engine's precision "high", its 16-bit layers, and what the
repacked int16 path (packed.py) does not take.

decode (one token): a GEMV that streams the stored values once, 4 rows at a time (qdot.py), with the
    dequantization fused: y[r] = sum_b scale[r,b] * (u_rb . x_b) + offset[r,b] * sum(x_b) + bias[r];
    parallel over groups of rows (prange) at more than one thread.
prefill (many tokens): the stored values dequantized to float32 a panel of rows at a time (kept in
    cache) and multiplied by every token's input at once (sgemm), so the weights are read once per
    prompt, not once per token.
"""
from __future__ import annotations

import numpy as np

from ...runtime.kernels.micro.float_gemm import prefetch_lines
from ...runtime.kernels.micro.float_gemv import ROWS
from ...runtime.kernels.micro.llvm_ir import host_has
from ...runtime.kernels.compile.jit import Bound, njit, prange
from .qdot import GROUP, qdot_f16, qdot_u4, qdot_u8
from .weights import QWeight

KIND = {4: 0, 8: 1, 16: 2}
STEP = {4: 32, 8: 16, 16: 16}       # values per 16-lane step of qdot
AHEAD = 4                          # groups of rows prefetched ahead (4.7 -> ~7.5 GB/s cold at one thread here)
HAS_I16 = host_has("avx512bw")     # vpmaddwd on zmm: the packed int16 kernels (packed.py)
PANEL_FLOATS = 256 * 1024           # rows dequantized per sgemm: ~1 MB of float32


@njit(cache=True)
def permute32(x, xp):
    """xp: x with each group of 32 values reordered odd positions first, then even ones (the order
    in which qdot16_u4 meets the low and high nibbles of the file's bytes)."""
    for g in range(x.size // 32):
        b = g * 32
        for j in range(16):
            xp[b + j] = x[b + 2 * j + 1]
            xp[b + 16 + j] = x[b + 2 * j]


@njit(cache=True, fastmath=True)
def block_sums(x, blk, xs):
    for b in range(xs.size):
        t = np.float32(0)
        for j in range(b * blk, (b + 1) * blk):
            t += x[j]
        xs[b] = t


@njit(parallel=True, cache=True)
def qgemv(codes, kind, scale, offset, bias, x, xp, xs, blk, ahead_groups, y):
    """y = W x + bias for W stored as `codes` (oc, row bytes) uint8 of `kind` 0 (u4), 1 (u8), 2 (f16)."""
    O, rb = codes.shape
    nb = scale.shape[1]
    K = nb * blk
    if kind == 0:
        permute32(x, xp)
    else:
        xp[:] = x
    block_sums(x, blk, xs)
    cf, sf = codes.reshape(-1), scale.reshape(-1)
    for g in prange((O + GROUP - 1) // GROUP):
        o = g * GROUP
        n = min(GROUP, O - o)
        ahead = o + ahead_groups * GROUP
        if ahead_groups > 0 and ahead < O:       # rows a few groups on, into L2: the memory latency overlaps the arithmetic
            prefetch_lines(cf, ahead * rb, (min(GROUP, O - ahead) * rb) // 4)
        if kind == 0:
            qdot_u4(cf, o * rb, rb, xp, K, blk, sf, o * nb, nb, y, o, n)
        elif kind == 1:
            qdot_u8(cf, o * rb, rb, xp, K, blk, sf, o * nb, nb, y, o, n)
        else:
            qdot_f16(cf, o * rb, rb, xp, K, blk, sf, o * nb, nb, y, o, n)
        for r in range(o, o + n):
            t = y[r] + bias[r]
            for b in range(nb):
                t += offset[r, b] * xs[b]
            y[r] = t


@njit(parallel=True, cache=True)
def dequant_rows(codes, kind, scale, offset, r0, r1, out):
    """out[r - r0, :] = the float32 weights of rows r0..r1 (u4 / u8; fp16 is converted by numpy)."""
    nb = scale.shape[1]
    K = out.shape[1]
    blk = K // nb
    for r in prange(r0, r1):
        o = r - r0
        for b in range(nb):
            s = scale[r, b]
            f = offset[r, b]
            if kind == 0:
                for j in range(b * blk // 2, (b + 1) * blk // 2):
                    v = codes[r, j]
                    out[o, 2 * j] = np.float32(v >> 4) * s + f
                    out[o, 2 * j + 1] = np.float32(v & 15) * s + f
            else:
                for j in range(b * blk, (b + 1) * blk):
                    out[o, j] = np.float32(codes[r, j]) * s + f


# Work (element operations) from which the engine's kernels run in parallel at more than one thread: the
# engine's own bound, not the runtime's host-measured one (runtime/host_tuning.py, probed with the CNN
# kernels and measured again in every process while the host is busy): with it, the same 0.5B bundle's
# decode opened 25 parallel regions per token in one bench child (q/k/v, o and down serial) and 97 in
# another. Every linear layer of a 0.5B-sized model is far above it; the Xeon results were taken with it.
PARALLEL_MIN = 250_000


def _pick(fn, work: int, threads: int):
    """At one thread the serial twin (no OpenMP region at all: on a busy host a region can wait a
    scheduler slice for a worker), else the parallel kernel from PARALLEL_MIN work."""
    if threads <= 1 or work < PARALLEL_MIN:
        return Bound(fn.serial())
    return fn.dispatcher()


class QLinear:
    """A quantized linear layer's fast path; `of` returns None where the layout does not suit it."""

    def __init__(self, w: QWeight, threads: int):
        self.w, self.threads = w, threads
        self.oc, self.ic = w.oc, w.ic
        self.kind = KIND[w.bits]
        if w.bits == 16:
            self.codes = w.codes.view(np.uint8).reshape(w.oc, 2 * w.ic)
            self.scale = np.ones((w.oc, 1), np.float32)
            self.offset = np.zeros((w.oc, 1), np.float32)
            self.blk = w.ic
        else:
            self.codes, self.scale, self.offset, self.blk = w.codes, w.scale, w.offset, w.block
        self.bias = np.zeros(w.oc, np.float32) if w.bias is None else np.ascontiguousarray(w.bias, np.float32)
        self.xp = np.empty(w.ic, np.float32)
        self.xs = np.empty(self.scale.shape[1], np.float32)
        self.gemv = _pick(qgemv, self.codes.size, threads)
        self.ahead = AHEAD
        self.dequant = _pick(dequant_rows, self.codes.size, threads)
        self.panel_rows = max(ROWS, min(w.oc, PANEL_FLOATS // max(w.ic, 1)))

    @staticmethod
    def of(w: QWeight, threads: int):
        if w.ic % STEP[w.bits] or (w.bits != 16 and w.block % STEP[w.bits]):
            return None
        return QLinear(w, threads)

    def matvec(self, x: np.ndarray, y: np.ndarray) -> None:
        self.gemv(self.codes, self.kind, self.scale, self.offset, self.bias, x, self.xp, self.xs, self.blk, self.ahead, y)

    def weights(self, r0: int, r1: int, out: np.ndarray) -> np.ndarray:
        if self.kind == 2:
            out[:r1 - r0] = self.w.codes[r0:r1]
        else:
            self.dequant(self.codes, self.kind, self.scale, self.offset, r0, r1, out)
        return out[:r1 - r0]

    def apply(self, x: np.ndarray, y: np.ndarray | None = None) -> np.ndarray:
        T = x.shape[0]
        if y is None:
            y = np.empty((T, self.oc), np.float32)
        if T <= 2:
            for t in range(T):
                self.matvec(x[t], y[t])
            return y
        panel = np.empty((self.panel_rows, self.ic), np.float32)
        for r0 in range(0, self.oc, self.panel_rows):
            r1 = min(self.oc, r0 + self.panel_rows)
            w = self.weights(r0, r1, panel)
            np.matmul(x, w.T, out=y[:, r0:r1])
        y += self.bias
        return y
