"""Strategies chosen by timing on the host (conv_strategies/measured.py): the rivals it lets compete give the
same bits (so the choice never changes an output), each also matching torch's conv2d to 5e-5 of the largest
output; the chooser keeps the faster, records it, and a later build on this host builds the winner alone;
small layers and the off switches keep the rule's pick."""
import json

import numpy as np
import pytest

from mnntool.runtime.kernels import Kernel, writes
from mnntool.runtime.kernels.micro.epilogue import NO_GRID, RELU6
from mnntool.runtime.kernels.ops import conv_strategies as cs
from mnntool.runtime.kernels.ops.conv_strategies import measured
from tests.runtime.test_conv_strategies import geo

torch = pytest.importorskip("torch")
F = torch.nn.functional

# layers whose pick has a same-bits rival: the Xeon losers (strided 3x3, stems, 5x5, 1 x k windows)
RIVALS = {
    "3x3 s2 56 -> 28": geo(1, 32, 56, 56, 40, 3, s=2, p=1),
    "stem 7x7 s2": geo(1, 3, 64, 64, 16, 7, s=2, p=3),
    "stem 3x3 s2, 2 images": geo(2, 3, 66, 66, 24, 3, s=2, p=1),
    "5x5 on 35x35": geo(1, 12, 35, 35, 20, 5, p=2),
    "1x7 on 17x17": cs.Geometry(1, 24, 17, 17, 16, 17, 17, 1, 7, 1, 1, 1, 1, 0, 3, 0, 3, 1),
}


def _layer(g, threads, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((g.n, g.cin, g.h, g.w)).astype(np.float32)
    w = (rng.standard_normal((g.cout, g.cin, g.kh, g.kw)) / np.sqrt(g.cin * g.kh * g.kw)).astype(np.float32)
    b = rng.standard_normal(g.cout).astype(np.float32)
    return x, w, b, cs.Layer(w.reshape(g.cout, -1), b, RELU6, NO_GRID, threads)


@pytest.mark.parametrize("case", list(RIVALS))
@pytest.mark.parametrize("threads", [1, 2])
def test_rivals_give_the_same_bits(case, threads):
    g = RIVALS[case]
    if not cs.HAS_AVX512:
        pytest.skip("the family is AVX-512's")
    pair = measured.candidates(g, list(cs._suiting(g, True, False)))
    assert len(pair) == 2 and pair[0].name == cs.pick(g).name
    x, w, b, layer = _layer(g, threads)
    outs = []
    for s in pair:
        y = np.full((g.n, g.cout, g.oh, g.ow), np.nan, np.float32)
        s.build(g, layer).fn([x], [y])
        outs.append(y)
    assert np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32)), [s.name for s in pair]
    ref = torch.clamp(F.conv2d(F.pad(torch.from_numpy(x), (g.l, g.r, g.t, g.b)), torch.from_numpy(w),
                               torch.from_numpy(b), stride=(g.sh, g.sw)), 0, 6).numpy()
    assert np.abs(outs[0] - ref).max() <= 5e-5 * np.abs(ref).max()


def _timed_kernel(delay, log, name):
    import time

    def run(inputs, outputs):
        log.append(name)
        time.sleep(delay)
    return writes(run)


@pytest.mark.parametrize("slow_first", [True, False])
def test_the_chooser_keeps_the_faster_and_records_it(slow_first):
    log, chosen = [], []
    a = _timed_kernel(0.004 if slow_first else 0.0, log, "a")
    b = _timed_kernel(0.0 if slow_first else 0.004, log, "b")
    c = measured.Chooser(a, b, ("a", "b"), chosen.append)
    for _ in range(2 + 2 * measured.SAMPLES + 3):
        c([None], [None])
    winner = "b" if slow_first else "a"
    assert chosen == [winner] and log[-3:] == [winner] * 3
    assert log[:2] == ["a", "b"]        # one untimed call each, the rule's pick first


def test_a_recorded_choice_builds_the_winner_alone(monkeypatch, tmp_path):
    g = RIVALS["3x3 s2 56 -> 28"]
    if not cs.HAS_AVX512:
        pytest.skip("the family is AVX-512's")
    monkeypatch.setattr(measured, "enabled", lambda: True)
    monkeypatch.setattr(measured, "MIN_FLOPS", 0)
    monkeypatch.setattr(measured, "_path", lambda: tmp_path / "strategy_choices.json")
    monkeypatch.setattr(measured, "_known", {})
    monkeypatch.setattr(measured, "_loaded", [True])
    import mnntool.runtime.host_tuning as ht
    monkeypatch.setattr(ht, "_busy", lambda: False)
    x, w, b, layer = _layer(g, 1)
    k = cs.build(g, layer)
    assert isinstance(k.fn, measured.Chooser)
    y = np.empty((g.n, g.cout, g.oh, g.ow), np.float32)
    for _ in range(2 + 2 * measured.SAMPLES):
        k.fn([x], [y])
    assert k.fn.kept is not None
    key = measured.key_of(g, 1)
    name = measured._known[key]
    saved = json.loads((tmp_path / "strategy_choices.json").read_text())
    assert list(saved.values())[0][key] == name
    again = cs.build(g, layer)       # the winner's own kernel: no chooser, the same bits
    assert not isinstance(again.fn, measured.Chooser)
    y2 = np.empty_like(y)
    again.fn([x], [y2])
    assert np.array_equal(y.view(np.uint32), y2.view(np.uint32))


def test_small_layers_and_the_switches_keep_the_rule(monkeypatch):
    g = RIVALS["3x3 s2 56 -> 28"]
    x, w, b, layer = _layer(g, 1)
    suited = list(cs._suiting(g, cs.HAS_AVX512, False))
    monkeypatch.setattr(measured, "enabled", lambda: True)
    assert measured.build(g, layer, suited, measured.MIN_FLOPS - 1) is None
    monkeypatch.undo()
    monkeypatch.setenv("MNNTOOL_MEASURE_STRATEGIES", "off")
    assert not measured.enabled()
    monkeypatch.setenv("MNNTOOL_MEASURE_STRATEGIES", "on")
    monkeypatch.setenv("MNNTOOL_STEP_TIMING", "off")
    assert not measured.enabled()
    assert measured.build(g, layer, suited, 1e12) is None
    # outside the family (a pointwise layer), or a pick without a rival: no candidates
    pw = geo(1, 16, 20, 20, 32, 1)
    assert measured.candidates(pw, list(cs._suiting(pw, True, False))) == []
