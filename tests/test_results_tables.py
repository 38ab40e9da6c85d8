"""tools/results_tables.py: the docs' tables of measured results come from the benchmarks' JSON in
docs/results/, figure for figure (recomputed here with numpy from the raw per-round records), each with its
CPU, date and command; a marker the build cannot fill fails it."""
from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
spec = importlib.util.spec_from_file_location("results_tables", ROOT / "tools" / "results_tables.py")
rt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rt)


def _rows(markdown: str) -> list[list[str]]:
    lines = [l for l in markdown.splitlines() if l.startswith("| ")]
    return [[c.strip() for c in l.strip("|").split("|")] for l in lines[2:]]


def test_every_marker_in_the_docs_renders():
    pages = sorted((ROOT / "docs").rglob("*.md"))
    names = [m.group(1) for p in pages for m in rt.MARKER.finditer(p.read_text())]
    assert names, "no page uses a results table"
    for name in names:
        text = rt.render(name, RESULTS)
        assert text.count("\n| ") >= 2 and "; `python " in text


def test_llm_speed_figures_are_the_json_medians():
    data = json.loads((RESULTS / "llm_speed_xeon16.json").read_text())
    rows = _rows(rt.render("llm_speed_xeon16.json", RESULTS))
    for row in rows:
        t = int(row[0])
        runs = {(r["round"], r["backend"]): r for r in data["runs"] if r["threads"] == t}
        rounds = sorted({k for k, _ in runs})
        mine = [runs[k, "mnntool"] for k in rounds]
        prefill, decode = np.median([m["prefill_tps"] for m in mine]), np.median([m["decode_tps"] for m in mine])
        assert row[1] == f"{prefill:.0f} / {decode:.1f}"
        for col, backend in ((3, "mnn"), (5, "mnn exact")):
            ratio = np.median([runs[k, "mnntool"]["decode_tps"] / runs[k, backend]["decode_tps"] for k in rounds])
            assert row[col].endswith(f" / {ratio:.2f}x"), (row, backend)
    assert [r[0] for r in rows] == ["1", "4", "8"]
    assert "Intel(R) Xeon(R) Processor, 16 CPUs; 2026-11-26;" in rt.render("llm_speed_xeon16.json", RESULTS)


def test_llm_quality_rows_are_the_bundles():
    data = json.loads((RESULTS / "llm_quality_amd_epyc2.json").read_text())
    rows = _rows(rt.render("llm_quality_amd_epyc2.json", RESULTS))
    assert len(rows) == len(data["bundles"]) + 1 and rows[0][3] == f"{data['fp32']['ppl']:.3f}"
    ppl = sorted(f"{b['ppl']:.3f}" for b in data["bundles"])
    assert sorted(r[3] for r in rows[1:]) == ppl


def test_op_coverage_counts():
    """mnntool's column is counted from the converter tables when the page is built; MNN's from its lists."""
    from mnntool.cli import supported_ops
    data = json.loads((RESULTS / "op_coverage.json").read_text())
    rows = {r[0]: r for r in _rows(rt.render("op_coverage.json", RESULTS))}
    assert rows["ONNX"][1] == str(len(supported_ops("onnx"))) and rows["Caffe"][1] == str(len(supported_ops("caffe")))
    assert rows["TensorFlow"][2] == str(len(data["mnn"]["TensorFlow"])) and "Abs" in data["mnn"]["ONNX"]


def test_what_the_build_refuses(tmp_path):
    with pytest.raises(rt.ResultsError, match="no such file"):
        rt.render("absent.json", tmp_path)
    (tmp_path / "odd.json").write_text(json.dumps({"figures": [1, 2]}))
    with pytest.raises(rt.ResultsError, match="not a results file"):
        rt.render("odd.json", tmp_path)
    (tmp_path / "t.json").write_text(json.dumps({"columns": ["a"], "rows": [[1]], "cpu": "x", "date": "2026-11-26"}))
    with pytest.raises(rt.ResultsError, match="no command"):
        rt.render("t.json", tmp_path)
    (tmp_path / "t.json").write_text(json.dumps({"columns": ["model", "ms"], "rows": [["m", 1.5]], "cpu": "AMD EPYC",
                                                 "date": "2026-11-26", "command": "python benchmarks/x.py"}))
    page = rt.fill("before\n\n<!-- results: t.json -->\n\nafter", tmp_path)
    assert "| m | 1.5 |" in page and "*AMD EPYC; 2026-11-26; `python benchmarks/x.py`" in page
    assert not re.search(r"<!-- results", page)
