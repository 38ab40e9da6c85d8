"""`mnntool llm export` against MNN's `llmexport` on one checkpoint: wall time, peak RSS, bundle size,
and whether MNN-LLM gives the two bundles' greedy tokens alike. Each export runs in a fresh child
process, taking turns, `--repeat` times; peak RSS is the child's own (wait4's ru_maxrss, which for
llmexport includes the converter processes it waits for, as their maximum).

    python benchmarks/llm_export_speed.py CHECKPOINT [--bits 4] [--block 64] [--repeat 1] [--json]
    # checkpoints: python -m fixtures.llm_checkpoints build/llmbench random qwen2 --size 0.5b --dtype bfloat16

llmexport is not a dependency: see benchmarks/llmexport_ref.py for installing it into build/llmref/pkgs.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _timed(cmd: list[str]) -> dict:
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = p.stdout.read()
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    if p.returncode:
        raise SystemExit(f"{cmd[:4]} failed ({p.returncode}): {out.decode(errors='replace')[-800:]}")
    return {"seconds": round(wall, 2), "peak_rss_mb": round(ru.ru_maxrss / 1024, 1)}


def run(ckpt: Path, out_root: Path, bits: int, block: int, repeat: int) -> dict:
    rows = {"mnntool": [], "llmexport": []}
    for r in range(repeat):
        for tool in rows:
            out = out_root / f"{tool}-q{bits}"
            shutil.rmtree(out, ignore_errors=True)
            if tool == "mnntool":
                cmd = [sys.executable, "-m", "mnntool", "llm", "export", str(ckpt), str(out), "--bits", str(bits),
                       "--block", str(block), "--json"]
            else:
                cmd = [sys.executable, str(ROOT / "benchmarks" / "llmexport_ref.py"), str(ckpt), str(out),
                       "--bits", str(bits), "--block", str(block), "--lm-bits", str(bits)]
            row = _timed(cmd)
            row["bundle_bytes"] = sum(p.stat().st_size for p in out.iterdir()
                                      if p.name not in ("export.json", "export_args.json", "llm.mnn.json"))
            rows[tool].append(row)
    summary = {}
    for tool, rs in rows.items():
        summary[tool] = {"seconds": min(r["seconds"] for r in rs), "peak_rss_mb": max(r["peak_rss_mb"] for r in rs),
                         "bundle_bytes": rs[-1]["bundle_bytes"], "runs": rs}
    m, l = summary["mnntool"], summary["llmexport"]
    summary["ratios"] = {"time": round(m["seconds"] / l["seconds"], 3), "rss": round(m["peak_rss_mb"] / l["peak_rss_mb"], 3),
                         "size": round(m["bundle_bytes"] / l["bundle_bytes"], 4)}
    return summary


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "llmbench" / "speed")
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    r = run(a.checkpoint, a.out, a.bits, a.block, a.repeat)
    r["cpu"] = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    r["checkpoint"] = str(a.checkpoint)
    if a.json:
        print(json.dumps(r))
        return
    print(f"{a.checkpoint.name}, {a.bits} bits, block {a.block}, {r['cpu']}")
    print("| tool | seconds | peak RSS MB | bundle bytes |\n|---|---|---|---|")
    for tool in ("mnntool", "llmexport"):
        x = r[tool]
        print(f"| {tool} | {x['seconds']} | {x['peak_rss_mb']} | {x['bundle_bytes']:,} |")
    print(f"mnntool / llmexport: time {r['ratios']['time']}, RSS {r['ratios']['rss']}, size {r['ratios']['size']}")


if __name__ == "__main__":
    main()
