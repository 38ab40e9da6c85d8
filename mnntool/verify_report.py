"""verify's reports for people and CI: plain text (full names, for logs), JUnit XML, GitHub workflow
commands and a Markdown step summary. Each takes the result dict of mnntool.verifier.verify.

JUnit (`verify --junit FILE`): <testsuites> holding one <testsuite name="mnntool verify"> with the
counts (tests, failures, errors, skipped, time, timestamp) and <properties> (mnntool version, report
schema, source, model, backend, thresholds, inputs); one <testcase> per final output (a <failure> when
it misses a threshold), one per failing layer (a <failure>, or <skipped> under --outputs-only) and one
"same model" case (a <failure> when too few tensors match, exit code 3). Every failure message carries
the figures: cosine, max abs, rel L2, SNR and the thresholds.
"""
from __future__ import annotations

import re
from contextlib import contextmanager
import socket
import xml.etree.ElementTree as ET
from datetime import datetime, timezone

from .verifier import EXIT_NOT_SAME_MODEL, inputs_text, verdict_text

_XML_BAD = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _clean(text) -> str:
    return _CONTROL.sub("?", str(text))


def _figures(m: dict, r: dict) -> str:
    lim = m.get("limits") or {"min_cosine": r["min_cosine"], "max_abs": r.get("max_abs")}
    limits = f"threshold cosine >= {lim['min_cosine']}" + (f", max abs <= {lim['max_abs']}"
                                                          if lim.get("max_abs") is not None else "")
    return (f"cosine {m['cosine']:.6f}, max abs {m['max_abs']:.4g}, rel L2 {m['rel_l2']:.4g}, "
            f"SNR {m['snr_db']:.1f} dB ({limits})")


def plain_text(r: dict, top: int = 10) -> str:
    """The report as plain lines, names never cut (what verify prints when stdout is not a terminal)."""
    lines = [f"{_clean(r['model'])} vs {_clean(r['source'])}: {len(r['layers'])} layers matched, "
             f"{len(r['unmatched'])} without counterpart ({r['backend']}, {r.get('samples', 1)} sample(s))",
             f"inputs: {_clean(inputs_text(r.get('inputs')))}"]
    worst = sorted(r["layers"], key=lambda m: m["cosine"])[:top]
    order = {m["name"]: k for k, m in enumerate(r["layers"])}
    rows = [("tensor", "op", "cosine", "max_abs", "rel_l2", "snr_db", "")]
    for m in sorted(worst, key=lambda m: order[m["name"]]):
        mark = "first failing" if m["name"] == r["first_failing"] else ("fail" if not m["pass"] else "")
        rows.append((_clean(m["name"]), _clean(m["op"]), f"{m['cosine']:.6f}", f"{m['max_abs']:.3g}",
                     f"{m['rel_l2']:.3g}", f"{m['snr_db']:.1f}", mark))
    if len(rows) > 1:
        widths = [max(len(row[k]) for row in rows) for k in range(len(rows[0]))]
        lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    for o in r["outputs"]:
        lines.append(f"output {_clean(o['name'])}: cosine {o['cosine']:.6f}, max abs {o['max_abs']:.3g} "
                     f"{'pass' if o['pass'] else 'FAIL'}")
    if r["first_failing"]:
        lines.append(f"first layer below the threshold: {_clean(r['first_failing'])}")
    lines.append(_clean(verdict_text(r)))
    return "\n".join(lines)


def junit_xml(r: dict) -> bytes:
    """The JUnit XML document (see the module's docstring)."""
    cases = []          # (classname, name, kind, message, details); kind: None | failure | skipped
    for o in r["outputs"]:
        cases.append(("mnntool.verify.output", f"output {o['name']}", None if o["pass"] else "failure",
                      None if o["pass"] else f"output {o['name']} below the threshold: {_figures(o, r)}",
                      _figures(o, r)))
    for k, m in enumerate(r["layers"]):
        if m["pass"]:
            continue
        first = " (first failing layer)" if m["name"] == r["first_failing"] else ""
        msg = f"layer {m['name']} ({m.get('op', '?')} -> {m.get('mnn_op', '?')}){first}: {_figures(m, r)}"
        cases.append(("mnntool.verify.layer", f"layer {k} {m['name']}",
                      "skipped" if r.get("outputs_only") else "failure", msg, msg))
    match = r.get("match", {})
    same = r.get("exit_code") != EXIT_NOT_SAME_MODEL
    cases.append(("mnntool.verify.model", "same model", None if same else "failure",
                  None if same else verdict_text(r),
                  f"{match.get('layers', 0)} of {match.get('mnn_tensors', 0)} tensors of the .mnn matched; "
                  f"rule: {match.get('rule', '')}"))
    return _document(r, cases)


def junit_error(message: str, source: str, model: str) -> bytes:
    """A JUnit document for a run that stopped with an error (exit 2 or 3): one test case in error."""
    r = {"source": source, "model": model}
    return _document(r, [("mnntool.verify.model", "verify", "error", message, message)])


def _document(r: dict, cases: list, suite: str = "mnntool verify", title: str | None = None,
              props: tuple = ("mnntool_version", "schema", "source", "model", "backend", "min_cosine", "max_abs",
                              "samples", "exit_code"), inputs: str | None = None) -> bytes:
    """The JUnit document around `cases`; `llm verify` (mnntool/llm/verify_report.py) passes its own suite
    name, title, property keys and inputs line."""
    def x(text) -> str:
        return _XML_BAD.sub("?", str(text))
    n_fail = sum(c[2] == "failure" for c in cases)
    n_err = sum(c[2] == "error" for c in cases)
    n_skip = sum(c[2] == "skipped" for c in cases)
    counts = {"tests": str(len(cases)), "failures": str(n_fail), "errors": str(n_err), "skipped": str(n_skip),
              "time": "0"}
    root = ET.Element("testsuites", name=suite, **counts)
    suite = ET.SubElement(root, "testsuite", name=x(title or f"mnntool verify {r['model']} vs {r['source']}"), **counts,
                          timestamp=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S"),
                          hostname=x(socket.gethostname() or "localhost"))
    keys, props = props, ET.SubElement(suite, "properties")
    for key in keys:
        if r.get(key) is not None:
            ET.SubElement(props, "property", name=key, value=x(r[key]))
    if inputs is not None or "inputs" in r:
        ET.SubElement(props, "property", name="inputs", value=x(inputs if inputs is not None else inputs_text(r["inputs"])))
    for classname, name, kind, message, details in cases:
        case = ET.SubElement(suite, "testcase", classname=classname, name=x(name), time="0")
        if kind == "failure":
            f = ET.SubElement(case, "failure", message=x(message), type="AccuracyFailure"
                              if not classname.endswith(".model") else "NotSameModel")
            f.text = x(details)
        elif kind == "error":
            f = ET.SubElement(case, "error", message=x(message), type="MnnToolError")
            f.text = x(details)
        elif kind == "skipped":
            ET.SubElement(case, "skipped", message=x(f"--outputs-only: {message}"))
        else:
            ET.SubElement(case, "system-out").text = x(details)
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"


def _gh_data(text: str) -> str:
    return str(text).replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _gh_prop(text: str) -> str:
    return _gh_data(text).replace(":", "%3A").replace(",", "%2C")


def github_annotation(level: str, title: str, message: str, file: str | None = None) -> str:
    """One workflow command: ::error file=F,title=T::message (values escaped as the runner wants)."""
    props = ([f"file={_gh_prop(file)}"] if file else []) + [f"title={_gh_prop(title)}"]
    return f"::{level} {','.join(props)}::{_gh_data(message)}"


def github_lines(r: dict) -> list[str]:
    """::error for each failing output and layer (::warning for layers under --outputs-only), ::error
    when not the same model, ::notice with the verdict when it passes."""
    model = r["model"]
    out = []
    if r.get("exit_code") == EXIT_NOT_SAME_MODEL:
        out.append(github_annotation("error", "mnntool verify: not the same model", verdict_text(r), model))
    for o in r["outputs"]:
        if not o["pass"]:
            out.append(github_annotation("error", f"mnntool verify: output {o['name']}",
                                         f"output {o['name']} below the threshold: {_figures(o, r)}", model))
    for m in r["layers"]:
        if not m["pass"]:
            first = " (first failing layer)" if m["name"] == r["first_failing"] else ""
            out.append(github_annotation("warning" if r.get("outputs_only") else "error",
                                         f"mnntool verify: layer {m['name']}",
                                         f"layer {m['name']} ({m.get('op', '?')}){first}: {_figures(m, r)}", model))
    if r["pass"]:
        out.append(github_annotation("notice", "mnntool verify", f"{verdict_text(r)}; {inputs_text(r.get('inputs'))}",
                                     model))
    return out


def _md(text) -> str:
    return _clean(text).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;").replace("`", "'")


def markdown_summary(r: dict, top: int = 10) -> str:
    """The step summary: verdict, inputs, outputs, failing (or worst) layers."""
    mark = "✅" if r["pass"] else "❌"
    lines = [f"### {mark} mnntool verify: `{_md(r['model'])}` vs `{_md(r['source'])}`", "",
             f"**{_md(verdict_text(r))}**", "",
             f"- inputs: {_md(inputs_text(r.get('inputs')))}; {r.get('samples', 1)} sample(s)",
             f"- backend {r['backend']}; threshold cosine ≥ {r['min_cosine']}"
             + (f", max abs ≤ {r['max_abs']}" if r.get("max_abs") is not None else ""),
             f"- {len(r['layers'])} layers matched, {len(r['unmatched'])} without counterpart; "
             f"mnntool {r.get('mnntool_version', '?')}", "",
             "| output | cosine | max abs | rel L2 | SNR dB | |", "|---|---|---|---|---|---|"]
    for o in r["outputs"]:
        lines.append(f"| {_md(o['name'])} | {o['cosine']:.6f} | {o['max_abs']:.3g} | {o['rel_l2']:.3g} | "
                     f"{o['snr_db']:.1f} | {'pass' if o['pass'] else '**FAIL**'} |")
    bad = [m for m in r["layers"] if not m["pass"]]
    shown = bad[:top] if bad else sorted(r["layers"], key=lambda m: m["cosine"])[:min(top, 5)]
    if shown:
        lines += ["", f"{'Failing' if bad else 'Worst'} layers ({len(bad) if bad else len(shown)}"
                      f"{', first ' + str(top) + ' shown' if len(bad) > top else ''}):", "",
                  "| # | tensor | op | cosine | max abs | |", "|---|---|---|---|---|---|"]
        index = {m["name"]: k for k, m in enumerate(r["layers"])}
        for m in shown:
            lines.append(f"| {index[m['name']]} | `{_md(m['name'])}` | {_md(m.get('op', '?'))} | {m['cosine']:.6f} | "
                         f"{m['max_abs']:.3g} | {'pass' if m['pass'] else 'fail'} |")
    return "\n".join(lines) + "\n"


@contextmanager
def reporting_failure(junit: str | None, out_format: str, sources: list, error_doc, title: str, file: str,
                      echo=print):
    """A comparison that stops on a user error still leaves CI its report: the JUnit document saying why
    (`error_doc(message)` -> bytes) and a GitHub error annotation; the error goes on to the CLI's one line.
    `verify` and `llm verify` both write through this and `write_reports`, in the same order."""
    from .errors import MnnToolError
    from .format.writer import atomic_write
    try:
        yield
    except MnnToolError as e:
        if junit:
            atomic_write(junit, error_doc(str(e)), sources)
        if out_format == "github":
            echo(github_annotation("error", title, str(e), file))
        raise


def write_reports(sources: list, report: str | None, html, junit: str | None, junit_doc) -> None:
    """The HTML page (`html()` -> str) and the JUnit document (`junit_doc()` -> bytes), each written whole
    and never over an input."""
    from .format.writer import atomic_write
    if report:
        atomic_write(report, html().encode(), sources)
    if junit:
        atomic_write(junit, junit_doc(), sources)


def append_step_summary(markdown: str) -> None:
    """Appends to the workflow's step summary when GitHub Actions gives one ($GITHUB_STEP_SUMMARY)."""
    import os
    from .errors import MnnToolError
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if not summary:
        return
    try:
        with open(summary, "a", encoding="utf-8") as f:
            f.write(markdown)
    except OSError as e:
        raise MnnToolError(f"$GITHUB_STEP_SUMMARY {summary}: cannot write ({e.strerror or e})") from None
