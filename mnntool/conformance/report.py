"""Pass counts per op and failures grouped by cause, as JSON and markdown."""
from __future__ import annotations

import re
from collections import Counter, defaultdict


def cause_of(result: dict) -> str:
    """A failure's reason with names, paths and numbers taken out, so alike failures group together."""
    if result.get("status") == "pass":
        return "pass"
    reason = result.get("reason", "")
    m = re.search(r"unsupported ONNX ops: (.*)", reason)
    if m:
        return "unsupported op " + ", ".join(re.findall(r"(\S+) \(", m.group(1)))
    reason = re.sub(r"^\S*model\.onnx: ", "", reason)
    reason = re.sub(r"'[^']*'", "'…'", reason)
    reason = re.sub(r"\[[^\]]*\]", "[…]", reason)
    reason = re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "N", reason)
    return f"{result.get('stage', '?')}: {reason[:160]}"


def summarize(entries: list[dict], results: dict[str, dict[str, dict]]) -> dict:
    """results: {runtime: {case: result}} -> totals, per-op counts and causes per runtime."""
    out = {"total": len(entries), "runtimes": {}, "groups": {}}
    for e in entries:
        out["groups"].setdefault(e.get("group", "node"), 0)
        out["groups"][e.get("group", "node")] += 1
    for runtime, res in results.items():
        passed = sorted(n for n, r in res.items() if r.get("status") == "pass")
        per_op: dict = defaultdict(lambda: [0, 0])
        for e in entries:
            if e["name"] in res:
                per_op[e["op"]][1] += 1
                per_op[e["op"]][0] += res[e["name"]].get("status") == "pass"
        causes = Counter(cause_of(r) for r in res.values() if r.get("status") != "pass")
        examples = {}
        for n, r in sorted(res.items()):
            c = cause_of(r)
            if c != "pass":
                examples.setdefault(c, []).append(n)
        per_group: dict = defaultdict(lambda: [0, 0])
        for e in entries:
            if e["name"] in res:
                per_group[e.get("group", "node")][1] += 1
                per_group[e.get("group", "node")][0] += res[e["name"]].get("status") == "pass"
        out["runtimes"][runtime] = {
            "ran": len(res), "passed": len(passed), "passed_cases": passed,
            "per_group": {g: {"passed": p, "total": t} for g, (p, t) in per_group.items()},
            "per_op": {op: {"passed": p, "total": t} for op, (p, t) in sorted(per_op.items())},
            "causes": [{"cause": c, "count": k, "examples": examples[c][:5]} for c, k in causes.most_common()],
        }
    return out


def markdown(summary: dict, top: int = 40) -> str:
    groups = list(summary.get("groups", {}))
    lines = [f"# ONNX backend tests: {summary['total']} applicable cases", "",
             "| runtime | passed | ran | " + " | ".join(groups) + " |", "|---|---|---|" + "---|" * len(groups)]
    for rt, s in summary["runtimes"].items():
        cells = [f"{s['per_group'].get(g, {}).get('passed', 0)}/{s['per_group'].get(g, {}).get('total', 0)}"
                 for g in groups]
        lines.append(f"| {rt} | {s['passed']} | {s['ran']} | " + " | ".join(cells) + " |")
    for rt, s in summary["runtimes"].items():
        lines += ["", f"## {rt}: failures by cause", "", "| count | cause | examples |", "|---|---|---|"]
        for c in s["causes"][:top]:
            cause = c["cause"].replace("|", "\\|")
            lines.append(f"| {c['count']} | {cause} | {', '.join(c['examples'][:3])} |")
    rts = list(summary["runtimes"])
    lines += ["", "## per op", "", "| op | " + " | ".join(rts) + " |", "|---|" + "---|" * len(rts)]
    ops = sorted({op for s in summary["runtimes"].values() for op in s["per_op"]})
    for op in ops:
        cells = []
        for rt in rts:
            c = summary["runtimes"][rt]["per_op"].get(op)
            cells.append(f"{c['passed']}/{c['total']}" if c else "-")
        lines.append(f"| {op} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
