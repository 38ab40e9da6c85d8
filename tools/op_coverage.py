"""Write docs/results/op_coverage.json: the ops MNN's own converter lists per framework (`MNNConvert -f FW
--OP`, run through mnntool.mnn_tools in a child process). The docs' op-coverage table puts them beside
mnntool's own counts, which tools/results_tables.py takes from the frontends' tables at build time (what
`mnntool ops` lists), so neither column is typed and mnntool's never goes stale.

    python tools/op_coverage.py [--out docs/results/op_coverage.json]

MNN's lists come from the `mnn` wheel installed here; a framework its converter does not take (the wheel's
converter has no TorchScript frontend) is left blank. Counts are of each tool's own names.
"""
from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FRONTENDS = [("ONNX", "onnx", "ONNX"), ("TorchScript / torch.export", "torch", None), ("TensorFlow", "tf", "TF"),
             ("TFLite", "tflite", "TFLITE"), ("Caffe", "caffe", "CAFFE")]


def mnn_ops(fw: str) -> list[str] | None:
    """The ops MNN's converter lists for `fw`, or None when it does not take that framework."""
    from mnntool.errors import MnnToolError
    from mnntool.mnn_tools import mnnconvert
    try:
        out = mnnconvert("-f", fw, "--OP")
    except MnnToolError:
        return None
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    try:
        start = next(i for i, line in enumerate(lines) if line.startswith("Dump ")) + 1
        end = next(i for i, line in enumerate(lines) if re.match(r"Total: \d+$", line))
    except StopIteration:
        return None
    return lines[start:end]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "op_coverage.json"))
    a = ap.parse_args()
    from mnntool.cli import supported_ops      # first: the CLI module tunes the process before numpy loads
    import MNN
    mnn = {title: (mnn_ops(theirs) if theirs else None) for title, _, theirs in FRONTENDS}
    data = {"kind": "op_coverage", "command": "python tools/op_coverage.py", "cpu": "any (not CPU-dependent)",
            "date": datetime.date.today().isoformat(), "mnn_version": MNN.version(),
            "frontends": {title: ours for title, ours, _ in FRONTENDS}, "mnn": mnn}
    Path(a.out).write_text(json.dumps(data, indent=1) + "\n")
    print(json.dumps({t: [len(supported_ops(f)), None if mnn[t] is None else len(mnn[t])]
                      for t, f, _ in FRONTENDS}))


if __name__ == "__main__":
    main()
