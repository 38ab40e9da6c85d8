"""Decode's fused calls (kernels.decode_step; packed.gemv_norm / gemv_add / gemv_glu_norm).

- a whole model decoding with the fused calls gives bit for bit the logits of the separate calls
  (fast_layer_step's norm, GEMV, add, norm, GEMV + activation, GEMV, add), at 1 and 2 threads, with the
  float32 and the int8 KV cache: the fused kernels do the same float operations in the same order;
- the fused kernels' parallel versions (the ones a large layer gets at 2+ threads; a tiny test model
  gets the serial twins) against numpy: x = RMSNorm(h), then h + x W^T + b or act(x Wg^T) * (x Wu^T),
  within 1e-3 of the largest value (the packed layers' int16 inputs, packed.py), and equal to the serial
  twins bit for bit.
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
def test_parallel_fused_kernels_match_numpy(bits):
    from mnntool.llm.engine import packed
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
