"""The whole ONNX backend node suite through `convert` and mnntool's runtime, against the committed list
of cases that passed: a case on the list that fails now is a regression.

Reference: the expected outputs stored with each case in the onnx package, judged by allclose(rtol 1e-3,
atol 1e-4 x max(1, max|expected|)), integers exactly (mnntool/conformance/cases.py). The MNN half
(`expected_pass_mnn.txt`) runs on demand: `python benchmarks/onnx_conformance.py`.
"""
from pathlib import Path

import pytest

from mnntool.conformance import materialize, materialize_models
from mnntool.conformance.runner import run_cases

HERE = Path(__file__).parent
ROOT = HERE.parents[1]


def _expected(name):
    return [line.strip() for line in (HERE / name).read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def node_cases():
    root = ROOT / "build" / "conformance" / "cases"
    return root, materialize(root) + materialize_models(root)


def test_no_regression_in_mnntool_runtime(node_cases, tmp_path):
    root, entries = node_cases
    expected = set(_expected("expected_pass_mnntool.txt"))
    present = [e for e in entries if e["name"] in expected]
    assert len(present) >= 0.95 * len(expected), "the installed onnx has lost most of the expected cases"
    results = run_cases("mnntool", present, root, tmp_path, workers=2, timeout=300)
    regressions = sorted(n for n, r in results.items() if r["status"] != "pass")
    details = "; ".join(f"{n}: {results[n].get('stage')}: {results[n].get('reason', '')[:120]}" for n in regressions[:10])
    assert not regressions, f"{len(regressions)} node tests regressed: {details}"


def test_runner_reports_a_failing_case(node_cases, tmp_path):
    """The runner can fail: a case whose expected output is altered is reported as a mismatch."""
    import shutil

    import numpy as np
    root, entries = node_cases
    case = tmp_path / "cases" / "test_abs"
    shutil.copytree(root / "test_abs", case)
    data = dict(np.load(case / "data_0.npz"))
    key = next(k for k in data if k.startswith("out:"))
    data[key] = data[key] + 1.0
    np.savez(case / "data_0.npz", **data)
    res = run_cases("mnntool", [{"name": "test_abs"}], tmp_path / "cases", tmp_path / "out", workers=1)
    assert res["test_abs"]["status"] == "fail" and res["test_abs"]["stage"] == "compare"
