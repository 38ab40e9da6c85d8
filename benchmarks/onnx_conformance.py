"""The ONNX backend node tests through `mnntool convert`, then mnntool's runtime and the MNN runtime.

    python benchmarks/onnx_conformance.py [--runtimes mnntool mnn] [--workers 2] [--match REGEX]
        [--out build/conformance] [--write-expected tests/conformance/expected_pass.txt]

Writes build/conformance/summary.json and summary.md: pass counts per runtime and per op, failures
grouped by cause. Outputs are judged by allclose(rtol=1e-3, atol=1e-4 x max(1, max|expected|));
integer and boolean outputs exactly.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mnntool.conformance import materialize, materialize_models  # noqa: E402
from mnntool.conformance.report import markdown, summarize  # noqa: E402
from mnntool.conformance.runner import run_cases  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runtimes", nargs="+", default=["mnntool", "mnn"], choices=["mnntool", "mnn", "mnnconvert", "onnxruntime"],
                    help="mnnconvert: MNN's own converter, then the MNN runtime; onnxruntime: the source model in onnxruntime")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--match", default=None, help="only cases whose name matches this regex")
    ap.add_argument("--out", default=str(ROOT / "build" / "conformance"))
    ap.add_argument("--nodes-only", action="store_true", help="skip the stored model groups (light CNNs, pytorch-*)")
    ap.add_argument("--write-expected", default=None, help="write mnntool's passing cases to this file")
    args = ap.parse_args()
    out = Path(args.out)
    cases = out / "cases"
    entries = [dict(e, group="node") for e in materialize(cases)]
    if not args.nodes_only:
        entries += materialize_models(cases)
    if args.match:
        entries = [e for e in entries if re.search(args.match, e["name"])]
    results = {}
    for rt in ["mnntool"] + [r for r in args.runtimes if r != "mnntool"]:   # MNN runs mnntool's files
        t0 = time.time()
        done = [0]

        def tick():
            done[0] += 1
            if done[0] % 100 == 0:
                print(f"  {rt}: {done[0]}/{len(entries)}", file=sys.stderr, flush=True)
        results[rt] = run_cases(rt, entries, cases, out / "files", args.workers, args.timeout, tick)
        passed = sum(r["status"] == "pass" for r in results[rt].values())
        print(f"{rt}: {passed}/{len(entries)} passed in {time.time() - t0:.0f} s", flush=True)
    summary = summarize(entries, {rt: results[rt] for rt in args.runtimes})
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "summary.md").write_text(markdown(summary))
    (out / "results.json").write_text(json.dumps(results, indent=0))
    if args.write_expected:
        Path(args.write_expected).write_text("\n".join(summary["runtimes"]["mnntool"]["passed_cases"]) + "\n")
    print(f"wrote {out / 'summary.md'}")


if __name__ == "__main__":
    main()
