"""The engine's steps: linear layers on quantized weights, norms, RoPE, attention over the KV cache.

The numpy reference (`REFERENCE`, tests) and the fast path: linear layers in packed.py / qkernels.py,
the rest in steps.py, one fused step per layer for T tokens (T = 1: decode) over the engine's KV cache.
"""
from __future__ import annotations

import contextlib
import math

import numpy as np

from .weights import NormWeights, QWeight

REFERENCE = False      # tests flip it to run the numpy path
PACKED = True          # 4/8-bit layers repacked for the int16 GEMV/GEMM (packed.py); else read in place


class Linears:
    """Linear layers reading one input (q/k/v, gate/up, or one alone): y_i = x @ w_i.T + bias_i on
    quantized w_i. precision "normal": int16 inputs where the kernels take them, the layers repacked
    together (packed.py); "high": float32 inputs, the file's layout read in place (qkernels.py)."""

    def __init__(self, ws: list, threads: int = 1, precision: str = "normal"):
        self.ws, self.threads = ws, threads
        self.packed = None
        self.fast = [None] * len(ws)
        if not REFERENCE:
            from . import packed, qkernels
            high = precision == "high"
            if PACKED and not high:
                self.packed = packed.PackedLinear.of(ws, threads)
            if self.packed is None:
                self.fast = [qkernels.QLinear.of(w, threads) for w in ws]
        self.nbytes = self.packed.nbytes if self.packed is not None else sum(w.nbytes for w in ws)

    def apply(self, x: np.ndarray) -> list:
        x = np.ascontiguousarray(x, np.float32).reshape(-1, self.ws[0].ic)
        if self.packed is not None:
            return self.packed.apply(x)
        out = []
        for w, fast in zip(self.ws, self.fast):
            if fast is not None:
                out.append(fast.apply(x))
                continue
            y = x @ w.dequantize().T
            if w.bias is not None:
                y += w.bias
            out.append(y)
        return out


class Linear(Linears):
    """One linear layer."""

    def __init__(self, w: QWeight, threads: int = 1, precision: str = "normal"):
        super().__init__([w], threads, precision)
        self.w, self.oc, self.ic = w, w.oc, w.ic

    def apply(self, x: np.ndarray) -> np.ndarray:
        return super().apply(x)[0]


class Workspace:
    """Per-model scratch and the Numba steps bound once (their argument types never change)."""

    def __init__(self, model, layer0):
        from ...runtime.kernels.jit import Bound
        from . import steps
        from .qkernels import _pick
        H = max(L.plan.heads for L in model.layers)
        self.scores = np.empty((H, model.context), np.float32)
        self.dummy = np.zeros(1, np.float32)
        self.norm_rows = Bound(steps.norm_rows)
        self.add_norm_rows = Bound(steps.add_norm_rows)
        self.add_rows = Bound(steps.add_rows)
        self.activate = Bound(steps.activate)
        self.prepare_qkv = Bound(steps.prepare_qkv)
        self.attend_serial = Bound(steps.attend.serial())
        self.attend_parallel = _pick(steps.attend, 1 << 30, model.threads)
        self.tables = np.zeros((1, 1), np.float32)

    def norm_args(self, nw):
        if nw is None:
            return self.dummy, self.dummy, False, 1e-6, True
        beta = nw.beta if nw.beta is not None else self.dummy
        return nw.gamma, beta, nw.beta is not None, float(nw.eps), bool(nw.rms)


SPIN_OF_TUNE_PROCESS = "1000000"     # the spin mnntool.tuning.tune_process sets for the CNN sessions


def wait_policy(threads: int) -> None:
    """At more than one thread, OpenMP's workers sleep between parallel regions (OMP_WAIT_POLICY
    passive) unless the user chose otherwise. A decode step runs ~100 short regions; workers that spin
    between them (tune_process's GOMP_SPINCOUNT, kept for the CNN sessions) take the cores the other
    threads need whenever the host is shared: here, with other jobs on the 2 cores, 2-thread decode ran
    2-6 tokens/s spinning and 24-36 passive (1 thread: 38). Read when OpenMP starts: only before Numba's
    first parallel kernel."""
    import os
    import sys
    if threads <= 1 or "OMP_WAIT_POLICY" in os.environ:
        return
    par = sys.modules.get("numba.np.ufunc.parallel")
    if par is not None and getattr(par, "_is_initialized", False):
        return
    if os.environ.get("GOMP_SPINCOUNT") not in (None, SPIN_OF_TUNE_PROCESS):
        return
    os.environ.pop("GOMP_SPINCOUNT", None)
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"


@contextlib.contextmanager
def threads(n: int):
    """The engine's thread count for Numba's kernels. BLAS (the prefill's attention products) stays at
    one thread, as the runtime keeps it: OpenBLAS's workers spin after each call and, at 2 threads on a
    busy host, took the core Numba's worker needed (prefill 512 tokens: 75 against 126-170 tokens/s)."""
    from ...runtime.settings import Settings
    Settings.of(n).apply()
    yield


def norm(x: np.ndarray, nw: NormWeights) -> np.ndarray:
    x = np.asarray(x, np.float32)
    if nw.rms:
        ms = np.mean(x * x, -1, keepdims=True, dtype=np.float32)
        y = x / np.sqrt(ms + np.float32(nw.eps)) * nw.gamma
    else:
        m = np.mean(x, -1, keepdims=True, dtype=np.float32)
        d = x - m
        v = np.mean(d * d, -1, keepdims=True, dtype=np.float32)
        y = d / np.sqrt(v + np.float32(nw.eps)) * nw.gamma
    if nw.beta is not None:
        y = y + nw.beta
    return y.astype(np.float32)


def _rope(x, cos, sin, pos0):
    """x (T, heads, D): the first rotary_dim channels rotated (rotate-half) at positions pos0.."""
    T = x.shape[0]
    half = cos.shape[1]
    c = np.concatenate([cos[pos0:pos0 + T]] * 2, -1)[:, None, :]
    s = np.concatenate([sin[pos0:pos0 + T]] * 2, -1)[:, None, :]
    xr = x[..., :2 * half]
    x1, x2 = xr[..., :half], xr[..., half:]
    y = xr * c + np.concatenate([-x2, x1], -1) * s
    if 2 * half < x.shape[-1]:
        return np.concatenate([y, x[..., 2 * half:]], -1).astype(np.float32)
    return y.astype(np.float32)


def _gelu_tanh(x):
    return (0.5 * x * (1 + np.tanh(np.float32(math.sqrt(2 / math.pi)) * (x + np.float32(0.044715) * x * x * x)))).astype(np.float32)


def _gelu(x):
    from math import erf
    e = np.vectorize(erf, otypes=[np.float64])(x.astype(np.float64) / math.sqrt(2))
    return (0.5 * x * (1 + e)).astype(np.float32)


def _silu(x):
    return (x / (1 + np.exp(-x))).astype(np.float32)


ACT = {"silu": _silu, "gelu_tanh": _gelu_tanh, "gelu": _gelu}


def attention(model, i: int, layer, q, k, v, pos0: int) -> np.ndarray:
    """q (T, H, D), k/v (T, KV, D) at positions pos0..: write k/v into the cache, attend causally."""
    lp = layer.plan
    T, H, D = q.shape
    KV = lp.kv_heads
    kc, vc = model.k_cache[i], model.v_cache[i]
    kc[:KV, pos0:pos0 + T, :D] = k.transpose(1, 0, 2)
    vc[:KV, pos0:pos0 + T, :D] = v.transpose(1, 0, 2)
    L = pos0 + T
    rep = H // KV
    out = np.empty((T, H, D), np.float32)
    qi = np.arange(pos0, L)[:, None]
    kj = np.arange(L)[None, :]
    allowed = kj <= qi
    if layer.window:
        allowed &= kj > qi - layer.window
    for h in range(H):
        g = h // rep
        s = (q[:, h, :] @ kc[g, :L, :D].T) * np.float32(layer.scale)
        s = np.where(allowed, s, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        out[:, h, :] = s.astype(np.float32) @ vc[g, :L, :D]
    return out


def layer_step(model, i: int, layer, h: np.ndarray, pos0: int) -> np.ndarray:
    """One decoder layer on h (T, hidden) at positions pos0..pos0+T-1."""
    if not model.reference:
        return fast_layer_step(model, i, layer, h, pos0)
    return reference_layer_step(model, i, layer, h, pos0)


def reference_layer_step(model, i: int, layer, h: np.ndarray, pos0: int) -> np.ndarray:
    """The numpy path: the same arithmetic step by step (tests compare the fast path with it)."""
    lp = layer.plan
    T = h.shape[0]
    x = norm(h, layer.in_norm)
    q, k, v = layer.qkv.apply(x)
    q = q.reshape(T, lp.heads, lp.head_dim)
    k = k.reshape(T, lp.kv_heads, lp.head_dim)
    v = v.reshape(T, lp.kv_heads, lp.head_dim)
    if layer.q_norm is not None:
        q = norm(q, layer.q_norm)
    if layer.k_norm is not None:
        k = norm(k, layer.k_norm)
    if layer.cos is not None:
        q = _rope(q, layer.cos, layer.sin, pos0)
        k = _rope(k, layer.cos, layer.sin, pos0)
    a = attention(model, i, layer, q, k, v, pos0).reshape(T, lp.heads * lp.head_dim)
    o = layer.o.apply(a)
    if layer.post_attn_norm is not None:
        o = norm(o, layer.post_attn_norm)
    h = h + o
    x = norm(h, layer.ff_norm)
    parts = layer.mlp_in.apply(x)
    act = ACT[lp.act]
    m = act(parts[0]) * parts[1] if len(parts) == 2 else act(parts[0])
    d = layer.down.apply(m.astype(np.float32))
    if layer.post_ff_norm is not None:
        d = norm(d, layer.post_ff_norm)
    return (h + d).astype(np.float32)


ACT_CODE = {"silu": 0, "gelu_tanh": 1, "gelu": 2}
ATTEND_PARALLEL_MIN = 250_000       # multiply-adds below which attention runs on one thread
ATTEND_BLAS_MIN_T = 16              # queries from which attention is two sgemms per KV head (prefill)
ATTEND_CHUNK = 128                  # queries per chunk of the prefill's attention


def attend_blas(q, kc, vc, pos0: int, window: int, scale, out) -> None:
    """Attention of T queries at positions pos0.. (prefill) as matrix products per KV head: the heads
    sharing one (GQA) stacked, scores (rep*T, L) by sgemm, masked, softmax in float32, times V."""
    T, H, D = q.shape
    KV = kc.shape[0]
    rep = H // KV
    for c0 in range(0, T, ATTEND_CHUNK):        # query chunks: keys only up to the chunk's last position
        c1 = min(T, c0 + ATTEND_CHUNK)
        n = c1 - c0
        L = pos0 + c1
        lo = max(0, pos0 + c0 - window + 1) if window else 0
        qi = np.arange(pos0 + c0, L)[:, None]
        kj = np.arange(lo, L)[None, :]
        banned = kj > qi
        if window:
            banned |= kj <= qi - window
        for g in range(KV):
            qg = np.ascontiguousarray(q[c0:c1, g * rep:(g + 1) * rep, :].transpose(1, 0, 2)).reshape(rep * n, D)
            s = qg @ kc[g, lo:L, :D].T
            s *= scale
            s = s.reshape(rep, n, L - lo)
            s[:, banned] = -np.inf
            s -= s.max(-1, keepdims=True)
            np.exp(s, out=s)
            s /= s.sum(-1, keepdims=True)
            o = s.reshape(rep * n, L - lo) @ vc[g, lo:L, :D]
            out[c0:c1, g * rep:(g + 1) * rep, :] = o.reshape(rep, n, D).transpose(1, 0, 2)


def fast_layer_step(model, i: int, layer, h: np.ndarray, pos0: int) -> np.ndarray:
    """One decoder layer on h (T, hidden), in place, with the Numba steps (steps.py) and quantized
    linear layers (qkernels.py)."""
    ws = model.ws
    lp = layer.plan
    T = h.shape[0]
    H, KV, D = lp.heads, lp.kv_heads, lp.head_dim
    x = np.empty_like(h)
    ws.norm_rows(h, *ws.norm_args(layer.in_norm), x)
    q, k, v = layer.qkv.apply(x)
    q, k, v = q.reshape(T, H, D), k.reshape(T, KV, D), v.reshape(T, KV, D)
    qn, kn = ws.norm_args(layer.q_norm), ws.norm_args(layer.k_norm)
    rope = layer.cos is not None
    cos, sin = (layer.cos, layer.sin) if rope else (ws.tables, ws.tables)
    kc, vc = model.k_cache[i], model.v_cache[i]
    ws.prepare_qkv(q, k, v, qn[0], qn[1], kn[0], kn[1], layer.q_norm is not None, layer.k_norm is not None,
                   qn[3], kn[3], qn[4], kn[4], cos, sin, rope, cos.shape[1], pos0, kc, vc)
    a = np.empty((T, H, D), np.float32)
    if T >= ATTEND_BLAS_MIN_T:
        attend_blas(q, kc, vc, pos0, layer.window, np.float32(layer.scale), a)
    else:
        work = T * (pos0 + T) * H * D
        attend = ws.attend_parallel if model.threads > 1 and work >= ATTEND_PARALLEL_MIN else ws.attend_serial
        attend(q, kc, vc, pos0, layer.window, np.float32(layer.scale), ws.scores, a)
    o = layer.o.apply(a.reshape(T, H * D))
    pa = ws.norm_args(layer.post_attn_norm)
    ws.add_norm_rows(h, o, pa[0], pa[1], pa[2], layer.post_attn_norm is not None, pa[3], pa[4],
                     *ws.norm_args(layer.ff_norm), x)
    parts = layer.mlp_in.apply(x)
    gated = len(parts) == 2
    if T > 2 and lp.act != "gelu":     # numpy's exp and tanh are vectorized (Numba's, without SVML, not)
        m = ACT[lp.act](parts[0])
        if gated:
            m *= parts[1]
    else:
        m = np.empty_like(parts[-1])
        ws.activate(parts[0], parts[-1], ACT_CODE[lp.act], gated, m)
    d = layer.down.apply(m)
    pf = ws.norm_args(layer.post_ff_norm)
    ws.add_rows(h, d, pf[0], pf[1], pf[2], layer.post_ff_norm is not None, pf[3], pf[4])
    return h
