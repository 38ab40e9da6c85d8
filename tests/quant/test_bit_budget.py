"""`quant --target-bits B`: per-layer 4/8-bit widths from measured sensitivity under an average budget.

Checked independently of the planner: the written file's bits per weight counted from its stored tables
(format.idst: codes at each layer's width plus float32 scales, as llama.cpp's bpw counts block scales)
are <= B, within one layer's upgrade of B, and what `info --quant` prints; the plan beats every random
plan that fits the same budget and the inverted (least sensitive first) plan, on inputs other than those
it was measured on; its JSON read back by --compression-params rebuilds the same bytes; MNN runs the
file. Tolerances: MNN vs mnntool's runtime on the file, cosine >= 0.9999 and their cosines vs float
within 1e-4; plans compared by output cosine vs float on 4 unseen samples.
"""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from mnntool import api
from mnntool.format import reader
from mnntool.errors import MnnToolError
from mnntool.format.idst import dequantize
from mnntool.quant import QuantConfig, quantize_file
from mnntool.quant.compression_params import LayerPlan
from mnntool.quant.weight_only import compress_weights
from mnntool.runtime.mnn_backend import MnnSession
from mnntool.runtime.session import Session
from tests.quant.sensitivity_models import C, build, cosine, feeds
from tests.test_cli import assert_one_line_error, run

TARGET = 5.5
EVAL = [feeds(s) for s in (11, 12, 13, 14)]     # not the measurement's inputs (seed 0)


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    d = tmp_path_factory.mktemp("bits")
    src, _ = build(d)
    code, out, err = run("quant", src, d / "q.mnn", "--target-bits", TARGET, "--write-compression-params",
                         d / "plan.json", "--json")
    assert code == 0, err
    return d, src, json.loads(out)


def _stored_bpw(path) -> float:
    """Bits per weight of a .mnn counted from its weight tables: codes + 32 bits per scale (and minimum)."""
    bits = weights = 0
    for n in reader.load(path).nodes:
        if n.op != "Convolution":
            continue
        qp, rows = n.param.get("quanParameter"), n.param["common"]["outputCount"]
        if qp is None:
            w = np.asarray(n.param["weight"]).size
            bits, weights = bits + 32 * w, weights + w
        else:
            w = dequantize(qp, rows).size
            bits, weights = bits + qp["aMaxOrBits"] * w + 32 * np.asarray(qp["alpha"]).size, weights + w
    return bits / weights


def _outputs_cosine(g) -> float:
    """Worst-sample output cosine vs the float model on the unseen inputs."""
    ref, got = Session(api.load_graph(g[0])), Session(g[1])
    return min(cosine(ref.run(f)["y"], got.run(f)["y"]) for f in EVAL)


def _with_plan(src, bits_of: dict):
    g = reader.load(src)
    compress_weights(g, 8, plan={name: LayerPlan(b) for name, b in bits_of.items()})
    return g


def _cost(g, name, bits) -> int:
    """An independent count: per-channel symmetric codes + one float32 scale per output channel."""
    n = next(n for n in g.nodes if n.name == name)
    return bits * np.asarray(n.param["weight"]).size + 32 * n.param["common"]["outputCount"]


def _fill(src, order: list, budget_bits: float) -> dict:
    """A plan at 4 bits that raises layers to 8 in `order` while the total fits the budget."""
    g = reader.load(src)
    bits_of = {name: 4 for name in order}
    spent = sum(_cost(g, name, 4) for name in order)
    for name in order:
        extra = _cost(g, name, 8) - _cost(g, name, 4)
        if spent + extra <= budget_bits:
            bits_of[name], spent = 8, spent + extra
    return bits_of


def test_written_file_meets_the_target(planned):
    d, src, rep = planned
    plan = rep["bit_plan"]
    got = _stored_bpw(d / "q.mnn")
    assert got == pytest.approx(plan["achieved_bits_per_weight"], abs=1e-12)
    assert got <= TARGET
    # close: no layer left at 4 bits would still fit (the greedy fill stops only when nothing fits)
    g = reader.load(src)
    total = sum(r["weights"] for r in plan["plan"])
    smallest = min((_cost(g, r["name"], 8) - _cost(g, r["name"], 4)) for r in plan["plan"] if r["bits"] == 4)
    assert got + smallest / total > TARGET
    assert {r["bits"] for r in plan["plan"]} == {4, 8}
    code, out, err = run("info", d / "q.mnn", "--quant", "--json")
    assert code == 0, err
    assert json.loads(out)["bits_per_weight_stored"] == pytest.approx(got, abs=1e-12)
    assert rep["inputs"].startswith("random N(0,1), seed 0")


def test_plan_beats_random_and_inverted_plans(planned):
    d, src, rep = planned
    rows = rep["bit_plan"]["plan"]
    total = sum(r["weights"] for r in rows)
    budget = TARGET * total
    ours = _outputs_cosine((src, reader.load(d / "q.mnn")))
    chosen = {r["name"] for r in rows if r["bits"] == 8}
    rng = np.random.default_rng(0)
    names = [r["name"] for r in rows]
    for _ in range(8):
        bits_of = _fill(src, list(rng.permutation(names)), budget)
        if {n for n, b in bits_of.items() if b == 8} == chosen:
            continue            # drew the same plan
        assert _outputs_cosine((src, _with_plan(src, bits_of))) < ours, bits_of
    # the planner's own ranking reversed: the least sensitive per bit first
    by_error = sorted(rows, key=lambda r: r["error_at_low"] / (_cost(reader.load(src), r["name"], 8)
                                                                - _cost(reader.load(src), r["name"], 4)))
    inverted = _fill(src, [r["name"] for r in by_error], budget)
    assert 1 - _outputs_cosine((src, _with_plan(src, inverted))) > 2 * (1 - ours)


def test_plan_json_rebuilds_the_same_file(planned, tmp_path):
    d, src, _ = planned
    quantize_file(src, tmp_path / "again.mnn", QuantConfig(compression_params=str(d / "plan.json"),
                                                           write_compression_params=str(tmp_path / "again.json")))
    assert (tmp_path / "again.mnn").read_bytes() == (d / "q.mnn").read_bytes()
    digest = hashlib.sha256((d / "plan.json").read_bytes()).hexdigest()
    assert hashlib.sha256((tmp_path / "again.json").read_bytes()).hexdigest() == digest


def test_mnn_runs_the_file(planned):
    d, src, _ = planned
    g = api.load_graph(d / "q.mnn")
    ours, mnn = Session(g), MnnSession(str(d / "q.mnn"), g.inputs, g.outputs)
    ref = Session(api.load_graph(src))
    for f in EVAL:      # the same file in both runtimes: the same outputs, the same cost vs float
        a, b, r = ours.run(f)["y"], mnn.run(f)["y"], ref.run(f)["y"]
        assert cosine(a, b) >= 0.9999
        assert abs(cosine(r, a) - cosine(r, b)) <= 1e-4


def test_calibration_inputs_are_used_and_named(planned, tmp_path):
    d, src, _ = planned
    calib = tmp_path / "calib"
    calib.mkdir()
    for s in range(3):
        np.save(calib / f"{s}.npy", feeds(100 + s)["x"])
    rep = quantize_file(src, tmp_path / "c.mnn", QuantConfig(target_bits=TARGET, calib=str(calib)))
    assert rep["inputs"] == f"3 calibration sample(s) of {calib}"
    assert rep["bit_plan"]["achieved_bits_per_weight"] <= TARGET


def test_blocks_zero_points_and_pinned_head(planned, tmp_path):
    """Block-wise asymmetric (HQQ) layers cost their (minimum, scale) pairs: 64 bits per 32 weights here;
    --head-bits pins the output layer, which the plan then counts at 8."""
    _, src, _ = planned
    rep = quantize_file(src, tmp_path / "b.mnn", QuantConfig(target_bits=7, block_size=32, hqq=True, head_bits=8))
    got = _stored_bpw(tmp_path / "b.mnn")
    assert got == pytest.approx(rep["bit_plan"]["achieved_bits_per_weight"], abs=1e-12) and got <= 7
    rows = {r["name"]: r for r in rep["bit_plan"]["plan"]}
    head = [r for r in rows.values() if not r["chosen"]]
    assert len(head) == 1 and head[0]["bits"] == 8
    for n in reader.load(tmp_path / "b.mnn").nodes:
        if n.op == "Convolution" and n.name != head[0]["name"]:
            qp = n.param["quanParameter"]
            assert qp["readType"] and np.asarray(qp["alpha"]).size == 2 * C * C // 32   # pairs per block of 32
    with pytest.raises(MnnToolError, match=r"--target-bits 5: .* 6\.0\d+ per weight .*--head-bits"):
        quantize_file(src, tmp_path / "c.mnn", QuantConfig(target_bits=5, block_size=32, hqq=True, head_bits=8))


@pytest.mark.parametrize("cfg, message", [
    (QuantConfig(target_bits=3), r"--target-bits .*between 4 and 8.*got 3"),
    (QuantConfig(target_bits=8.5), r"--target-bits .*between 4 and 8"),
    (QuantConfig(target_bits=float("nan")), r"--target-bits .*between 4 and 8"),
    (QuantConfig(target_bits=5, weight_bits=4), r"drop --weight-bits"),
    (QuantConfig(target_bits=5, int8=True, calib="c"), r"choose exactly one"),
    (QuantConfig(target_bits=5, auto_skip=0.99), r"--target-bits .*--auto-skip"),
    (QuantConfig(target_bits=5, compression_params="p.json"), r"--compression-params"),
])
def test_bad_settings(cfg, message):
    with pytest.raises(MnnToolError, match=message):
        cfg.check()


@pytest.mark.parametrize("args, needles", [
    (["--target-bits", "3"], ["--target-bits", "between 4 and 8", "got 3"]),
    (["--target-bits", "4.1"], ["--target-bits 4.1", "fewest bits", "4.25"]),   # 32-bit scale per 128 weights
])
def test_bad_values_one_line(planned, tmp_path, args, needles):
    _, src, _ = planned
    assert_one_line_error(*run("quant", src, tmp_path / "x.mnn", *args), *needles)
    assert not (tmp_path / "x.mnn").exists()
