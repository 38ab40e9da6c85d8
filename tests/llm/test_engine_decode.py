"""Decode's fused calls (kernels.decode_step; packed.gemv_norm / gemv_add / gemv_glu_norm).

- a whole model decoding with the fused calls gives bit for bit the logits of the separate calls
  (fast_layer_step's norm, GEMV, add, norm, GEMV + activation, GEMV, add), at 1 and 2 threads, with the
  float32 and the int8 KV cache: the fused kernels do the same float operations in the same order;
- the fused kernels' parallel versions (the ones a large layer gets at 2+ threads; a tiny test model
  gets the serial twins) against numpy: x = RMSNorm(h), then h + x W^T + b or act(x Wg^T) * (x Wu^T),
  within 1e-3 of the largest value (the packed layers' int16 inputs, packed.py), and equal to the serial
  twins bit for bit; with the VNNI tiles and with the vpmaddwd ones;
- the VNNI tiles (vpdpbusd on the input split into bytes) give bit for bit the vpmaddwd tiles' outputs
  when both quantize the input with the same qmax (the integer sums are exact in both), for the GEMV, the
  fused GEMVs and the GEMM, 4 and 8 bits; the byte layout of the split input puts back every int16 value
  (256 high + low) in the order the packed codes hold the channels.
The end-to-end agreement with MNN-LLM is test_engine.py's (it runs the fused path).
"""
from __future__ import annotations

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
    out = tmp_path_factory.mktemp("decode") / "qwen2-q4"
    export(build_random("qwen2", CACHE / "qwen2"), out, bits=4, block=32)
    return out


def _decode(bundle, threads, kv_int8, fused_off, monkeypatch):
    from mnntool.llm.engine import kernels
    from mnntool.llm.engine.model import Model
    monkeypatch.setattr(kernels, "FUSED_OFF", fused_off)
    m = Model.load(bundle, threads=threads, kv_int8=kv_int8)
    assert all(m.ws.fused(L) is not None for L in m.layers)     # qwen2's layers suit the fused calls
    out = [m.forward([3, 17, 9, 40, 2])]
    for tok in (5, 11, 7, 1, 30, 8):
        out.append(m.forward([tok]))
    return np.stack(out)


@pytest.mark.parametrize("threads,kv_int8", [(1, False), (2, False), (2, True)])
def test_fused_decode_equals_separate_calls(bundle, threads, kv_int8, monkeypatch):
    sep = _decode(bundle, threads, kv_int8, True, monkeypatch)
    fused = _decode(bundle, threads, kv_int8, False, monkeypatch)
    assert np.array_equal(sep, fused), np.abs(sep - fused).max()


def _rms(h, gamma, eps):
    h = h.astype(np.float64)
    return h / np.sqrt((h * h).mean() + eps) * gamma


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("no_vnni", [False, True])
def test_parallel_fused_kernels_match_numpy(bits, no_vnni, monkeypatch):
    from mnntool.llm.engine import packed
    monkeypatch.setattr(packed, "NO_VNNI", no_vnni)
    from mnntool.llm.engine.kernels import threads
    from tests.llm.test_engine import _qweight
    rng = np.random.default_rng(7)
    K, I, O = 128, 96, 64
    g, dg = _qweight(bits, I, K, 32, False, seed=1)
    u, du = _qweight(bits, I, K, 32, False, seed=2)
    d, dd = _qweight(bits, O, I, 32, False, seed=3)
    bg, bu, bd = g.bias, u.bias, d.bias
    glu, down = packed.PackedLinear([g, u], 2), packed.PackedLinear([d], 2)
    h = rng.standard_normal((1, K)).astype(np.float32)
    gamma = rng.uniform(0.5, 1.5, K).astype(np.float32)
    norm = (gamma, np.zeros(1, np.float32), False, 1e-6, True)
    x = _rms(h[0], gamma, 1e-6)
    a = x @ dg.T.astype(np.float64) + bg
    ref_m = a / (1 + np.exp(-a)) * (x @ du.T.astype(np.float64) + bu)
    h2 = rng.standard_normal((1, O)).astype(np.float32)
    outs = {}
    with threads(2):
        for name, fns in (("parallel", (packed.gemv_glu_norm.dispatcher(), packed.gemv_add.dispatcher())),
                          ("serial", (packed.gemv_glu_norm.serial().dispatcher(), packed.gemv_add.serial().dispatcher()))):
            glu.gemv_glu_norm, down.gemv_add = fns
            m = glu.apply_glu_norm(h, norm, np.empty_like(h), 0, np.empty((1, I), np.float32))
            hh = h2.copy()
            down.apply_add(m, hh)
            outs[name] = (m.copy(), hh)
    m, hh = outs["parallel"]
    assert np.abs(m[0] - ref_m).max() / np.abs(ref_m).max() < 1e-3
    ref_h = h2[0] + m[0].astype(np.float64) @ dd.T.astype(np.float64) + bd
    assert np.abs(hh[0] - ref_h).max() / np.abs(ref_h).max() < 1e-3
    assert np.array_equal(outs["serial"][0], m) and np.array_equal(outs["serial"][1], hh)
    # gemv_norm (q/k/v): the parallel kernel at 2 threads against numpy
    with threads(2):
        glu.gemv_norm = packed.gemv_norm.dispatcher()
        ys = glu.apply_norm(h, norm, np.empty_like(h))
    for y, dense, bias in ((ys[0], dg, bg), (ys[1], du, bu)):
        ref = x @ dense.T.astype(np.float64) + bias
        assert np.abs(y - ref).max() / np.abs(ref).max() < 1e-3


def _pair(bits, oc, ic, monkeypatch, seed=0, n=1):
    """The same layers packed for the VNNI tiles and for the vpmaddwd ones, the latter at the former's qmax."""
    from mnntool.llm.engine import packed
    from tests.llm.test_engine import _qweight
    ws = [_qweight(bits, oc, ic, 64, False, seed=seed + i)[0] for i in range(n)]
    monkeypatch.setattr(packed, "NO_VNNI", False)
    v = packed.PackedLinear(ws, 1)
    monkeypatch.setattr(packed, "NO_VNNI", True)
    m = packed.PackedLinear(ws, 1)
    assert v.vnni and not m.vnni
    m.qmax = v.qmax
    return v, m


@pytest.mark.skipif(not __import__("mnntool.llm.engine.packed", fromlist=["VNNI"]).VNNI, reason="no AVX512-VNNI")
@pytest.mark.parametrize("bits", [4, 8])
def test_vnni_tiles_equal_vpmaddwd(bits, monkeypatch):
    from mnntool.llm.engine.packed import TOKENS
    rng = np.random.default_rng(bits)
    v, m = _pair(bits, 80, 192, monkeypatch, n=2)
    for T in (1, 2, TOKENS + 1, 61):
        x = (rng.standard_normal((T, 192)) * rng.uniform(0.1, 10)).astype(np.float32)
        for a, b in zip(v.apply(x), m.apply(x)):
            assert np.array_equal(a, b), T
    h = rng.standard_normal((1, 192)).astype(np.float32)
    norm = (rng.uniform(0.5, 1.5, 192).astype(np.float32), np.zeros(1, np.float32), False, 1e-6, True)
    outs = []
    for lin in (v, m):
        y = [a.copy() for a in lin.apply_norm(h, norm, np.empty_like(h))]
        g = lin.apply_glu_norm(h, norm, np.empty_like(h), 0, np.empty((1, 80), np.float32)).copy()
        outs.append((y, g))
    assert all(np.array_equal(a, b) for a, b in zip(outs[0][0], outs[1][0])) and np.array_equal(outs[0][1], outs[1][1])
    v, m = _pair(bits, 48, 256, monkeypatch, seed=5)
    hs = [rng.standard_normal((1, 48)).astype(np.float32)]
    hs.append(hs[0].copy())
    x = rng.standard_normal((1, 256)).astype(np.float32)
    v.apply_add(x, hs[0])
    m.apply_add(x, hs[1])
    assert np.array_equal(hs[0], hs[1])


@pytest.mark.parametrize("bits", [4, 8])
def test_vnni_input_layout(bits):
    from mnntool.llm.engine.packed import KC, VNNI_QMAX, quantize_rows
    rng = np.random.default_rng(1)
    K, blk = 128, 32
    x = (rng.standard_normal((2, K)) * 3).astype(np.float32)
    nb = K // blk
    plain, split = np.empty((2, K), np.int16), np.empty((2, K), np.int16)
    sx, xs = np.empty((2, nb), np.float32), np.empty((2, nb), np.float32)
    quantize_rows(x, blk, VNNI_QMAX, plain, sx, xs, False, bits)
    quantize_rows(x, blk, VNNI_QMAX, split, sx, xs, True, bits)
    assert np.abs(plain).max() == VNNI_QMAX
    kc = KC[bits]
    # the order of the channels in a word's code bytes: u4 (0,4,1,5) low nibbles, (2,6,3,7) high; u8 (0,2,1,3)
    order = [0, 4, 1, 5, 2, 6, 3, 7] if bits == 4 else [0, 2, 1, 3]
    by = split.view(np.int8).reshape(2, K // kc, 2, kc)       # per word: kc low bytes, then kc high bytes
    value = by[:, :, 1, :].astype(np.int32) * 256 + by[:, :, 0, :]
    back = np.empty((2, K // kc, kc), np.int32)
    back[:, :, order] = value
    assert np.array_equal(back.reshape(2, K), plain.astype(np.int32))
