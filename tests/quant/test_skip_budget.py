"""`quant --skip-budget P` (with or without `--auto-skip X`): layers kept float ranked by measured
sensitivity, never more than P% of the weights (or multiply-adds), for weight-only and int8.

The share kept float is read back from the written file (layers whose weights have no quantized table,
or which compute in float in an int8 file), independently of the report. The ranking is checked against
random choices within the same budget (measured ranking must beat them on unseen inputs), and the int8
file against MNN (cosine vs mnntool's runtime >= 0.999, the int8 agreement bar of test_int8_agreement).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from mnntool import api
from mnntool.errors import MnnToolError
from mnntool.format import reader
from mnntool.quant import QuantConfig, quantize_file
from mnntool.quant.sensitivity import Sensitivity
from mnntool.quant.skip_budget import ranked
from mnntool.quant.weight_only import compress_weights
from mnntool.runtime.mnn_backend import MnnSession
from mnntool.runtime.session import Session
from tests.quant.sensitivity_models import build, cosine, feeds
from tests.test_cli import assert_one_line_error, run

EVAL = [feeds(s) for s in (21, 22, 23, 24)]
CALIB = [feeds(s) for s in range(30, 36)]


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return build(tmp_path_factory.mktemp("skip"))[0]


def _float_share(path, int8: bool = False) -> tuple[float, set]:
    """(share of the convolution weights the file keeps float, those layers): weight-only, layers with no
    quantized table; int8, layers that do not compute in int8 (no symmetricQuan)."""
    flt, total, names = 0, 0, set()
    for n in reader.load(path).nodes:
        if n.op != "Convolution":
            continue
        c = n.param["common"]
        w = c["outputCount"] * c["inputCount"] * c.get("kernelX", 1) * c.get("kernelY", 1) // (c.get("group", 1) or 1)
        total += w
        if ("symmetricQuan" not in n.param) if int8 else ("quanParameter" not in n.param):
            flt += w
            names.add(n.name)
    return flt / total, names


def _worst(g_ref, g) -> float:
    ref, got = Session(g_ref), Session(g)
    return min(cosine(ref.run(f)["y"], got.run(f)["y"]) for f in EVAL)


def test_ranked_never_exceeds_the_limit():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 12))
        sens = {f"l{i}": Sensitivity(float(rng.exponential()), 1.0) for i in range(n)}
        size = {f"l{i}": int(rng.integers(1, 1000)) for i in range(n)}
        limit = int(rng.integers(0, sum(size.values()) + 1))
        got = ranked(sens, size, limit)
        assert sum(size[x] for x in got) <= limit
        left = [x for x in sens if x not in got]
        assert all(sum(size[x] for x in got) + size[x] > limit for x in left)     # filled: nothing else fits
    assert ranked({"a": Sensitivity(1, 1), "b": Sensitivity(2, 1)}, {"a": 1, "b": 1}, None) == ["b", "a"]


@pytest.mark.parametrize("budget", [0, 15, 40])
def test_weight_only_budget_read_back(src, tmp_path, budget):
    rep = quantize_file(src, tmp_path / "q.mnn", QuantConfig(weight_bits=4, skip_budget=budget, calib=CALIB))
    share, names = _float_share(tmp_path / "q.mnn")
    assert share * 100 <= budget
    assert names == set(rep["auto_skipped"])
    assert rep["skip_budget"]["used_percent"] == pytest.approx(share * 100, abs=1e-9)
    if budget:
        assert rep["auto_skipped"], "a budget that fits a layer keeps the most sensitive ones float"


def test_measured_ranking_beats_random_choices(src, tmp_path):
    budget = 25
    rep = quantize_file(src, tmp_path / "q.mnn", QuantConfig(weight_bits=4, skip_budget=budget, calib=CALIB))
    g = api.load_graph(src)
    ours = _worst(g, api.load_graph(tmp_path / "q.mnn"))
    sizes = {n.name: np.asarray(n.param["weight"]).size for n in g.nodes if n.op == "Convolution"}
    limit = budget / 100 * sum(sizes.values())
    rng = np.random.default_rng(1)
    for _ in range(6):
        chosen, used = set(), 0
        for name in rng.permutation(list(sizes)):
            if used + sizes[name] <= limit:
                chosen.add(name)
                used += sizes[name]
        if chosen == set(rep["auto_skipped"]):
            continue
        q = reader.load(src)
        compress_weights(q, 4, skip=chosen, head_bits=8)
        assert _worst(g, q) < ours, sorted(chosen)


def test_auto_skip_within_budget(src, tmp_path):
    g = api.load_graph(src)
    met = quantize_file(src, tmp_path / "a.mnn", QuantConfig(weight_bits=4, auto_skip=0.99, skip_budget=50,
                                                             calib=CALIB))
    assert met["skip_budget"]["target_met"] and min(o["cosine"] for o in met["outputs"]) >= 0.99
    assert _float_share(tmp_path / "a.mnn")[0] <= 0.5
    short = quantize_file(src, tmp_path / "b.mnn", QuantConfig(weight_bits=4, auto_skip=0.99999, skip_budget=20,
                                                               calib=CALIB))
    assert short["skip_budget"]["target_met"] is False
    assert _float_share(tmp_path / "b.mnn")[0] <= 0.2
    quantize_file(src, tmp_path / "c.mnn", QuantConfig(weight_bits=4))
    assert _worst(g, api.load_graph(tmp_path / "b.mnn")) > _worst(g, api.load_graph(tmp_path / "c.mnn"))


def test_budget_by_macs(src, tmp_path):
    rep = quantize_file(src, tmp_path / "q.mnn", QuantConfig(weight_bits=4, skip_budget=30, skip_budget_by="macs",
                                                             calib=CALIB))
    g = reader.load(src)
    every = Session(g).run(CALIB[0], keep_all=True)
    macs = {n.name: np.asarray(n.param["weight"]).size * every[n.outputs[0]].size // n.param["common"]["outputCount"]
            for n in g.nodes if n.op == "Convolution"}
    used = sum(macs[x] for x in rep["auto_skipped"])
    assert rep["auto_skipped"] and used <= 0.3 * sum(macs.values())
    assert rep["skip_budget"]["used"] == used


def test_int8_budget_and_mnn(src, tmp_path):
    rep = quantize_file(src, tmp_path / "q.mnn", QuantConfig(int8=True, calib=CALIB, skip_budget=20,
                                                             auto_skip=0.99999))
    chosen = {f["name"] for f in rep["float_layers"] if f["reason"] == "auto-skip"}
    assert chosen == set(rep["auto_skipped"]) and chosen
    g = reader.load(src)
    sizes = {n.name: np.asarray(n.param["weight"]).size for n in g.nodes if n.op == "Convolution"}
    assert sum(sizes[x] for x in chosen) <= 0.2 * sum(sizes.values())
    assert chosen <= _float_share(tmp_path / "q.mnn", int8=True)[1]
    q = api.load_graph(tmp_path / "q.mnn")
    ours, mnn = Session(q), MnnSession(str(tmp_path / "q.mnn"), q.inputs, q.outputs)
    for f in EVAL:
        assert cosine(ours.run(f)["y"], mnn.run(f)["y"]) >= 0.999


@pytest.mark.parametrize("cfg, message", [
    (QuantConfig(weight_bits=4, skip_budget=101), r"--skip-budget .*\[0, 100\].*101"),
    (QuantConfig(weight_bits=4, skip_budget=-1), r"--skip-budget .*\[0, 100\]"),
    (QuantConfig(weight_bits=4, skip_budget=float("nan")), r"--skip-budget .*\[0, 100\]"),
    (QuantConfig(fp16=True, skip_budget=10), r"--skip-budget .*--int8 or --weight-bits"),
    (QuantConfig(weight_bits=4, skip_budget=10, skip_budget_by="flops"), r"--skip-budget-by: weights or macs"),
    (QuantConfig(fp16=True, auto_skip=0.99), r"--auto-skip .*--int8"),
])
def test_bad_settings(cfg, message):
    with pytest.raises(MnnToolError, match=message):
        cfg.check()


def test_cli_budget_out_of_range(src, tmp_path):
    assert_one_line_error(*run("quant", src, tmp_path / "x.mnn", "--weight-bits", "4", "--skip-budget", "150"),
                          "--skip-budget", "[0, 100]")
    assert not (tmp_path / "x.mnn").exists()
    code, out, err = run("quant", src, tmp_path / "y.mnn", "--weight-bits", "4", "--skip-budget", "10", "--json")
    assert code == 0, err
    rep = json.loads(out)
    assert rep["skip_budget"]["used_percent"] <= 10 and rep["inputs"].startswith("random N(0,1), seed 0")
