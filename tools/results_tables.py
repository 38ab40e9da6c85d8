"""Tables of measured results rendered from the benchmarks' own JSON output, kept under docs/results/, so
no figure in the docs is typed by hand (tools/mkdocs_hooks.py calls this at build time).

A page holds a marker, `<!-- results: NAME.json -->`, where the table goes. The file is what the benchmark
wrote (`--json`), plus a "command" field saying how it was made; the renderer is chosen by the file's
shape:
- benchmarks/llm_speed.py: "runs" (per round, threads and backend) -> medians per thread count, against
  MNN-LLM default and exact, the ratios the medians of the per-round ratios (as the script prints them);
- benchmarks/llm_quality.py: "fp32" and "bundles" -> perplexity, its change, KL and top-1 agreement;
- tools/op_coverage.py: MNN's converter's op lists -> beside mnntool's counts, taken at build time;
- benchmarks/quant_accuracy.py: "kind" quant_accuracy (a row per model and tool) -> cosine and top-1
  agreement per tool; quant_accuracy_zoo / _ocr (a row per model) -> size ratio, cosines, agreement;
- any benchmark: "columns" and "rows" -> that table as it is. Figures a benchmark printed before it wrote
  JSON are kept this way too, with a "source" field naming where they were recorded (shown under them).
Every table is followed by a line naming the CPU, the date and the command. A marker whose file is
missing, or whose file has none of these shapes, fails the (strict) build.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from statistics import median

MARKER = re.compile(r"<!-- results: ([\w.-]+\.json) -->")


class ResultsError(Exception):
    """A marker the build cannot fill."""


def _row(cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _table(columns: list, rows: list) -> str:
    return "\n".join([_row(columns), _row(["---"] * len(columns))] + [_row(r) for r in rows])


def _caption(data: dict, name: str) -> str:
    host = data.get("host") or {}
    cpu = data.get("cpu") or host.get("cpu_info")
    cores = host.get("n_cpus") or data.get("cores")
    date = data.get("date") or str(host.get("time", ""))[:10]
    command = data.get("command")
    missing = [k for k, v in (("cpu", cpu), ("date", date), ("command", command)) if not v]
    if missing:
        raise ResultsError(f"docs/results/{name}: no {', '.join(missing)} (every table says where, when and how)")
    where = f"{cpu}, {cores} CPUs" if cores else cpu
    source = f" {data['source']}" if data.get("source") else ""
    return f"*{where}; {date}; `{command}` (`docs/results/{name}`).{source}*"


def llm_speed(data: dict) -> str:
    """Per thread count: mnntool's prefill / decode tok/s against MNN-LLM default and exact modes and
    onnxruntime-genai, each runtime the run holds (llm_speed.py; llm_threads.py's "mnntool/auto" is mnntool)."""
    by: dict = {}
    for r in data["runs"]:
        backend = "mnntool" if r["backend"].startswith("mnntool") else r["backend"]
        by.setdefault((r["threads"], r["round"]), {})[backend] = r
    threads = sorted({t for t, _ in by})
    held = {b for v in by.values() for b in v}
    others = [(k, title) for k, title in (("mnn", "MNN-LLM (low/low)"), ("mnn exact", "MNN-LLM exact (high/high)"),
                                          ("ort-genai", "onnxruntime-genai")) if k in held]
    columns = ["threads", "mnntool prefill / decode tok/s"]
    for _, title in others:
        columns += [title, "ratio"]
    rows = []
    for t in threads:
        rounds = [v for (tt, _), v in sorted(by.items()) if tt == t]
        mine = [r["mnntool"] for r in rounds if "mnntool" in r]
        row = [t, f"{median(m['prefill_tps'] for m in mine):.0f} / {median(m['decode_tps'] for m in mine):.1f}"]
        for key, _ in others:
            pairs = [(r["mnntool"], r[key]) for r in rounds if "mnntool" in r and key in r]
            if not pairs:
                row += ["", ""]
                continue
            row.append(f"{median(o['prefill_tps'] for _, o in pairs):.0f} / "
                       f"{median(o['decode_tps'] for _, o in pairs):.1f}")
            row.append(f"{median(m['prefill_tps'] / o['prefill_tps'] for m, o in pairs):.2f}x / "
                       f"{median(m['decode_tps'] / o['decode_tps'] for m, o in pairs):.2f}x")
        rows.append(row)
    return _table(columns, rows)


TOOLS = {"mnntool-hqq": "mnntool --hqq", "mnntool-awq": "mnntool --calib-text (AWQ)",
         "mnntool-awq-hqq": "mnntool --calib-text --hqq"}
MODES = {"default": "default (low/low)"}


def llm_quality(data: dict) -> str:
    """Perplexity through MNN-LLM's logits and KL to fp32 transformers, a row per bundle and mode."""
    ref = data["fp32"]["ppl"]
    rows = [["transformers fp32", "", "", f"{ref:.3f}", "", "", "", ""]]
    order = ["mnntool", *TOOLS, "llmexport"]
    rank = lambda b: (b["bits"], b["mode"] != "exact", order.index(b["tool"]) if b["tool"] in order else len(order))
    for b in sorted(data["bundles"], key=rank):
        rows.append([TOOLS.get(b["tool"], b["tool"]), f"{b['bits']}/{b['block']}", MODES.get(b["mode"], b["mode"]),
                     f"{b['ppl']:.3f}", f"{(b['ppl'] / ref - 1) * 100:+.2f}%", f"{b['kl_mean']:.3g}",
                     f"{b['kl_p99']:.3g}", f"{b['same_top1'] * 100:.2f}%"])
    return _table(["bundle", "bits/block", "mode", "PPL", "ΔPPL", "mean KL", "p99 KL", "same top-1"], rows)


def op_coverage(data: dict) -> str:
    """Source ops per frontend: mnntool's counted now from its converter tables, MNN's converter's from the
    list tools/op_coverage.py saved (blank where its converter does not take the framework)."""
    from mnntool.cli import supported_ops
    rows = []
    for title, fw in data["frontends"].items():
        theirs = data["mnn"].get(title)
        rows.append([title, len(supported_ops(fw)), "" if theirs is None else len(theirs)])
    return _table(["frontend", "mnntool (source ops, counted at build time)",
                   f"MNN {data['mnn_version']}'s converter (its --OP list)"], rows)


def plain(data: dict) -> str:
    """A table a benchmark wrote as columns and rows."""
    return _table(data["columns"], data["rows"])


_REF_NAMES = {"ort": "onnxruntime", "ov": "OpenVINO", "mnn": "MNN"}


def _geo(values: list) -> float:
    import math
    return math.exp(sum(map(math.log, values)) / len(values))


def wide_speed(data: dict) -> str:
    """benchmarks/wide_speed.py: every model's mnntool time and its ratio to each reference, failures
    named, then the geometric means (recomputed here from the rows)."""
    refs = data["refs"]
    scaling = any("speedup_from_1_thread" in r for r in data["rows"])
    columns = ["model", "mnntool ms"] + [f"x {_REF_NAMES.get(r, r)}" for r in refs] + \
        (["1 -> N threads"] if scaling else [])
    rows = []
    for r in data["rows"]:
        if "error" in r:
            rows.append([r["model"], "failed: " + r["error"][:80]] + [""] * (len(columns) - 2))
            continue
        rows.append([r["model"], f"{r['mnntool_ms']:.2f}"] + [f"{r[f'vs_{ref}']:.2f}x" for ref in refs] +
                    ([f"{r['speedup_from_1_thread']:.2f}x" if "speedup_from_1_thread" in r else ""] if scaling else []))
    means = ["**geometric mean**", f"{sum('error' not in r for r in data['rows'])} ran"]
    for ref in refs:
        vals = [r[f"vs_{ref}"] for r in data["rows"] if f"vs_{ref}" in r]
        means.append(f"**{_geo(vals):.2f}x**" if vals else "")
    if scaling:
        vals = [r["speedup_from_1_thread"] for r in data["rows"] if "speedup_from_1_thread" in r]
        means.append(f"**{_geo(vals):.2f}x**" if vals else "")
    return _table(columns, [means] + rows)


def mnn_file_parity(data: dict) -> str:
    """benchmarks/mnn_file_parity.py: our file's time in MNN over MNN's converter's file's, per model."""
    rows = []
    for r in sorted(data["rows"], key=lambda r: -r.get("ratio", 0)):
        if "error" in r:
            rows.append([r["model"], "", "", "failed: " + r["error"][:80]])
        else:
            rows.append([r["model"], f"{r['ours_ms']:.2f}", f"{r['theirs_ms']:.2f}", f"{r['ratio']:.3f}x"])
    vals = [r["ratio"] for r in data["rows"] if "ratio" in r]
    head = ["**geometric mean**", "", "", f"**{_geo(vals):.3f}x** over {len(vals)}" if vals else ""]
    return _table(["model", "mnntool's file in MNN, ms", "MNN's converter's file, ms", "ratio"], [head] + rows)


def _cos(value) -> str:
    """A cosine to six places; a tool that failed on the model (NaN) as such."""
    return "failed" if value is None or value != value else f"{value:.6f}"


def quant_accuracy(data: dict) -> str:
    """benchmarks/quant_accuracy.py on the fixtures: a row per tool, a column per model, each cell the
    mean output cosine against fp32 over the held-out images and the top-1 agreement."""
    models = list(dict.fromkeys(r["model"] for r in data["rows"]))
    by = {(r["model"], r["tool"]): r for r in data["rows"]}

    def cell(r):
        if r is None:
            return ""
        if r["cosine"] != r["cosine"]:
            return "failed"
        return f"{r['cosine']:.6f} ({r['top1_agreement'] * 100:.0f}%)"
    rows = [[tool] + [cell(by.get((m, tool))) for m in models]
            for tool in dict.fromkeys(r["tool"] for r in data["rows"])]
    return _table(["tool"] + [f"{m}: cosine (top-1 agreement)" for m in models], rows)


def quant_accuracy_models(data: dict) -> str:
    """benchmarks/quant_accuracy.py --zoo / --ocr: per model the int8 file's size ratio, its output cosine
    against the float source in MNN and in mnntool's runtime, the two runtimes' agreement on the file,
    and (--zoo) onnxruntime's and MNN's quantizers on the same data."""
    others = data["kind"] == "quant_accuracy_zoo"
    columns = ["model", "smaller by", "cosine vs fp32 (MNN)", "cosine vs fp32 (mnntool)", "runtimes agree",
               "layers left float (auto-skip)"]
    if others:
        columns += ["onnxruntime QDQ MinMax", "MNN's quantizer (KL)"]
    rows = []
    for r in data["rows"]:
        row = [r["model"], f"{r['size_ratio']:.2f}x", _cos(r["cos_mnn"]), _cos(r["cos_mnntool"]), _cos(r["agree"]),
               f"{r['float_layers']} ({r['auto_skipped']})"]
        if others:
            row += [_cos(r.get("cos_ort_minmax")), _cos(r.get("cos_mnn_quantizer"))]
        rows.append(row)
    return _table(columns, rows)


def renderer(data: dict):
    if data.get("kind") == "quant_accuracy":
        return quant_accuracy
    if data.get("kind") in ("quant_accuracy_zoo", "quant_accuracy_ocr"):
        return quant_accuracy_models
    if isinstance(data.get("runs"), list) and data["runs"] and "prefill_tps" in data["runs"][0]:
        return llm_speed
    if data.get("kind") == "op_coverage":
        return op_coverage
    if "fp32" in data and "bundles" in data:
        return llm_quality
    if "refs" in data and "rows" in data:
        return wide_speed
    if "rows" in data and any("theirs_ms" in r for r in data["rows"]):
        return mnn_file_parity
    if "columns" in data and "rows" in data:
        return plain
    return None


def render(name: str, results_dir: Path) -> str:
    """The markdown for `<!-- results: NAME -->`: the table, then where, when and how it was measured."""
    path = Path(results_dir) / name
    if not path.is_file():
        raise ResultsError(f"docs/results/{name}: no such file")
    data = json.loads(path.read_text())
    fn = renderer(data)
    if fn is None:
        raise ResultsError(f"docs/results/{name}: not a results file this generator knows (tools/results_tables.py)")
    return fn(data) + "\n\n" + _caption(data, name)


def fill(markdown: str, results_dir: Path) -> str:
    """Every marker of the page replaced by its table."""
    return MARKER.sub(lambda m: render(m.group(1), results_dir), markdown)
