"""Decode and prefill speed of mnntool's runtime against MNN-LLM on the same bundle, paired run by run.

    python benchmarks/llm_speed.py [BUNDLE] [--threads 1,2] [--rounds 3] [-p 512] [-n 128] [--json OUT]

BUNDLE defaults to build/llmbench/out-mnntool-q4 (a Qwen2.5-0.5B-shaped random checkpoint at 4 bits,
block 64), built when absent:
    python -m fixtures.llm_checkpoints build/llmbench random qwen2 --size 0.5b --dtype bfloat16
    mnntool llm export build/llmbench/qwen2-0.5b-bfloat16 build/llmbench/out-mnntool-q4 --bits 4
Every round runs, at each thread count, one child process per runtime in turn (mnntool, MNN-LLM as
users run it: precision/memory low, MNN-LLM exact: precision/memory high), each doing a warm-up then
one prefill of P random tokens and N decode steps from an empty cache (engine/bench.py). Rounds
interleave the runtimes so that a busy host slows them alike; the table gives per-round figures and the
median of the per-round ratios.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mnntool.llm.engine.bench import host_info, run_child  # noqa: E402

DEFAULT = ROOT / "build" / "llmbench" / "out-mnntool-q4"
BACKENDS = [("mnntool", False), ("mnn", False), ("mnn", True)]


def ensure_bundle(path: Path) -> Path:
    if (path / "llm.mnn").is_file():
        return path
    if path != DEFAULT:
        raise SystemExit(f"{path}: no bundle there")
    src = ROOT / "build" / "llmbench" / "qwen2-0.5b-bfloat16"
    if not (src / "config.json").is_file():
        subprocess.run([sys.executable, "-m", "fixtures.llm_checkpoints", str(src.parent), "random", "qwen2",
                        "--size", "0.5b", "--dtype", "bfloat16"], check=True, cwd=ROOT)
    subprocess.run([sys.executable, "-m", "mnntool", "llm", "export", str(src), str(path), "--bits", "4"],
                   check=True, cwd=ROOT)
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle", nargs="?", default=str(DEFAULT))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--no-exact", action="store_true", help="skip MNN-LLM's exact mode (slow)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    bundle = ensure_bundle(Path(a.bundle))
    backends = [b for b in BACKENDS if not (a.no_exact and b[1])]
    counts = [int(t) for t in a.threads.split(",")]
    runs = []
    for rnd in range(a.rounds):
        for t in counts:
            for backend, exact in backends:
                r = run_child(backend, bundle, t, a.p, a.n, 1, exact=exact)
                row = {"round": rnd, "threads": t, "backend": backend + (" exact" if exact else ""),
                       "prefill_tps": a.p / r["pp"][0], "decode_tps": a.n / r["tg"][0],
                       "load_s": r["load_s"], "peak_rss": r["peak_rss"]}
                runs.append(row)
                print(f"round {rnd} threads {t} {row['backend']:>13}: prefill {row['prefill_tps']:7.1f} tok/s  "
                      f"decode {row['decode_tps']:6.2f} tok/s  load {row['load_s']:.2f} s  "
                      f"peak RSS {row['peak_rss'] / 2**20:.0f} MB", flush=True)
    summary = []
    for t in counts:
        mine = [r for r in runs if r["threads"] == t and r["backend"] == "mnntool"]
        for name in sorted({r["backend"] for r in runs} - {"mnntool"}):
            theirs = [r for r in runs if r["threads"] == t and r["backend"] == name]
            pairs = list(zip(mine, theirs))
            summary.append({"threads": t, "vs": name,
                            "mnntool_prefill": float(np.median([m["prefill_tps"] for m in mine])),
                            "mnntool_decode": float(np.median([m["decode_tps"] for m in mine])),
                            "other_prefill": float(np.median([o["prefill_tps"] for o in theirs])),
                            "other_decode": float(np.median([o["decode_tps"] for o in theirs])),
                            "prefill_ratio": float(np.median([m["prefill_tps"] / o["prefill_tps"] for m, o in pairs])),
                            "decode_ratio": float(np.median([m["decode_tps"] / o["decode_tps"] for m, o in pairs]))})
    info = host_info()
    print(f"\n{bundle} on {info['cpu_info']} ({info['n_cpus']} CPUs), prompt {a.p}, {a.n} decoded, "
          f"{a.rounds} rounds (medians; ratio = median of per-round mnntool / other)")
    print("| threads | vs | mnntool prefill | other prefill | ratio | mnntool decode | other decode | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for s in summary:
        print(f"| {s['threads']} | {s['vs']} | {s['mnntool_prefill']:.1f} | {s['other_prefill']:.1f} | "
              f"{s['prefill_ratio']:.2f}x | {s['mnntool_decode']:.2f} | {s['other_decode']:.2f} | {s['decode_ratio']:.2f}x |")
    if a.json:
        Path(a.json).write_text(json.dumps({"host": info, "bundle": str(bundle), "p": a.p, "n": a.n,
                                            "runs": runs, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
