"""Thread scaling of mnntool's LLM engine against MNN-LLM on one bundle, with each step's time.

    python benchmarks/llm_threads.py BUNDLE [--threads 1,2,4,8,16] [-p 512] [-n 128] [--rounds 1]
                                     [--wait auto,passive] [--no-mnn] [--json OUT]
    python benchmarks/llm_threads.py --build DIR ...     # DIR/out-q4 built first when absent

Why: the engine ran faster than MNN-LLM at one thread and slower from four (issue 45). Each thread count
runs, in child processes of their own (engine/bench.py's child: load, warm-up, one prefill of P random
tokens and N decode steps from an empty cache), mnntool at each OpenMP wait policy asked for (auto: the
engine's choice, kernels.passive_wait; passive; spin; spin:N, libgomp's GOMP_SPINCOUNT) and MNN-LLM
(`MNN.llm`, low/low as config.json says),
interleaved per thread count so that a busy host slows them alike. mnntool's child then repeats one
prefill and the decode with its step profile on (profile.StepTimes): milliseconds per step, the parallel
regions opened per token, and how far the sum of the steps is from the wall time (Python between them).
At one thread the rates per CPU second (the child's process time) are printed too: on a host shared with
other jobs they leave out the time the process waited for a core.

Only the Python API is used (no CLI). `--build DIR` makes the random Qwen2.5-0.5B-shaped checkpoint
(fixtures.llm_checkpoints, bfloat16) and its 4-bit, block-64 bundle with mnntool.llm.bundle.export.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mnntool.llm.engine.bench import host_info, run_child  # noqa: E402


def build(root: Path, vocab: int | None = None) -> Path:
    """The random 0.5B-shaped checkpoint and its 4-bit bundle under `root` (kept when present)."""
    out = root / "out-q4"
    if (out / "llm.mnn").is_file():
        return out
    from fixtures.llm_checkpoints import build_random
    print(f"building the checkpoint under {root} ...", flush=True)
    kw = {"vocab_size": vocab} if vocab else {}
    src = build_random("qwen2", root / "qwen2-0.5b-bfloat16", size="0.5b", dtype="bfloat16", **kw)
    from mnntool.llm.bundle import export
    print(f"exporting {src} -> {out} (4 bits, block 64) ...", flush=True)
    export(src, out, bits=4, block=64)
    return out


def _measure(backend, bundle, t, a, wait="auto", profile=False):
    r = run_child(backend, bundle, t, a.p, a.n, 1, wait=wait, profile=profile)
    row = {"threads": t, "backend": backend if backend == "mnn" else f"mnntool/{wait}",
           "prefill_tps": a.p / r["pp"][0], "decode_tps": a.n / r["tg"][0], "load_s": r["load_s"],
           "peak_rss": r["peak_rss"]}
    if t == 1 and r.get("tg_cpu"):   # one thread: tokens per CPU second, what a busy shared host leaves comparable
        row["prefill_cpu_tps"] = a.p / r["pp_cpu"][0]
        row["decode_cpu_tps"] = a.n / r["tg_cpu"][0]
    if "profile" in r:
        row["profile"] = r["profile"]
    return row


def _steps_line(prof: dict, top: int = 6) -> str:
    steps = sorted(prof["steps"].items(), key=lambda kv: -kv[1]["ms"])[:top]
    return ", ".join(f"{k} {v['ms']:.2f}" for k, v in steps)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle", nargs="?", default=None)
    ap.add_argument("--build", default=None, help="build the 0.5B-shaped bundle under this folder (if absent)")
    ap.add_argument("--vocab", type=int, default=None, help="with --build: the vocabulary rows (vocab_size; default Qwen2.5's 151936)")
    ap.add_argument("--threads", default="1,2,4,8,16")
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--wait", default="auto", help="mnntool's OpenMP wait policies, comma-separated: auto, passive, "
                    "spin (forever), spin:N (GOMP_SPINCOUNT N, then sleep)")
    ap.add_argument("--no-mnn", action="store_true", help="mnntool only")
    ap.add_argument("--no-profile", action="store_true", help="skip the per-step profile")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if a.build:
        bundle = build(Path(a.build), a.vocab)
    elif a.bundle:
        bundle = Path(a.bundle)
    else:
        raise SystemExit("give a bundle folder or --build DIR")
    if not (bundle / "llm.mnn").is_file():
        raise SystemExit(f"{bundle}: no llm.mnn (not a bundle)")
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    counts = [int(t) for t in a.threads.split(",") if int(t) <= cpus]
    waits = [w.strip() for w in a.wait.split(",") if w.strip()]
    for w in waits:
        if w not in ("auto", "passive", "spin") and not (w.startswith("spin:") and w[5:].isdigit()):
            raise SystemExit(f"--wait {w}: auto, passive, spin or spin:N")
    runs = []
    for rnd in range(a.rounds):
        for t in counts:
            todo = [("mnntool", w) for w in (waits if t > 1 else waits[:1])]
            if not a.no_mnn:
                todo.append(("mnn", "auto"))
            for backend, w in todo:
                row = _measure(backend, bundle, t, a, w, profile=(rnd == 0 and backend == "mnntool" and not a.no_profile))
                row["round"] = rnd
                runs.append(row)
                print(f"round {rnd} threads {t:>2} {row['backend']:>16}: prefill {row['prefill_tps']:7.1f} tok/s  "
                      f"decode {row['decode_tps']:6.2f} tok/s  load {row['load_s']:.2f} s  "
                      f"RSS {row['peak_rss'] / 2**20:.0f} MB" + (f"  (per CPU second: prefill {row['prefill_cpu_tps']:.1f}, "
                      f"decode {row['decode_cpu_tps']:.2f})" if "decode_cpu_tps" in row else ""), flush=True)
                for phase in ("prefill", "decode"):
                    pr = row.get("profile", {}).get(phase)
                    if pr:
                        print(f"    {phase}: steps {pr['total_ms']:.2f} ms of {pr['wall_ms']:.2f} wall, "
                              f"{pr['regions']:.0f} parallel regions; {_steps_line(pr)}", flush=True)
    names = sorted({r["backend"] for r in runs})
    summary = []
    for t in counts:
        for name in names:
            mine = [r for r in runs if r["threads"] == t and r["backend"] == name]
            if not mine:
                continue
            s = {"threads": t, "backend": name,
                 "prefill_tps": float(np.median([r["prefill_tps"] for r in mine])),
                 "decode_tps": float(np.median([r["decode_tps"] for r in mine]))}
            theirs = [r for r in runs if r["threads"] == t and r["backend"] == "mnn"]
            if name != "mnn" and theirs:
                pairs = list(zip(mine, theirs))
                s["prefill_vs_mnn"] = float(np.median([m["prefill_tps"] / o["prefill_tps"] for m, o in pairs]))
                s["decode_vs_mnn"] = float(np.median([m["decode_tps"] / o["decode_tps"] for m, o in pairs]))
                if all("decode_cpu_tps" in r for r in mine + theirs):
                    s["prefill_cpu_vs_mnn"] = float(np.median([m["prefill_cpu_tps"] / o["prefill_cpu_tps"] for m, o in pairs]))
                    s["decode_cpu_vs_mnn"] = float(np.median([m["decode_cpu_tps"] / o["decode_cpu_tps"] for m, o in pairs]))
            one = [r for r in runs if r["threads"] == 1 and r["backend"].split("/")[0] == name.split("/")[0]]
            if one:
                s["prefill_scaling"] = s["prefill_tps"] / float(np.median([r["prefill_tps"] for r in one]))
                s["decode_scaling"] = s["decode_tps"] / float(np.median([r["decode_tps"] for r in one]))
            summary.append(s)
    info = host_info()
    print(f"\n{bundle} on {info['cpu_info']} ({info['n_cpus']} CPUs), prompt {a.p}, {a.n} decoded, "
          f"{a.rounds} round(s); scaling = tok/s over the same runtime's at 1 thread")
    print("| threads | runtime | prefill tok/s | decode tok/s | vs MNN-LLM | scaling |")
    print("|---|---|---|---|---|---|")
    for s in summary:
        vs = f"{s['prefill_vs_mnn']:.2f}x / {s['decode_vs_mnn']:.2f}x" if "prefill_vs_mnn" in s else ""
        sc = f"{s['prefill_scaling']:.2f}x / {s['decode_scaling']:.2f}x" if "prefill_scaling" in s else ""
        print(f"| {s['threads']} | {s['backend']} | {s['prefill_tps']:.1f} | {s['decode_tps']:.2f} | {vs} | {sc} |")
    cpu = [s for s in summary if "decode_cpu_vs_mnn" in s]
    for s in cpu:
        print(f"1 thread, per CPU second (descheduled time left out): {s['backend']} vs MNN-LLM prefill "
              f"{s['prefill_cpu_vs_mnn']:.2f}x, decode {s['decode_cpu_vs_mnn']:.2f}x")
    if a.json:
        Path(a.json).write_text(json.dumps({"host": info, "bundle": str(bundle), "p": a.p, "n": a.n,
                                            "runs": runs, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
