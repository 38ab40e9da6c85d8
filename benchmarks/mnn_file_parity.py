"""Our files in MNN: each model converted by mnntool and by MNN's own converter, both files run in the
real MNN runtime taking turns run by run in one process; the ratio is mnntool's file time over MNN's
file time (the promise: never above 1.0, geometric mean <= 0.95). For each model the op-type counts of
both files show what differs (the first place to look when our file is slower).

    python benchmarks/mnn_file_parity.py [--models fastvit_t8 ...] [--threads 1] [--budget-s 4] [--out build/wide]
                                         [--reconvert] [--min-runs 30] [--clock cpu|wall]

At 1 thread each forward is timed by the calling thread's CPU time (MNN computes in that thread), so a
shared host's other load does not count; each row also has the spread of the run-by-run ratios
(ratio_q25..ratio_q75) and the wall-clock ratio. Half the runs load our file first, half MNN's file
first (ratio_ours_first / ratio_theirs_first): where the loads land in memory can favour either file.

Sources are the wide speed set's dynamo exports (benchmarks/wide_speed.py --export-only writes them).
Writes <out>/mnn_file_parity_t<N>.json.
"""
from __future__ import annotations

import argparse
import collections
import json
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def op_counts(path: Path) -> dict[str, int]:
    """Op types of a .mnn file as MNN names them (read with mnntool's schema reader)."""
    from mnntool.format import reader
    net = reader.decode(bytearray(path.read_bytes()), "Net")
    return dict(collections.Counter(str(op.get("type")) for op in net.get("oplists") or []))


def theirs(src: Path, dst: Path) -> None:
    from mnntool.mnn_tools import mnnconvert
    if not dst.exists():
        mnnconvert("-f", "ONNX", "--modelFile", str(src), "--MNNModel", str(dst), "--bizCode", "parity")


def _quartiles(v: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(v, n=4)
    return q[0], q[2]


def paired_in_mnn(ours: Path, other: Path, threads: int, budget_s: float, min_runs: int = 30,
                  clock: str = "cpu") -> dict:
    """Both files run in MNN taking turns run by run. clock "cpu" times each forward by the calling
    thread's CPU time (MNN at 1 thread computes in the calling thread, so other processes on a shared
    host do not count: under load the wall times here were up to 4x the CPU times); "wall" by the clock
    on the wall (the only honest one at more than 1 thread). The ratio is of the medians; ratio_q25..q75
    is the spread of the run-by-run ratios.

    Half the runs with our file loaded first, half (fresh modules) with MNN's file loaded first: where the
    two loads land in memory can favour one file whatever its form (two byte-identical files differed by
    +-10% per op run to run); ratio_ours_first / ratio_theirs_first show that bias when it is there."""
    import gc

    from mnntool.inputs import random_feeds
    from mnntool.loading import load_graph
    from mnntool.runtime.mnn_backend import MnnSession
    g, g2 = load_graph(ours), load_graph(other)
    feeds = random_feeds(g, None)
    feeds2 = {n2: feeds[n1] for n1, n2 in zip(g.inputs, g2.inputs)}
    data = {"ours": feeds, "theirs": feeds2}
    spec = {"ours": (ours, g), "theirs": (other, g2)}
    tick = time.thread_time if clock == "cpu" else time.perf_counter
    times: dict = {"ours": [], "theirs": []}
    walls: dict = {"ours": [], "theirs": []}
    halves = []
    runs = None
    for first in ("ours", "theirs"):
        order = (first, "theirs" if first == "ours" else "ours")
        sessions = {k: MnnSession(str(spec[k][0]), spec[k][1].inputs, spec[k][1].outputs, threads=threads)
                    for k in order}
        for k in order:
            for _ in range(3):
                sessions[k].run(data[k])
        if runs is None:
            t0 = time.perf_counter()
            sessions["ours"].run(feeds)
            once = time.perf_counter() - t0
            runs = max(min_runs, min(300, int(budget_s / 2 / max(once, 1e-4))))
        half = {"ours": [], "theirs": []}
        for i in range((runs + 1) // 2 if first == "ours" else runs // 2):
            for k in (("ours", "theirs") if i % 2 == 0 else ("theirs", "ours")):
                w0, t0 = time.perf_counter(), tick()
                sessions[k].run(data[k])
                half[k].append((tick() - t0) * 1e3)
                walls[k].append((time.perf_counter() - w0) * 1e3)
        for k in half:
            times[k] += half[k]
        halves.append(statistics.median(half["ours"]) / statistics.median(half["theirs"]) if half["ours"] else None)
        del sessions
        gc.collect()
    med = {k: statistics.median(v) for k, v in times.items()}
    q25, q75 = _quartiles([a / b for a, b in zip(times["ours"], times["theirs"])])
    return {"ours_ms": med["ours"], "theirs_ms": med["theirs"], "ratio": med["ours"] / med["theirs"],
            "ratio_q25": q25, "ratio_q75": q75, "clock": clock,
            "wall_ratio": statistics.median(walls["ours"]) / statistics.median(walls["theirs"]), "runs": runs,
            "ratio_ours_first": halves[0], "ratio_theirs_first": halves[1]}


def main():
    from benchmarks.speed_set import SET
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="*", default=list(SET))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--budget-s", type=float, default=4.0)
    ap.add_argument("--min-runs", type=int, default=30, help="runs of each file at least (10 left 1.06x rows of noise)")
    ap.add_argument("--clock", choices=("cpu", "wall"), default=None,
                    help="cpu: the calling thread's CPU time (default at 1 thread); wall (default at more)")
    ap.add_argument("--out", default=str(ROOT / "build" / "wide"))
    ap.add_argument("--reconvert", action="store_true", help="write mnntool's file again even when present")
    ap.add_argument("--shard", default="0/1", help="I/N: every N-th model from the I-th (parallel pinned runs)")
    args = ap.parse_args()
    out = Path(args.out)
    i, n = map(int, args.shard.split("/"))
    suffix = "" if args.shard == "0/1" else f"_s{i}of{n}"
    clock = args.clock or ("cpu" if args.threads == 1 else "wall")
    if clock == "cpu" and args.threads != 1:
        ap.error("--clock cpu times the calling thread only: use it at --threads 1")
    rows = []
    for name in args.models[i::n]:
        src = out / f"{name}.onnx"
        if not src.exists():
            continue
        ours, other = out / f"{name}.mnn", out / f"{name}.mnnconvert.mnn"
        row = {"model": name}
        try:
            if args.reconvert or not ours.exists():     # ours follows the tree; MNN's converter's file is kept
                from mnntool import api
                api.convert(src, ours)
            theirs(src, other)
            row.update(paired_in_mnn(ours, other, args.threads, args.budget_s, args.min_runs, clock))
            a, b = op_counts(ours), op_counts(other)
            row["op_diff"] = {k: [a.get(k, 0), b.get(k, 0)] for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}
            print(f"{name:28s} ours {row['ours_ms']:8.2f} ms  MNN's file {row['theirs_ms']:8.2f} ms  "
                  f"x {row['ratio']:.3f} ({row['ratio_q25']:.3f}..{row['ratio_q75']:.3f}; loaded first: ours "
                  f"{row['ratio_ours_first']:.3f}, theirs {row['ratio_theirs_first'] or 0:.3f})  "
                  f"ops differ: {row['op_diff']}", flush=True)
        except Exception as e:      # noqa: BLE001 - a model that fails is a row with its reason
            row["error"] = " ".join(str(e).split())[:200]
            print(f"{name:28s} failed: {row['error']}", flush=True)
        rows.append(row)
        summary(rows, out / f"mnn_file_parity_t{args.threads}{suffix}.json", args.threads)     # kept if stopped
    summary(rows, out / f"mnn_file_parity_t{args.threads}{suffix}.json", args.threads)


def summary(rows: list[dict], path: Path, threads: int) -> None:
    from benchmarks.wide_speed import cpu_name
    ratios = [r["ratio"] for r in rows if "ratio" in r]
    gm = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None
    if gm:
        print(f"geometric mean over {len(ratios)}: x {gm:.3f}; worst {max(ratios):.3f}")
    path.write_text(json.dumps({"cpu": cpu_name(), "threads": threads, "rows": rows, "geomean": gm,
                                "command": "python " + " ".join(sys.argv), "date": time.strftime("%Y-%m-%d")},
                               indent=1))


if __name__ == "__main__":
    main()
