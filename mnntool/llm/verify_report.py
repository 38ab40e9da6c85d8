"""`llm verify`'s reports for people and CI: plain lines, JUnit XML, GitHub workflow commands and an HTML
page, each from the result dict of mnntool.llm.verify.verify. The JUnit document and the workflow
commands are verify's (mnntool/verify_report.py), with the LLM's cases:

JUnit: <testsuites name="mnntool llm verify"> holding one <testsuite> with properties (mnntool version,
report schema, bundle, checkpoint, reference, bits, exit code, inputs); one <testcase> per hidden state
("embed", "layer 0", ...), one per logits row (mnntool's engine, MNN-LLM) and one "same checkpoint" case
(a <failure type="NotSameModel"> with exit code 3). Failures carry the figures and the thresholds.
"""
from __future__ import annotations

from ..verify_report import _clean, _document, github_annotation
from .verify import EXIT_NOT_SAME_MODEL, inputs_text, verdict_text

_PROPS = ("mnntool_version", "schema", "bundle", "checkpoint", "reference", "bits", "head_bits", "exit_code")


def num(v, spec: str = ".4g") -> str:
    """A figure, or "nan" where the report holds null (not finite)."""
    return "nan" if v is None else format(v, spec)


def figures(m: dict) -> str:
    """A row's numbers and its limits, one line."""
    if m.get("error"):
        return f"did not run: {m['error']}"
    text = f"cosine {num(m['cosine'], '.6f')}, max abs {num(m['max_abs'])}, rel L2 {num(m['rel_l2'])}"
    lim = f"cosine >= {m['min_cosine']}"
    if "top1" in m:
        text += f", top-1 {100 * m['top1']:.1f}%, KL mean {num(m['kl_mean'])} max {num(m['kl_max'])}"
        lim += f", top-1 >= {100 * m['min_top1']:.0f}%, KL mean <= {m['max_kl_mean']}"
    return f"{text} (threshold {lim})"


def plain_text(r: dict) -> str:
    """Every row, names and numbers in full (what llm verify prints)."""
    lines = [f"{_clean(r['bundle'])} vs {_clean(r['checkpoint'])} ({r['reference']} float32 reference), "
             f"{r['bits']}-bit weights, head {r['head_bits']}-bit",
             f"inputs: {_clean(inputs_text(r['inputs']))}"]
    if r["exit_code"] == EXIT_NOT_SAME_MODEL:
        lines.append(_clean(verdict_text(r)))
        return "\n".join(lines)
    rows = [("hidden state", "cosine", "max_abs", "rel_l2", "min_cosine", "")]
    for m in r["layers"]:
        mark = "first failing" if m["name"] == r["first_failing"] else ("FAIL" if not m["pass"] else "")
        rows.append((m["name"], num(m["cosine"], ".6f"), num(m["max_abs"], ".3g"), num(m["rel_l2"], ".3g"),
                     str(m["min_cosine"]), mark))
    widths = [max(len(row[k]) for row in rows) for k in range(len(rows[0]))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    for m in r["logits"]:
        extra = ""
        if m.get("vs_engine"):
            v = m["vs_engine"]
            extra = f"; vs the engine: cosine {num(v['cosine'], '.6f')}, top-1 {100 * v['top1']:.1f}%"
        lines.append(f"{m['name']}: {figures(m)}{extra} {'pass' if m['pass'] else 'FAIL'}")
    for note in r.get("notes", []):
        lines.append(f"note: {_clean(note)}")
    lines.append(_clean(verdict_text(r)))
    return "\n".join(lines)


def _title(r: dict) -> str:
    return f"mnntool llm verify {r['bundle']} vs {r['checkpoint']}"


def junit_xml(r: dict) -> bytes:
    cases = []
    for m in r["layers"]:
        first = " (first failing)" if m["name"] == r["first_failing"] else ""
        msg = f"hidden state after {m['name']}{first}: {figures(m)}"
        cases.append(("mnntool.llm.verify.layer", m["name"], None if m["pass"] else "failure",
                      None if m["pass"] else msg, msg))
    for m in r["logits"]:
        msg = f"{m['name']}: {figures(m)}"
        cases.append(("mnntool.llm.verify.logits", m["name"], None if m["pass"] else "failure",
                      None if m["pass"] else msg, msg))
    same = r["exit_code"] != EXIT_NOT_SAME_MODEL
    s = r["same_model"]
    detail = "; ".join(f"{c['what']}: checkpoint {c['checkpoint']}, bundle {c['bundle']}" for c in s["checks"])
    if s.get("embedding_cosine") is not None:
        detail += f"; embeddings cosine {num(s['embedding_cosine'], '.6f')}"
    cases.append(("mnntool.llm.verify.model", "same checkpoint", None if same else "failure",
                  None if same else verdict_text(r), detail))
    return _document(r, cases, "mnntool llm verify", _title(r), _PROPS, inputs_text(r["inputs"]))


def junit_error(message: str, bundle: str, checkpoint: str) -> bytes:
    """A run that stopped with an error (exit 2): one test case in error."""
    r = {"bundle": bundle, "checkpoint": checkpoint}
    return _document(r, [("mnntool.llm.verify.model", "llm verify", "error", message, message)],
                     "mnntool llm verify", _title(r), ("bundle", "checkpoint"))


def github_lines(r: dict) -> list[str]:
    """::error per failing row (or not the same checkpoint), ::notice with the verdict when it passes."""
    b = r["bundle"]
    if r["exit_code"] == EXIT_NOT_SAME_MODEL:
        return [github_annotation("error", "mnntool llm verify: not from this checkpoint", verdict_text(r), b)]
    out = [github_annotation("error", f"mnntool llm verify: {m['name']}", f"{m['name']}: {figures(m)}", b)
           for m in r["layers"] + r["logits"] if not m["pass"]]
    if r["pass"]:
        out.append(github_annotation("notice", "mnntool llm verify", f"{verdict_text(r)}; {inputs_text(r['inputs'])}", b))
    return out


def html_report(r: dict) -> str:
    """One self-contained page: verdict, the cosine per layer chart (verify's), the layer and logits tables.
    Jinja2 escapes every value."""
    from importlib.resources import files

    from jinja2 import Environment, select_autoescape

    from ..verifier import _chart
    env = Environment(autoescape=select_autoescape(default=True, default_for_string=True))
    page = env.from_string(files("mnntool").joinpath("templates/llm_verify.html").read_text())
    rows = [{**m, "cosine": -1.0 if m["cosine"] is None else m["cosine"]} for m in r["layers"]]
    chart = _chart({"layers": rows, "min_cosine": r["thresholds"]["min_cosine"]}) if rows else None
    return page.render(r=r, chart=chart, inputs=inputs_text(r["inputs"]), verdict=verdict_text(r), num=num)


def run_command(bundle: str, checkpoint: str, out_format: str, report: str | None, junit: str | None,
                echo, **kw) -> int:
    """`mnntool llm verify`: the comparison, its reports written whole (atomically; never over an input), the
    verdict printed (`echo(text)`); returns the exit code. A user error still leaves a JUnit document saying why."""
    import json
    from pathlib import Path

    from ..errors import MnnToolError
    from ..format.writer import check_output
    from ..verify_report import append_step_summary, reporting_failure, write_reports
    from .verify import verify

    if out_format not in ("text", "json", "github"):
        raise MnnToolError(f"--output-format {out_format}: expected text, json or github")
    sources = [p for d in (bundle, checkpoint) if Path(d).is_dir() for p in Path(d).iterdir()]
    sources += [kw.get("text")] if kw.get("text") else []
    for path in (report, junit):
        if path:
            check_output(path, sources)
    with reporting_failure(junit, out_format, sources, lambda e: junit_error(e, bundle, checkpoint),
                           "mnntool llm verify", bundle, echo):
        r = verify(bundle, checkpoint, **kw)
    write_reports(sources, report, lambda: html_report(r), junit, lambda: junit_xml(r))
    if out_format == "json":
        echo(json.dumps(r))
    else:
        echo(plain_text(r))
        if out_format == "github":
            echo("\n".join(github_lines(r)))
            append_step_summary(f"### mnntool llm verify: `{_clean(bundle)}`\n\n**{_clean(verdict_text(r))}**\n\n"
                                f"```\n{plain_text(r)}\n```\n")
    return r["exit_code"]
