"""The small steps around the linear layers, in Numba, for T tokens at once (T = 1 when decoding):
norms, q/k norms + RoPE + the KV cache write, attention over the cache, the MLP activation, residuals.

Attention reads the cache in place ((kv_heads, context, head_dim) per layer) for positions up to each
query's own (causal), from `window` back when the layer slides; scores and softmax in float32, as MNN's
CPU Attention in its exact mode. Parallel over heads (prange) when the engine runs more than one thread.
"""
from __future__ import annotations

import math

import numpy as np

from ...runtime.kernels.compile.jit import njit, prange


@njit(cache=True, fastmath=False)
def _norm_row(x, gamma, beta, has_beta, eps, rms, out):
    n = x.size
    if rms:
        ss = np.float32(0)
        for j in range(n):
            ss += x[j] * x[j]
        inv = np.float32(1) / np.sqrt(ss / np.float32(n) + eps)
        for j in range(n):
            out[j] = x[j] * inv * gamma[j]
    else:
        m = np.float32(0)
        for j in range(n):
            m += x[j]
        m /= np.float32(n)
        v = np.float32(0)
        for j in range(n):
            d = x[j] - m
            v += d * d
        inv = np.float32(1) / np.sqrt(v / np.float32(n) + eps)
        for j in range(n):
            out[j] = (x[j] - m) * inv * gamma[j]
    if has_beta:
        for j in range(n):
            out[j] += beta[j]


@njit(cache=True)
def norm_rows(x, gamma, beta, has_beta, eps, rms, out):
    """out[t] = norm(x[t]) for x (T, n)."""
    for t in range(x.shape[0]):
        _norm_row(x[t], gamma, beta, has_beta, eps, rms, out[t])


@njit(cache=True)
def add_norm_rows(h, a, post_g, post_b, post_has_b, post_on, post_eps, post_rms, g, b, has_b, eps, rms, out):
    """h += norm_post(a) (when post_on), then out = norm(h), row by row (T, n)."""
    for t in range(h.shape[0]):
        if post_on:
            _norm_row(a[t], post_g, post_b, post_has_b, post_eps, post_rms, a[t])
        for j in range(h.shape[1]):
            h[t, j] += a[t, j]
        _norm_row(h[t], g, b, has_b, eps, rms, out[t])


@njit(cache=True)
def add_rows(h, a, post_g, post_b, post_has_b, post_on, post_eps, post_rms):
    """h += norm_post(a) (when post_on)."""
    for t in range(h.shape[0]):
        if post_on:
            _norm_row(a[t], post_g, post_b, post_has_b, post_eps, post_rms, a[t])
        for j in range(h.shape[1]):
            h[t, j] += a[t, j]


@njit(parallel=True, cache=True)
def norm_rows_par(x, gamma, beta, has_beta, eps, rms, out):
    """norm_rows over the tokens in parallel (prefill at more than one thread)."""
    for t in prange(x.shape[0]):
        _norm_row(x[t], gamma, beta, has_beta, eps, rms, out[t])


@njit(parallel=True, cache=True)
def add_norm_rows_par(h, a, post_g, post_b, post_has_b, post_on, post_eps, post_rms, g, b, has_b, eps, rms, out):
    """add_norm_rows over the tokens in parallel."""
    for t in prange(h.shape[0]):
        if post_on:
            _norm_row(a[t], post_g, post_b, post_has_b, post_eps, post_rms, a[t])
        for j in range(h.shape[1]):
            h[t, j] += a[t, j]
        _norm_row(h[t], g, b, has_b, eps, rms, out[t])


@njit(parallel=True, cache=True)
def add_rows_par(h, a, post_g, post_b, post_has_b, post_on, post_eps, post_rms):
    """add_rows over the tokens in parallel."""
    for t in prange(h.shape[0]):
        if post_on:
            _norm_row(a[t], post_g, post_b, post_has_b, post_eps, post_rms, a[t])
        for j in range(h.shape[1]):
            h[t, j] += a[t, j]


@njit(cache=True, fastmath=True)
def _gelu_tanh(x):
    return np.float32(0.5) * x * (np.float32(1) + math.tanh(np.float32(0.7978845608028654) * (x + np.float32(0.044715) * x * x * x)))


@njit(cache=True)
def activate(gate, up, act, gated, out):
    """out = act(gate) * up (gated) or act(up); act 0 silu, 1 gelu (tanh), 2 gelu (erf)."""
    T, n = out.shape
    for t in range(T):
        for j in range(n):
            g = gate[t, j] if gated else up[t, j]
            if act == 0:
                a = g / (np.float32(1) + np.exp(-g))
            elif act == 1:
                a = _gelu_tanh(g)
            else:
                a = np.float32(0.5 * g * (1.0 + math.erf(g / math.sqrt(2.0))))
            out[t, j] = a * up[t, j] if gated else a


@njit(cache=True)
def _rope_head(x, cos, sin, p, half):
    """rotate-half RoPE of x (D,) at position p on the first 2*half channels."""
    for j in range(half):
        c, s = cos[p, j], sin[p, j]
        a, b = x[j], x[j + half]
        x[j] = a * c - b * s
        x[j + half] = b * c + a * s


@njit(cache=True)
def prepare_qkv(q, k, v, qn, qn_b, kn, kn_b, qn_on, kn_on, eps_q, eps_k, rms_q, rms_k, cos, sin, rope_on, half,
                pos0, kc, vc, write):
    """q (T, H, D), k/v (T, KV, D): per-head norms, RoPE at positions pos0.., then (write) k and v into
    the cache (kc/vc (KV, context, Dmax)); the int8 cache is written by kv8.write."""
    T, H, D = q.shape
    KV = k.shape[1]
    for t in range(T):
        p = pos0 + t
        for h in range(H):
            if qn_on:
                _norm_row(q[t, h], qn, qn_b, False, eps_q, rms_q, q[t, h])
            if rope_on:
                _rope_head(q[t, h], cos, sin, p, half)
        for h in range(KV):
            if kn_on:
                _norm_row(k[t, h], kn, kn_b, False, eps_k, rms_k, k[t, h])
            if rope_on:
                _rope_head(k[t, h], cos, sin, p, half)
            if write:
                for j in range(D):
                    kc[h, p, j] = k[t, h, j]
                    vc[h, p, j] = v[t, h, j]


@njit(parallel=True, cache=True, fastmath=True)
def attend(q, kc, vc, pos0, window, scale, scores, out):
    """out (T, H, D) = softmax(q k^T * scale) v over the cache, causal, sliding when window > 0.
    scores: (H, context) scratch. fastmath: the dot products and sums vectorized (reassociated). (A
    K-transposed cache with the scores accumulated along the keys ran 5-12x slower here: LLVM did not
    vectorize the read-modify-write of the score row, which may alias K's.)"""
    T, H, D = q.shape
    KV = kc.shape[0]
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
            m = np.float32(-np.inf)
            for j in range(lo, p + 1):
                kv = kc[g, j]
                s = np.float32(0)
                for d in range(D):
                    s += qv[d] * kv[d]
                s *= scale
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
            for j in range(lo, p + 1):
                w = sc[j] * inv
                vv = vc[g, j]
                for d in range(D):
                    acc[d] += w * vv[d]
            for d in range(D):
                out[t, h, d] = acc[d]
