"""The engine's steps: linear layers on quantized weights, norms, RoPE, attention over the KV cache.

The numpy reference (`REFERENCE`, tests) and the fast path: linear layers in packed.py / qkernels.py,
the rest in steps.py, one fused step per layer for T tokens (T = 1: decode) over the engine's KV cache.
"""
from __future__ import annotations

import contextlib
import math
import time

import numpy as np

from .weights import NormWeights, QWeight

REFERENCE = False      # tests flip it to run the numpy path
PACKED = True          # 4/8-bit layers repacked for the int16 GEMV/GEMM (packed.py); else read in place
FUSED_OFF = False      # tests flip it: decode by fast_layer_step's separate calls, not decode_step's fused ones


class Linears:
    """Linear layers reading one input (q/k/v, gate/up, or one alone): y_i = x @ w_i.T + bias_i on
    quantized w_i. precision "normal": int16 inputs where the kernels take them, the layers repacked
    together (packed.py); "high": float32 inputs, the file's layout read in place (qkernels.py)."""

    def __init__(self, ws: list, threads: int = 1, precision: str = "normal", arena=None):
        self.ws, self.threads = ws, threads
        self.packed = None
        self.fast = [None] * len(ws)
        if not REFERENCE:
            from . import packed, qkernels
            high = precision == "high"
            if PACKED and not high:
                self.packed = packed.PackedLinear.of(ws, threads, arena)
            if self.packed is None:
                self.fast = [qkernels.QLinear.of(w, threads) for w in ws]
        self.nbytes = self.packed.nbytes if self.packed is not None else sum(w.nbytes for w in ws)

    def apply(self, x: np.ndarray, copy: bool = True) -> list:
        """Each layer's (T, oc) output; copy=False: views of one (T, rows) array where the layers were
        packed together (no copy of the outputs; the views are not contiguous when T > 1)."""
        x = np.ascontiguousarray(x, np.float32).reshape(-1, self.ws[0].ic)
        if self.packed is not None:
            return self.packed.apply(x, copy)
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

    def regions(self, T: int) -> int:
        """The parallel regions one apply opens (the profile's count): 0 where the serial twin runs."""
        from ...runtime.kernels.compile.jit import Bound
        if self.packed is not None:
            from .packed import GEMM_PARALLEL_MIN
            if T > 1 and T * self.packed.w.size < GEMM_PARALLEL_MIN:
                return 0
            fn = self.packed.gemv if T == 1 else self.packed.gemm
            return 0 if isinstance(fn, Bound) else (1 if T == 1 else 2)
        fast = [f for f in self.fast if f is not None]
        if not fast:
            return 0
        fn = fast[0].gemv if T <= 2 else fast[0].dequant
        return 0 if isinstance(fn, Bound) else len(fast) * (T if T <= 2 else 1)


class Linear(Linears):
    """One linear layer."""

    def __init__(self, w: QWeight, threads: int = 1, precision: str = "normal", arena=None):
        super().__init__([w], threads, precision, arena)
        self.w, self.oc, self.ic = w, w.oc, w.ic

    def apply(self, x: np.ndarray, copy: bool = True) -> np.ndarray:
        return super().apply(x, copy)[0]


class Workspace:
    """Per-model scratch and the Numba steps bound once (their argument types never change)."""

    def __init__(self, model, layer0):
        from ...runtime.kernels.compile.jit import Bound
        from . import steps
        from .qkernels import _pick
        H = max(L.plan.heads for L in model.layers)
        self.scores = np.empty((H, model.context), np.float32)
        self.dummy = np.zeros(1, np.float32)
        self._norm_args, self._keep, self._scratch, self._fused = {}, [], {}, {}
        self.norm_rows = Bound(steps.norm_rows)
        self.add_norm_rows = Bound(steps.add_norm_rows)
        self.add_rows = Bound(steps.add_rows)
        self.activate = Bound(steps.activate)
        self.prepare_qkv = Bound(steps.prepare_qkv)
        self.attend_serial = Bound(steps.attend.serial())
        self.attend_parallel = _pick(steps.attend, 1 << 30, model.threads)
        if model.kv8 is not None:
            from . import kv8
            self.write8 = Bound(kv8.write)
            self.attend8_serial = Bound(kv8.attend.serial())
            self.attend8_parallel = _pick(kv8.attend, 1 << 30, model.threads)
        self.tables = np.zeros((1, 1), np.float32)
        import os
        passive = os.environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE"
        self.attend_min = ATTEND_PARALLEL_MIN if passive else ATTEND_PARALLEL_MIN_SPIN
        # prefill at more than one thread: the norms over the tokens in parallel (Numba), and a pool of
        # Python threads for the NumPy steps (attention's sgemms and softmax, the activation), which let
        # go of the GIL; decode (one token) runs them serially: a region costs more than the work
        self.pool = None
        if model.threads > 1:
            from concurrent.futures import ThreadPoolExecutor
            self.pool = ThreadPoolExecutor(model.threads, thread_name_prefix="mnntool-llm")
            self.norm_rows_par = steps.norm_rows_par.dispatcher()
            self.add_norm_rows_par = steps.add_norm_rows_par.dispatcher()
            self.add_rows_par = steps.add_rows_par.dispatcher()

    def norm_args(self, nw):
        """The norm kernels' arguments for `nw` (made once per norm: ~5 per layer and token)."""
        got = self._norm_args.get(id(nw))
        if got is None:
            if nw is None:
                got = (self.dummy, self.dummy, False, 1e-6, True)
            else:
                beta = nw.beta if nw.beta is not None else self.dummy
                got = (nw.gamma, beta, nw.beta is not None, float(nw.eps), bool(nw.rms))
            self._norm_args[id(nw)] = got
            self._keep.append(nw)          # the id stays this object's while the workspace lives
        return got

    def fused(self, layer):
        """For decode_step: (q, k, v views (1, heads, D) of the q/k/v GEMV's output, activation code),
        or None where the layer does not suit the fused calls (a layer not packed, post-norms, GELU by
        erf, gate/up not of whole groups). Decided once per layer."""
        got = self._fused.get(id(layer))
        if got is None:
            lp = layer.plan
            lins = (layer.qkv, layer.o, layer.mlp_in, layer.down)
            ok = (all(lin.packed is not None for lin in lins) and layer.post_attn_norm is None
                  and layer.post_ff_norm is None and len(layer.mlp_in.ws) == 2 and layer.mlp_in.packed.glu
                  and lp.act in ("silu", "gelu_tanh") and layer.in_norm is not None and layer.ff_norm is not None)
            got = False
            if ok:
                q, k, v = layer.qkv.packed.views1
                got = (q.reshape(1, lp.heads, lp.head_dim), k.reshape(1, lp.kv_heads, lp.head_dim),
                       v.reshape(1, lp.kv_heads, lp.head_dim), ACT_CODE[lp.act])
            self._fused[id(layer)] = got
            self._keep.append(layer)
        return got or None

    def scratch(self, name: str, shape) -> np.ndarray:
        """A float32 buffer reused by every decode step (one token: its shapes never change)."""
        buf = self._scratch.get(name)
        if buf is None or buf.shape != shape:
            buf = self._scratch[name] = np.empty(shape, np.float32)
        return buf


SPIN_OF_TUNE_PROCESS = "1000000"     # the spin mnntool.threadpool.tune_process sets for the CNN sessions


SPIN_BETWEEN_REGIONS = "2000"      # GOMP_SPINCOUNT for the engine: spin that long, then sleep


def passive_wait(threads: int, env=None) -> bool:
    """Whether OpenMP's workers should sleep at once between parallel regions (OMP_WAIT_POLICY passive):
    only when there are more threads than cores the process may use, unless the user chose a policy.
    Otherwise they spin briefly (SPIN_BETWEEN_REGIONS) and then sleep. A decode step runs ~100 short
    regions: a sleeping worker costs a futex wake-up in each (tens of us), an endless spin takes the cores
    the other threads need on a shared host. Measured on the 16-core Xeon (0.5B 4-bit, p512 n128,
    benchmarks/llm_threads.py, docs/results/llm_threads_xeon16_spin.json), decode tok/s against the
    previous policy (tune_process's 10^6 spins, passive at every core): 2 threads 41.4 vs 28.5, 8 threads
    115.6 vs 102.1, 16 threads 149.2 vs 82.1; 4 threads equal."""
    import os
    env = os.environ if env is None else env
    if threads <= 1 or "OMP_WAIT_POLICY" in env:
        return False
    if env.get("GOMP_SPINCOUNT") not in (None, SPIN_OF_TUNE_PROCESS, SPIN_BETWEEN_REGIONS):
        return False
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return threads > cores


def wait_env(threads: int, env) -> None:
    """Set in `env` (a child's environment, or os.environ) the wait policy `passive_wait` chooses: passive
    beyond the cores, else a bounded spin (unless the user set GOMP_SPINCOUNT or OMP_WAIT_POLICY)."""
    if passive_wait(threads, env):
        env.pop("GOMP_SPINCOUNT", None)
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    elif threads > 1 and "OMP_WAIT_POLICY" not in env and \
            env.get("GOMP_SPINCOUNT") in (None, SPIN_OF_TUNE_PROCESS):
        env["GOMP_SPINCOUNT"] = SPIN_BETWEEN_REGIONS


def wait_policy(threads: int) -> None:
    """The wait policy for this process (`passive_wait`); read when OpenMP starts: only before Numba's
    first parallel kernel."""
    import os
    import sys
    par = sys.modules.get("numba.np.ufunc.parallel")
    if par is not None and getattr(par, "_is_initialized", False):
        return
    wait_env(threads, os.environ)


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
    L = pos0 + T
    if model.kv8 is not None:       # quantized on the way in, attended dequantized (kv8.py)
        model.kv8.write_reference(i, k, v, pos0)
        rows = [model.kv8.rows(i, g, 0, L, D) for g in range(KV)]
        kc = np.stack([r[0] for r in rows])
        vc = np.stack([r[1] for r in rows])
    else:
        kc, vc = model.k_cache[i], model.v_cache[i]
        kc[:KV, pos0:pos0 + T, :D] = k.transpose(1, 0, 2)
        vc[:KV, pos0:pos0 + T, :D] = v.transpose(1, 0, 2)
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
ATTEND_PARALLEL_MIN = 250_000       # multiply-adds below which attention runs on one thread (workers asleep)
ATTEND_PARALLEL_MIN_SPIN = 60_000   # ... with workers spinning between regions (a region costs a few us)
ATTEND_BLAS_MIN_T = 16              # queries from which attention is two sgemms per KV head (prefill)
ATTEND_CHUNK = 128                  # queries per chunk of the prefill's attention (at one thread)
PREFILL_PARALLEL_MIN = 1 << 15     # tokens x hidden from which a prefill's norms, attention and activation go parallel
ATTEND_POOL_MAX = 4                 # pool threads for the prefill's attention items (run_spread)
ACT_POOL_MAX = 8                    # ... and for its activation (16-core Xeon: 88 ms at 4, 57 at 8, 70 at 16)
ATTEND_CHUNK_MIN = 32               # ... at more threads: chunks sized so that every thread gets a few


def _attend_item(q, kc, vc, pos0: int, window: int, scale, c0: int, c1: int, g: int, rep: int, out,
                 kv8=None) -> None:
    """Queries c0..c1 of the rep heads sharing KV head g: scores (rep*n, L) by sgemm, masked (an additive
    0 / -inf mask: a ufunc, which lets go of the GIL, where boolean indexing does not), softmax in
    float32, times V. kv8: (the int8 cache, layer): its rows dequantized first."""
    D = q.shape[2]
    n = c1 - c0
    L = pos0 + c1
    lo = max(0, pos0 + c0 - window + 1) if window else 0
    qi = np.arange(pos0 + c0, L)[:, None]
    kj = np.arange(lo, L)[None, :]
    banned = kj > qi
    if window:
        banned |= kj <= qi - window
    qg = np.ascontiguousarray(q[c0:c1, g * rep:(g + 1) * rep, :].transpose(1, 0, 2)).reshape(rep * n, D)
    if kv8 is not None:
        kg, vg = kv8[0].rows(kv8[1], g, lo, L, D)
    else:
        kg, vg = kc[g, lo:L, :D], vc[g, lo:L, :D]
    s = qg @ kg.T
    s *= scale
    s = s.reshape(rep, n, L - lo)
    if banned.any():
        s += np.where(banned, np.float32(-np.inf), np.float32(0))
    s -= s.max(-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(-1, keepdims=True)
    o = s.reshape(rep * n, L - lo) @ vg
    out[c0:c1, g * rep:(g + 1) * rep, :] = o.reshape(rep, n, D).transpose(1, 0, 2)


def attend_blas(q, kc, vc, pos0: int, window: int, scale, out, pool=None, threads: int = 1, kv8=None) -> None:
    """Attention of T queries at positions pos0.. (prefill) as matrix products per KV head and chunk of
    queries. With a thread pool the (chunk, KV head) items run on its threads, the costliest (latest)
    chunks first: NumPy's products and ufuncs let go of the GIL, and BLAS stays at one thread per call."""
    T, H, D = q.shape
    KV = kc.shape[0] if kv8 is None else kv8[0].kq.shape[1]
    rep = H // KV
    workers = min(threads, ATTEND_POOL_MAX)
    chunk = ATTEND_CHUNK if pool is None else max(ATTEND_CHUNK_MIN, min(ATTEND_CHUNK, -(-T // (2 * workers))))
    items = [(c0, min(T, c0 + chunk), g) for c0 in range(0, T, chunk) for g in range(KV)]
    if pool is None or len(items) == 1:
        for c0, c1, g in items:
            _attend_item(q, kc, vc, pos0, window, scale, c0, c1, g, rep, out, kv8)
        return
    items.sort(key=lambda it: -it[1])
    run_spread(pool, workers, [
        (lambda c0=c0, c1=c1, g=g: _attend_item(q, kc, vc, pos0, window, scale, c0, c1, g, rep, out, kv8))
        for c0, c1, g in items])


def run_spread(pool, workers: int, tasks: list) -> None:
    """Run `tasks` (callables, costliest first) on `workers` of the pool's threads, dealt round-robin:
    fewer threads than the pool has where the tasks are many small NumPy calls, each taking the GIL back
    (on the 16-core Xeon the prefill's attention took 131 ms per 512-token prompt at 4 threads, 203 at 8
    and 240 at 16 with one pool task per item)."""
    workers = max(1, min(workers, len(tasks)))

    def run(share):
        for task in share:
            task()
    for f in [pool.submit(run, tasks[w::workers]) for w in range(workers)]:
        f.result()


def _act_rows(gate, up, act: str, out, r0: int, r1: int) -> None:
    """out[r0:r1] = act(gate) * up (up None: act(gate)) in NumPy, without temporaries of full size."""
    g, o = gate[r0:r1], out[r0:r1]
    if act == "silu":
        np.negative(g, out=o)
        np.exp(o, out=o)
        o += np.float32(1)
        np.divide(g, o, out=o)
    else:
        o[...] = ACT[act](g)
    if up is not None:
        o *= up[r0:r1]


def activate_rows(gate, up, act: str, out, pool=None, threads: int = 1) -> None:
    """The MLP's activation for many tokens: NumPy's exp and tanh are vectorized (Numba's, without SVML,
    are not); with a pool, row blocks on its threads (the ufuncs let go of the GIL)."""
    T = out.shape[0]
    if pool is None or T < 2 * threads:
        _act_rows(gate, up, act, out, 0, T)
        return
    workers = min(threads, ACT_POOL_MAX)
    step = -(-T // workers)
    fs = [pool.submit(_act_rows, gate, up, act, out, r0, min(T, r0 + step)) for r0 in range(0, T, step)]
    for f in fs:
        f.result()


def decode_step(model, i: int, layer, h: np.ndarray, pos0: int, fused) -> np.ndarray:
    """One token through a layer (h (1, hidden), in place) in six calls: norm + q/k/v GEMV, norms/RoPE/cache
    write, attention, o GEMV + residual, norm + gate/up GEMV + activation, down GEMV + residual
    (packed.gemv_norm / gemv_add / gemv_glu_norm). The same arithmetic as fast_layer_step's T = 1 path;
    no allocation per token (the outputs are the GEMVs' own buffers and the workspace's)."""
    ws = model.ws
    lp = layer.plan
    H, D = lp.heads, lp.head_dim
    prof = model.prof
    q, k, v, act = fused
    t = time.perf_counter() if prof is not None else 0.0
    x = ws.scratch("x", h.shape)
    layer.qkv.packed.apply_norm(h, ws.norm_args(layer.in_norm), x)
    if prof is not None:
        t = prof.lap("qkv", t, layer.qkv.regions(1))
    qn, kn = ws.norm_args(layer.q_norm), ws.norm_args(layer.k_norm)
    rope = layer.cos is not None
    cos, sin = (layer.cos, layer.sin) if rope else (ws.tables, ws.tables)
    kc, vc = model.k_cache[i], model.v_cache[i]
    ws.prepare_qkv(q, k, v, qn[0], qn[1], kn[0], kn[1], layer.q_norm is not None, layer.k_norm is not None,
                   qn[3], kn[3], qn[4], kn[4], cos, sin, rope, cos.shape[1], pos0, kc, vc, model.kv8 is None)
    if model.kv8 is not None:
        ws.write8(k, v, pos0, *model.kv8.layer(i))
    if prof is not None:
        t = prof.lap("rope+cache", t)
    a = ws.scratch("a", (1, H, D))
    par = int(model.threads > 1 and (pos0 + 1) * H * D >= ws.attend_min)
    if model.kv8 is not None:
        (ws.attend8_parallel if par else ws.attend8_serial)(q, *model.kv8.layer(i), pos0, layer.window,
                                                            np.float32(layer.scale), ws.scores, a)
    else:
        (ws.attend_parallel if par else ws.attend_serial)(q, kc, vc, pos0, layer.window, np.float32(layer.scale),
                                                          ws.scores, a)
    if prof is not None:
        t = prof.lap("attention", t, par)
    layer.o.packed.apply_add(a.reshape(1, H * D), h)
    if prof is not None:
        t = prof.lap("o", t, layer.o.regions(1))
    m = layer.mlp_in.packed.apply_glu_norm(h, ws.norm_args(layer.ff_norm), x, act,
                                           ws.scratch("m", (1, layer.mlp_in.ws[0].oc)))
    if prof is not None:
        t = prof.lap("gate+up", t, layer.mlp_in.regions(1))
    layer.down.packed.apply_add(m, h)
    if prof is not None:
        prof.lap("down", t, layer.down.regions(1))
    return h


def fast_layer_step(model, i: int, layer, h: np.ndarray, pos0: int) -> np.ndarray:
    """One decoder layer on h (T, hidden), in place, with the Numba steps (steps.py) and quantized
    linear layers (packed.py / qkernels.py). With `model.prof` set, each step's time is recorded.
    One token through a layer that suits them: decode_step's fused calls."""
    ws = model.ws
    lp = layer.plan
    T = h.shape[0]
    if T == 1 and not FUSED_OFF:
        fused = ws.fused(layer)
        if fused is not None:
            return decode_step(model, i, layer, h, pos0, fused)
    H, KV, D = lp.heads, lp.kv_heads, lp.head_dim
    prof = model.prof
    many = ws.pool is not None and T * h.shape[1] >= PREFILL_PARALLEL_MIN     # prefill at more than one thread
    t = time.perf_counter() if prof is not None else 0.0
    x = ws.scratch("x", h.shape) if T == 1 else np.empty_like(h)
    (ws.norm_rows_par if many else ws.norm_rows)(h, *ws.norm_args(layer.in_norm), x)
    if prof is not None:
        t = prof.lap("norm", t, int(many))
    q, k, v = layer.qkv.apply(x)
    if prof is not None:
        t = prof.lap("qkv", t, layer.qkv.regions(T))
    q, k, v = q.reshape(T, H, D), k.reshape(T, KV, D), v.reshape(T, KV, D)
    qn, kn = ws.norm_args(layer.q_norm), ws.norm_args(layer.k_norm)
    rope = layer.cos is not None
    cos, sin = (layer.cos, layer.sin) if rope else (ws.tables, ws.tables)
    kc, vc = model.k_cache[i], model.v_cache[i]
    ws.prepare_qkv(q, k, v, qn[0], qn[1], kn[0], kn[1], layer.q_norm is not None, layer.k_norm is not None,
                   qn[3], kn[3], qn[4], kn[4], cos, sin, rope, cos.shape[1], pos0, kc, vc, model.kv8 is None)
    if model.kv8 is not None:
        ws.write8(k, v, pos0, *model.kv8.layer(i))
    if prof is not None:
        t = prof.lap("rope+cache", t)
    a = ws.scratch("a", (T, H, D)) if T == 1 else np.empty((T, H, D), np.float32)
    par = 0
    if T >= ATTEND_BLAS_MIN_T:
        attend_blas(q, kc, vc, pos0, layer.window, np.float32(layer.scale), a, ws.pool if many else None,
                    model.threads, None if model.kv8 is None else (model.kv8, i))
    else:
        work = T * (pos0 + T) * H * D
        par = int(model.threads > 1 and work >= ws.attend_min)
        if model.kv8 is not None:
            (ws.attend8_parallel if par else ws.attend8_serial)(q, *model.kv8.layer(i), pos0, layer.window,
                                                                np.float32(layer.scale), ws.scores, a)
        else:
            (ws.attend_parallel if par else ws.attend_serial)(q, kc, vc, pos0, layer.window,
                                                              np.float32(layer.scale), ws.scores, a)
    if prof is not None:
        t = prof.lap("attention", t, par)
    o = layer.o.apply(a.reshape(T, H * D))
    if prof is not None:
        t = prof.lap("o", t, layer.o.regions(T))
    pa = ws.norm_args(layer.post_attn_norm)
    (ws.add_norm_rows_par if many else ws.add_norm_rows)(h, o, pa[0], pa[1], pa[2], layer.post_attn_norm is not None,
                                                         pa[3], pa[4], *ws.norm_args(layer.ff_norm), x)
    if prof is not None:
        t = prof.lap("add+norm", t, int(many))
    gated = len(layer.mlp_in.ws) == 2
    pk = layer.mlp_in.packed
    if T == 1 and gated and pk is not None and pk.glu and lp.act != "gelu":     # the activation inside the GEMV
        m = pk.apply_glu(x, ACT_CODE[lp.act], ws.scratch("m", (1, layer.mlp_in.ws[0].oc)))
        if prof is not None:
            t = prof.lap("gate+up", t, layer.mlp_in.regions(T))
    elif T > 1 and lp.act != "gelu":     # numpy's exp and tanh are vectorized (Numba's, without SVML, not)
        parts = layer.mlp_in.apply(x, copy=False)     # views of one output: no copies of the T x 2I floats
        if prof is not None:
            t = prof.lap("gate+up", t, layer.mlp_in.regions(T))
        m = np.empty((T, parts[-1].shape[1]), np.float32)
        activate_rows(parts[0], parts[1] if gated else None, lp.act, m, ws.pool if many else None, model.threads)
    else:
        parts = layer.mlp_in.apply(x)
        if prof is not None:
            t = prof.lap("gate+up", t, layer.mlp_in.regions(T))
        m = ws.scratch("m", parts[-1].shape) if T == 1 else np.empty_like(parts[-1])
        ws.activate(parts[0], parts[-1], ACT_CODE[lp.act], gated, m)
    if prof is not None:
        t = prof.lap("activation", t)
    d = layer.down.apply(m)
    if prof is not None:
        t = prof.lap("down", t, layer.down.regions(T))
    pf = ws.norm_args(layer.post_ff_norm)
    (ws.add_rows_par if many else ws.add_rows)(h, d, pf[0], pf[1], pf[2], layer.post_ff_norm is not None, pf[3], pf[4])
    if prof is not None:
        prof.lap("add", t, int(many))
    return h
