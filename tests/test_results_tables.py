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
        for col, backend in ((3, "mnn"), (5, "ort-genai")):
            ratio = np.median([runs[k, "mnntool"]["decode_tps"] / runs[k, backend]["decode_tps"] for k in rounds])
            assert row[col].endswith(f" / {ratio:.2f}x"), (row, backend)
    assert [r[0] for r in rows] == ["1", "2", "4"]
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


# a measured figure in a table cell: a number with a unit of time, memory, ratio or share (12.3 ms, 0.91x,
# 853 MB, 98%), a cosine-like decimal (0.9999), a pass count (31/35), or a bare decimal with a fraction
# (9.2). Thresholds and defaults (">= 0.999", "<= 0.05", "default 0.999") are settings, not measurements;
# code spans are options.
FIGURE = re.compile(r"(?<![\w.])(\d[\d,]*(\.\d+)?\s?(ms|us|s|MB|GB|GiB|MiB|x|%|tok/s)(?![\w/])"
                    r"|\d+\.\d+|\d+/\d+)(?![\w.])")
SETTING = re.compile(r"(`[^`]*`|(>=|<=|≥|≤|<|>|default)\s*[\d.]+)")


def _hand_typed_tables(text: str):
    """(line number, row) of every table row in a page's source whose cells hold measured figures: a table
    the build generates is only a marker in the source, so any such row was typed by hand."""
    text = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    lines = text.splitlines()
    for n, line in enumerate(lines):
        if not line.startswith("|") or re.match(r"^\|[\s|:-]+\|$", line):
            continue
        if n > 0 and not lines[n - 1].startswith("|"):
            continue                    # the header row names columns
        cells = [SETTING.sub("", c) for c in line.strip().strip("|").split("|")]
        if any(FIGURE.search(c) for c in cells[1:]):
            yield n + 1, line


def test_figures_in_tables_come_from_results_files():
    """No page a user reads (README.md, docs/) holds a table of measured figures outside a results
    marker: each is rendered from the benchmark's JSON with its CPU, date and command."""
    pages = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
    typed = [f"{p.relative_to(ROOT)}:{n}: {line[:90]}" for p in pages for n, line in _hand_typed_tables(p.read_text())]
    assert not typed, "tables of figures typed by hand (put them in docs/results/*.json and use a " \
                      "<!-- results: NAME.json --> marker):\n" + "\n".join(typed)


def test_the_table_check_finds_typed_figures():
    page = ("| model | 1 thread |\n|---|---|\n| ResNet-18 | 23.2 ms |\n\n| weights | cosine |\n|---|---|\n"
            "| 8-bit | >= 0.999 |\n\n| code | meaning |\n|---|---|\n| 2 | user error (`--min-cosine 0.99`) |\n"
            "\n| model | cosine |\n|---|---|\n| MobileNetV2 | 0.999991 |\n| LSTM | 31/35 |\n")
    assert [n for n, _ in _hand_typed_tables(page)] == [3, 15, 16]


def test_quant_accuracy_cells_are_the_json_rows():
    data = json.loads((RESULTS / "quant_accuracy_epyc2.json").read_text())
    text = rt.render("quant_accuracy_epyc2.json", RESULTS)
    rows = {r[0]: r[1:] for r in _rows(text)}
    models = list(dict.fromkeys(r["model"] for r in data["rows"]))
    for r in data["rows"]:
        assert rows[r["tool"]][models.index(r["model"])] == f"{r['cosine']:.6f} ({r['top1_agreement'] * 100:.0f}%)"
    assert "AMD EPYC, 2 CPUs; 2026-11-26; `python benchmarks/quant_accuracy.py" in text


def test_quant_accuracy_per_model_rows(tmp_path):
    """--zoo / --ocr files: one row per model; a tool that failed on the model (NaN) reads "failed"."""
    rows = [{"model": "m", "size_ratio": 3.8512, "float_layers": 2, "auto_skipped": 1, "cos_mnn": 0.99861,
             "cos_mnntool": 0.998612, "agree": 0.9999921, "cos_ort_minmax": float("nan"), "cos_mnn_quantizer": 0.9974}]
    (tmp_path / "z.json").write_text(json.dumps({"kind": "quant_accuracy_zoo", "cpu": "AMD EPYC", "date": "2026-11-26",
                                                 "command": "python benchmarks/quant_accuracy.py --zoo", "rows": rows}))
    assert _rows(rt.render("z.json", tmp_path)) == [["m", "3.85x", "0.998610", "0.998612", "0.999992", "2 (1)",
                                                     "failed", "0.997400"]]
