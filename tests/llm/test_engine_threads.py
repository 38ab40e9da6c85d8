"""The engine's multi-thread prefill paths, its int8 KV cache, its step profile and the bandwidth test.

- prefill at 2 threads with every parallel step forced on (Numba norms, the GEMM's token-block items,
  attention and the activation on the Python thread pool) gives the numpy reference path's logits;
- the int8 KV cache: the Numba writer's codes are the numpy quantizer's, the quantizer keeps every value
  within half a step, the Numba attention over the codes equals numpy attention over the dequantized
  cache, and the whole model on it equals the numpy reference path with the same cache (kv8.py);
  on the trained test model it keeps the float32 cache's greedy tokens (same top-1 >= 95%);
- the packed GEMM over several token blocks at 2 threads, and decode's gate/up GEMV with the activation
  fused (gemv_glu), against numpy's dequantize-then-matmul;
- the step profile's counts, the bandwidth test and the OpenMP wait-policy choice.
Tolerances: the packed layers' int16 inputs round 1.5e-5 of a block's largest value (packed.py), so
logits are compared at 1e-3 of their largest magnitude, as test_engine.py's reference test does.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from tests.conftest import ROOT

pytest.importorskip("torch")
from fixtures.zoo import _without_torchvision_ops  # noqa: E402

_without_torchvision_ops()

from mnntool.llm.bundle import export  # noqa: E402

CACHE = ROOT / "build" / "llm" / "random"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    from fixtures.llm_checkpoints import build_random
    out = tmp_path_factory.mktemp("threads") / "qwen2-q4"
    export(build_random("qwen2", CACHE / "qwen2"), out, bits=4, block=32)
    return out


def _models(bundle, threads=1, kv_int8=False):
    from mnntool.llm.engine import kernels
    from mnntool.llm.engine.model import Model
    fast = Model.load(bundle, threads=threads, kv_int8=kv_int8)
    kernels.REFERENCE = True
    try:
        ref = Model.load(bundle, kv_int8=kv_int8)
    finally:
        kernels.REFERENCE = False
    return fast, ref


def _close(a, r, what, kv_int8=False):
    """1e-3 of the largest logit; with the int8 cache 3e-2 at most and 3e-3 on average: the fast path's
    k and v differ from the reference's by the int16 input rounding, enough to move a value across a
    code boundary now and then (one step: 1/255 of the row's range), which the random model amplifies."""
    scale = np.abs(r).max()
    err = np.abs(a - r).max() / scale
    if not kv_int8:
        assert err < 1e-3, f"{what}: {err:.2e}"
        return
    mean = np.abs(a - r).mean() / scale
    assert err < 3e-2 and mean < 3e-3, f"{what}: max {err:.2e}, mean {mean:.2e}"


@pytest.mark.parametrize("kv_int8", [False, True])
def test_parallel_prefill_matches_reference(bundle, kv_int8, monkeypatch):
    from mnntool.llm.engine import kernels, packed
    monkeypatch.setattr(kernels, "PREFILL_PARALLEL_MIN", 0)
    monkeypatch.setattr(packed, "GEMM_PARALLEL_MIN", 0)
    fast, ref = _models(bundle, threads=2, kv_int8=kv_int8)
    assert fast.ws.pool is not None
    ids = np.random.default_rng(0).integers(3, 500, 130)      # > 2 GEMM token blocks, > 1 attention chunk
    _close(fast.forward(ids, all_logits=True), ref.forward(ids, all_logits=True), "prefill", kv_int8)
    for t in (4, 8, 9):
        _close(fast.forward([t]), ref.forward([t]), "decode", kv_int8)
    # a second prompt continuing the cache (pos0 > 0: the causal mask's offset, the int8 shift kept)
    more = np.arange(20, 60)
    _close(fast.forward(more, all_logits=True), ref.forward(more, all_logits=True), "continued prefill", kv_int8)


def test_kv8_one_thread_matches_reference(bundle):
    fast, ref = _models(bundle, threads=1, kv_int8=True)
    ids = np.random.default_rng(1).integers(3, 500, 11)       # the Numba attention (< 16 queries)
    _close(fast.forward(ids, all_logits=True), ref.forward(ids, all_logits=True), "prefill", True)
    for t in (5, 6, 7):
        _close(fast.forward([t]), ref.forward([t]), "decode", True)
    D = fast.plan.layers[0].head_dim          # codes + a scale and a minimum per row, against float32
    assert fast.kv_bytes() / _models(bundle)[0].kv_bytes() < (D + 8) / (4 * D) + 0.01


def test_kv8_quantizer():
    from mnntool.llm.engine import kv8
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((5, 3, 64)) * rng.uniform(0.1, 10, (5, 3, 1))).astype(np.float32)
    x[0, 0] = 2.5                                             # a constant row: scale 0, exact
    u, s, lo = kv8.quantize(x)
    back = kv8.dequantize(u, s, lo)
    assert np.abs(back[0, 0] - 2.5).max() == 0
    assert (np.abs(back - x) <= s[..., None] * 0.5 + 1e-6 * np.abs(x).max()).all()
    assert u.max() == 255 and u.min() == 0
    # the Numba writer: the same codes and scales (k with the shift: the mean over the first write)
    T, KV, D, ctx = 5, 3, 64, 16
    k, v = x, (x[::-1] * 0.5).copy()
    cache = kv8.KV8(1, KV, ctx, D)
    ref = kv8.KV8(1, KV, ctx, D)
    kv8.write(k, v, 0, *cache.layer(0))
    ref.write_reference(0, k, v, 0)
    assert np.allclose(cache.shift, ref.shift, atol=1e-6)
    for a, b in ((cache.kq, ref.kq), (cache.vq, ref.vq)):
        diff = np.abs(a.astype(int) - b.astype(int))
        assert diff.max() <= 1 and (diff > 0).mean() < 1e-2
    assert np.allclose(cache.ks, ref.ks, rtol=1e-6) and np.allclose(cache.vm, ref.vm, rtol=1e-6)


@pytest.mark.parametrize("parallel", [False, True])
def test_kv8_attention_matches_numpy(parallel):
    from mnntool.llm.engine import kv8
    from mnntool.llm.engine.kernels import threads
    rng = np.random.default_rng(2)
    T, H, KV, D, ctx, pos0 = 2, 4, 2, 32, 40, 20
    cache = kv8.KV8(1, KV, ctx, D)
    k = rng.standard_normal((pos0 + T, KV, D)).astype(np.float32) + 3 * rng.standard_normal(D).astype(np.float32)
    v = rng.standard_normal((pos0 + T, KV, D)).astype(np.float32)
    cache.write_reference(0, k, v, 0)
    q = rng.standard_normal((T, H, D)).astype(np.float32)
    out = np.empty((T, H, D), np.float32)
    scores = np.empty((H, ctx), np.float32)
    fn = kv8.attend if parallel else kv8.attend.serial()
    with threads(2 if parallel else 1):
        fn(q, *cache.layer(0), pos0, 0, np.float32(0.2), scores, out)
    for h in range(H):
        kd, vd = cache.rows(0, h // (H // KV), 0, pos0 + T, D)
        for t in range(T):
            s = (kd[:pos0 + t + 1].astype(np.float64) @ q[t, h]) * 0.2
            p = np.exp(s - s.max())
            p /= p.sum()
            ref = p @ vd[:pos0 + t + 1]
            assert np.abs(out[t, h] - ref).max() < 1e-4 * np.abs(ref).max(), (h, t)


def test_kv8_keeps_greedy_tokens_on_the_trained_model(tmp_path):
    """Quality, not equality: the trained test model's held-out text, teacher-forced, same top-1 with the
    int8 cache as with float32 for >= 95% of the positions (measured: 100%)."""
    from fixtures.llm_checkpoints import build_trained
    from mnntool.llm import load
    src = build_trained(ROOT / "build" / "llm" / "trained-test", "test")
    out = tmp_path / "tt"
    export(src, out, bits=8, block=32)
    text = (src / "heldout.txt").read_text()[:4000]
    a, b = load(out), load(out, kv_int8=True)
    ids = a.encode(text)[:200]
    la, lb = a.forward(ids, all_logits=True), b.forward(ids, all_logits=True)
    same = (la.argmax(-1) == lb.argmax(-1)).mean()
    assert same >= 0.95, same


def test_packed_gemm_token_blocks_two_threads():
    from mnntool.llm.engine.kernels import threads
    from mnntool.llm.engine.packed import TOKEN_BLOCK, PackedLinear
    from tests.llm.test_engine import _qweight
    qw, dense = _qweight(4, 70, 128, 32, False)
    lin = PackedLinear.of([qw, qw], 2)
    T = 2 * TOKEN_BLOCK + 7
    x = np.random.default_rng(3).standard_normal((T, 128)).astype(np.float32)
    ref = x.astype(np.float64) @ dense.T.astype(np.float64) + qw.bias
    with threads(2):
        for copy in (True, False):
            for got in lin.apply(x, copy):
                assert np.abs(got - ref).max() / np.abs(ref).max() < 3e-4


def test_profile_counts_steps(bundle):
    from mnntool.llm.engine.model import Model
    from mnntool.llm.engine.profile import StepTimes
    m = Model.load(bundle)
    m.prof = StepTimes()
    m.forward([1, 2, 3])
    d = m.prof.as_dict()
    layers = len(m.layers)
    assert d["steps"]["qkv"]["calls"] == layers and d["steps"]["lm_head"]["calls"] == 1
    assert d["regions"] == 0                   # one thread: no parallel region
    assert d["total_ms"] > 0 and "qkv" in m.prof.table()


def test_bandwidth_and_wait_policy(monkeypatch):
    from mnntool.llm.engine import kernels
    from mnntool.llm.engine.membw import measure
    for threads in (1, 2):              # the serial twins, then the parallel kernels
        r = measure(threads, mb=16, reps=2)
        assert r["read_GBps"] > 0.1 and r["copy_GBps"] > 0.1
    cores = len(os.sched_getaffinity(0))
    env = {}
    assert kernels.passive_wait(cores + 1, env) and not kernels.passive_wait(1, env)
    assert not kernels.passive_wait(cores, env)         # every core: a bounded spin, then sleep
    assert not kernels.passive_wait(cores + 1, {"OMP_WAIT_POLICY": "ACTIVE"})
    kernels.wait_env(cores + 1, env)
    assert env == {"OMP_WAIT_POLICY": "PASSIVE"}
    env = {}
    kernels.wait_env(cores, env)
    assert env == {"GOMP_SPINCOUNT": kernels.SPIN_BETWEEN_REGIONS}
    env = {"GOMP_SPINCOUNT": "50"}                      # the user's choice stays
    kernels.wait_env(2, env)
    assert env == {"GOMP_SPINCOUNT": "50"}


@pytest.mark.parametrize("threads,bits,act", [(1, 4, 0), (2, 4, 1), (2, 8, 0)])
def test_gemv_with_fused_activation(threads, bits, act):
    """Decode's gate/up GEMV with the activation inside (packed.gemv_glu) against numpy: act(x Wg^T + bg)
    * (x Wu^T + bu), silu (0) or tanh GELU (1); 1e-3 of the largest value (int16 inputs, packed.py)."""
    from mnntool.llm.engine.kernels import threads as use_threads
    from mnntool.llm.engine.packed import PackedLinear
    from tests.llm.test_engine import _qweight
    gate, dg = _qweight(bits, 96, 128, 32, False, seed=1)
    up, du = _qweight(bits, 96, 128, 32, False, seed=2)
    lin = PackedLinear.of([gate, up], threads)
    assert lin.glu
    if threads > 1:                 # the parallel kernel itself (a layer this small gets the serial twin)
        from mnntool.llm.engine.packed import gemv_glu
        lin.gemv_glu = gemv_glu.dispatcher()
    x = np.random.default_rng(4).standard_normal((1, 128)).astype(np.float32)
    a = x.astype(np.float64) @ dg.T.astype(np.float64) + gate.bias
    u = x.astype(np.float64) @ du.T.astype(np.float64) + up.bias
    if act == 0:
        ref = a / (1 + np.exp(-a)) * u
    else:
        ref = 0.5 * a * (1 + np.tanh(np.sqrt(2 / np.pi) * (a + 0.044715 * a ** 3))) * u
    out = np.empty((1, 96), np.float32)
    with use_threads(threads):
        lin.apply_glu(x, act, out)
    assert np.abs(out - ref).max() < 1e-3 * np.abs(ref).max()
