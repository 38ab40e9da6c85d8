"""The int8 KV cache (`load(dir, kv_int8=True)`): K and V stored as 8-bit codes, a quarter of the
float32 cache's bytes (plus 8 bytes of scale and minimum per head and position), half a 16-bit one's.

How MNN-LLM does it (`attention_mode` 2 / 10, source/backend/cpu/CPUKVCacheManager.cpp and
MNNQuantAttentionKey/Value in compute/CommonOptFunction.cpp):
  K  per token, asymmetric over the head's channels: scale = (max - min) / 255, codes in int8 with a
     bias (min + 128 scale), after subtracting a per-channel vector (the channels' max over the prompt)
     that only shifts every score of a query by the same amount;
  V  per channel, asymmetric, its scale and minimum fixed from the first prefill's tokens (later
     tokens quantized with them).
Here both K and V are per token (per KV head and position: a scale and a minimum over the head_dim
channels, codes u = round((x - min) / scale) in 0..255): V's per-channel range fixed at the first
prefill clips every later value outside it (a decode that starts from a one-token prompt has no range
at all), per token it cannot. K keeps MNN's per-channel shift, here the mean of each channel over the
first write (prefill), fixed after: channel offsets (the outlier channels K is known for) leave the
per-token range, and q . shift is added back so the scores are those of the dequantized keys:

    k^ = u_k * s_k + m_k + shift        v^ = u_v * s_v + m_v
    score_j = s_kj (q . u_kj) + m_kj sum(q) + q . shift        out = sum_j p_j s_vj u_vj + sum_j p_j m_vj

The numpy functions (`quantize`, `dequantize`) are the reference the tests hold the Numba kernels to.
"""
from __future__ import annotations

import numpy as np

from ...runtime.kernels.compile.jit import njit, prange

LEVELS = 255


# ------------------------------------------------------------------------------------ reference

def quantize(x: np.ndarray):
    """x (..., D) float32 -> (codes uint8 (..., D), scale (...), minimum (...)) per last-axis row."""
    x = np.asarray(x, np.float32)
    lo, hi = x.min(-1), x.max(-1)
    s = ((hi - lo) / np.float32(LEVELS)).astype(np.float32)
    safe = np.where(s > 0, s, np.float32(1))
    inv = (np.float32(1) / safe).astype(np.float32)
    u = np.floor((x - lo[..., None]) * inv[..., None] + np.float32(0.5))
    u = np.where(s[..., None] > 0, np.clip(u, 0, LEVELS), 0).astype(np.uint8)
    return u, s, lo.astype(np.float32)


def dequantize(u, s, lo, shift=None) -> np.ndarray:
    x = u.astype(np.float32) * s[..., None] + lo[..., None]
    if shift is not None:
        x += shift
    return x.astype(np.float32)


class KV8:
    """Per layer: codes kq/vq (KV, context, D) uint8, ks/km/vs/vm (KV, context) float32, shift (KV, D)."""

    def __init__(self, layers: int, kv: int, context: int, dim: int):
        self.kq = np.zeros((layers, kv, context, dim), np.uint8)
        self.vq = np.zeros((layers, kv, context, dim), np.uint8)
        self.ks, self.km, self.vs, self.vm = (np.zeros((layers, kv, context), np.float32) for _ in range(4))
        self.shift = np.zeros((layers, kv, dim), np.float32)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.kq, self.vq, self.ks, self.km, self.vs, self.vm, self.shift))

    def layer(self, i: int):
        return self.kq[i], self.ks[i], self.km[i], self.shift[i], self.vq[i], self.vs[i], self.vm[i]

    def write_reference(self, i: int, k: np.ndarray, v: np.ndarray, pos0: int) -> None:
        """numpy: k/v (T, KV, D) of positions pos0.. into layer i (the shift set when pos0 == 0)."""
        kq, ks, km, shift, vq, vs, vm = self.layer(i)
        T, KV, D = k.shape
        if pos0 == 0:
            shift[:KV, :D] = k.mean(0, dtype=np.float32)
        u, s, lo = quantize(k - shift[:KV, :D])
        kq[:KV, pos0:pos0 + T, :D], ks[:KV, pos0:pos0 + T], km[:KV, pos0:pos0 + T] = (
            u.transpose(1, 0, 2), s.T, lo.T)
        u, s, lo = quantize(v)
        vq[:KV, pos0:pos0 + T, :D], vs[:KV, pos0:pos0 + T], vm[:KV, pos0:pos0 + T] = (
            u.transpose(1, 0, 2), s.T, lo.T)

    def rows(self, i: int, g: int, lo: int, hi: int, D: int):
        """Dequantized K and V rows lo..hi of layer i's KV head g: (hi - lo, D) float32 each."""
        kq, ks, km, shift, vq, vs, vm = self.layer(i)
        k = dequantize(kq[g, lo:hi, :D], ks[g, lo:hi], km[g, lo:hi], shift[g, :D])
        v = dequantize(vq[g, lo:hi, :D], vs[g, lo:hi], vm[g, lo:hi])
        return k, v


# ------------------------------------------------------------------------------------ Numba

@njit(cache=True)
def _quant_row(x, shift, has_shift, u, s, m, h, p):
    D = x.size
    lo = np.float32(np.inf)
    hi = np.float32(-np.inf)
    for d in range(D):
        a = x[d] - shift[d] if has_shift else x[d]
        if a < lo:
            lo = a
        if a > hi:
            hi = a
    sc = (hi - lo) / np.float32(LEVELS)
    s[h, p] = sc
    m[h, p] = lo
    if sc > 0:
        inv = np.float32(1) / sc
        for d in range(D):
            a = x[d] - shift[d] if has_shift else x[d]
            c = np.floor((a - lo) * inv + np.float32(0.5))
            if c > LEVELS:
                c = LEVELS
            if c < 0:
                c = 0
            u[h, p, d] = np.uint8(c)
    else:
        for d in range(D):
            u[h, p, d] = 0


@njit(cache=True)
def write(k, v, pos0, kq, ks, km, shift, vq, vs, vm):
    """k/v (T, KV, D) at positions pos0.. into one layer's int8 cache; at pos0 == 0 the shift is set to
    the mean of each K channel over these tokens."""
    T, KV, D = k.shape
    if pos0 == 0:
        for h in range(KV):
            for d in range(D):
                t_ = np.float32(0)
                for t in range(T):
                    t_ += k[t, h, d]
                shift[h, d] = t_ / np.float32(T)
    for t in range(T):
        p = pos0 + t
        for h in range(KV):
            _quant_row(k[t, h], shift[h], True, kq, ks, km, h, p)
            _quant_row(v[t, h], shift[h], False, vq, vs, vm, h, p)


@njit(parallel=True, cache=True, fastmath=True)
def attend(q, kq, ks, km, shift, vq, vs, vm, pos0, window, scale, scores, out):
    """out (T, H, D) = softmax(q k^T * scale) v over the int8 cache (the decode's few queries), causal,
    sliding when window > 0; parallel over heads. scores: (H, context) scratch."""
    T, H, D = q.shape
    KV = kq.shape[0]
    rep = H // KV
    for h in prange(H):
        g = h // rep
        sc = scores[h]
        acc = np.empty(D, np.float32)
        for t in range(T):
            p = pos0 + t
            lo = 0
            if window > 0 and p - window + 1 > 0:
                lo = p - window + 1
            qv = q[t, h]
            qsum = np.float32(0)
            qsh = np.float32(0)
            for d in range(D):
                qsum += qv[d]
                qsh += qv[d] * shift[g, d]
            m = np.float32(-np.inf)
            for j in range(lo, p + 1):
                kr = kq[g, j]
                dot = np.float32(0)
                for d in range(D):
                    dot += qv[d] * np.float32(kr[d])
                s = (dot * ks[g, j] + km[g, j] * qsum + qsh) * scale
                sc[j] = s
                if s > m:
                    m = s
            tot = np.float32(0)
            for j in range(lo, p + 1):
                e = np.exp(sc[j] - m)
                sc[j] = e
                tot += e
            inv = np.float32(1) / tot
            acc[:] = 0
            bias = np.float32(0)
            for j in range(lo, p + 1):
                w = sc[j] * inv
                a = w * vs[g, j]
                bias += w * vm[g, j]
                vr = vq[g, j]
                for d in range(D):
                    acc[d] += a * np.float32(vr[d])
            for d in range(D):
                out[t, h, d] = acc[d] + bias
