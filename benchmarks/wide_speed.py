"""mnntool against onnxruntime, OpenVINO and MNN on the wide speed set (benchmarks/speed_set.py), paired
run by run in one process (paired_speed.paired), every model reported every time, with geometric means
and the CPU the figures came from.

    python benchmarks/wide_speed.py --export-only [--jobs 8]       # dynamo exports, one process each
    python benchmarks/wide_speed.py [--threads 1] [--models ...] [--budget-s 6] [--out build/wide]
    taskset -c 0-3 python benchmarks/wide_speed.py --threads 4 --shard 0/3    # one of three pinned runs
    python benchmarks/wide_speed.py --merge build/wide/wide_speed_t4_s*.json   # their rows in one table

Exports and conversions are cached in --out; a model whose export or conversion fails is a row with its
reason. Each model is timed for about --budget-s seconds of mnntool's time (at least 10 runs). Writes
<out>/wide_speed_t<N>.json: {"cpu", "threads", "rows", "geomean"}.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def export_one(name: str, out: Path) -> str:
    """The case's dynamo export at out/<name>.onnx (kept when present); '' or the reason it failed."""
    import contextlib
    import io

    import torch

    from benchmarks.speed_set import SET
    dst = out / f"{name}.onnx"
    if dst.exists():
        return ""
    case = SET[name]
    torch.manual_seed(0)
    model = case.build().eval()
    from fixtures.zoo import wrapped
    x = case.inputs()
    dims = {a: torch.export.Dim(f"{case.names[0]}_{n}", min=32, max=4096) for a, n in case.dynamic.get(0, {}).items()}
    tmp = dst.with_suffix(".part.onnx")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), torch.no_grad():
        torch.onnx.export(wrapped(model), x, str(tmp), input_names=list(case.names), output_names=["y"],
                          dynamo=True, dynamic_shapes=(dims,) if dims else None, external_data=False)
    tmp.replace(dst)
    return ""


def _export_all(names: list[str], out: Path, jobs: int, warm_threads: int = 0) -> dict[str, str]:
    def one(name):
        if (out / f"{name}.onnx").exists() and all((out / f"{label}.mnn").exists() for label, _ in _variants(name)):
            return name, ""
        cmd = [sys.executable, __file__, "--export", name, "--out", str(out), "--warm-threads", str(warm_threads)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        err = done.stderr.strip().splitlines()
        return name, "" if done.returncode == 0 else (err[-1] if err else f"exit {done.returncode}")[:200]
    with ThreadPoolExecutor(jobs) as ex:
        return dict(ex.map(one, names))


def _variants(name: str) -> list[tuple[str, tuple | None]]:
    from benchmarks.speed_set import SET
    case = SET[name]
    first = tuple(case.inputs()[0].shape)
    rows = [(name, first if case.dynamic else None)]
    rows += [(f"{name}@{'x'.join(map(str, s[2:]))}", tuple(s)) for s in case.shapes]
    return rows


def _converted(src: Path, dst: Path, shape: tuple | None, input_name: str) -> None:
    from mnntool import api
    if not dst.exists():
        api.convert(src, dst, input_shapes={input_name: shape} if shape else None)


def _convert_variants(name: str, out: Path, warm_threads: int = 0) -> None:
    """Convert the export's variants in the exporting process, so parallel export jobs also do the
    conversions that the timing shards would otherwise do one by one; a failure here is left to `measure`,
    which records it as the model's row. `warm_threads`: also run each file once at that many threads, so
    Numba compiles (and caches) the parallel kernels in the parallel jobs, not in the first timed model
    of every shard."""
    from benchmarks.speed_set import SET
    src = out / f"{name}.onnx"
    for label, shape in _variants(name):
        try:
            _converted(src, out / f"{label}.mnn", shape, SET[name].names[0])
            if warm_threads:      # compiling only: the host's thread figures are measured by the timed runs
                os.environ["MNNTOOL_HOST_TUNING"] = "defaults"
                import numpy as np

                from mnntool.runners import backend_runner
                runner = backend_runner(out / f"{label}.mnn", "numba", warm_threads,
                                        {SET[name].names[0]: shape} if shape else None)
                feeds = {t: np.zeros([d if isinstance(d, int) and d > 0 else 1 for d in runner.graph.tensors[t].shape],
                                     np.float32) for t in runner.graph.inputs}
                runner.run(feeds)
        except Exception:      # noqa: BLE001 - measured again, and reported, by measure()
            pass


def measure(name: str, out: Path, threads: int, budget_s: float, refs: tuple) -> list[dict]:
    from benchmarks.paired_speed import paired
    from benchmarks.speed_set import SET
    src = out / f"{name}.onnx"
    if not src.exists():
        return [{"model": name, "error": "no export"}]
    rows = []
    for label, shape in _variants(name):
        input_name = SET[name].names[0]
        shapes = {input_name: shape} if shape else None
        dst = out / f"{label}.mnn"
        try:
            _converted(src, dst, shape, input_name)
            own = 1 if threads > 1 else None      # mnntool at 1 thread takes turns too: its own scaling
            probe = paired(dst, src, 3, threads, refs=refs, shapes=shapes)
            runs = max(10, min(200, int(budget_s * 1e3 / max(probe["mnntool_ms"], 1e-3))))
            r = paired(dst, src, runs, threads, own_at=own, refs=refs, shapes=shapes)
            if "vs_own" in r:
                r["speedup_from_1_thread"] = 1.0 / r.pop("vs_own")
            rows.append({"model": label, "group": SET[name].group, "runs": runs, **r})
        except Exception as e:      # noqa: BLE001 - a model that fails is a row, with its reason
            rows.append({"model": label, "group": SET[name].group, "error": " ".join(str(e).split())[:200]})
    return rows


def geomeans(rows: list[dict], refs: tuple) -> dict:
    out = {}
    for ref in refs:
        vals = [r[f"vs_{ref}"] for r in rows if f"vs_{ref}" in r]
        if vals:
            out[f"vs_{ref}"] = math.exp(sum(map(math.log, vals)) / len(vals))
            out[f"n_{ref}"] = len(vals)
    return out


def _merge(paths: list[Path], out: Path) -> None:
    parts = [json.loads(p.read_text()) for p in paths]
    rows = [r for p in parts for r in p["rows"]]
    refs = tuple(parts[0]["refs"])
    gm = geomeans(rows, refs)
    result = {**parts[0], "rows": rows, "geomean": gm, "seconds": max(p["seconds"] for p in parts),
              "shards": len(parts)}
    (out / f"wide_speed_t{parts[0]['threads']}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(gm))


def main():
    from benchmarks.speed_set import SET
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="*", default=list(SET))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--budget-s", type=float, default=6.0)
    ap.add_argument("--refs", default="ort,ov,mnn", help="comma list of ort, ov (OpenVINO), mnn")
    ap.add_argument("--out", default=str(ROOT / "build" / "wide"))
    ap.add_argument("--export-only", action="store_true")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--shard", default="0/1", help="I/N: time every N-th model from the I-th (parallel pinned runs)")
    ap.add_argument("--export", help=argparse.SUPPRESS)
    ap.add_argument("--warm-threads", type=int, default=0,
                    help="with --export-only: run each converted file once at this many threads (compiles the "
                         "parallel kernels in the export jobs)")
    ap.add_argument("--merge", nargs="+", help="shard JSON files to merge into one")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.export:
        export_one(args.export, out)
        _convert_variants(args.export, out, args.warm_threads)
        return
    if args.merge:
        return _merge([Path(p) for p in args.merge], out)
    failed = _export_all(args.models if args.shard == "0/1" else [], out, args.jobs, args.warm_threads)
    for name, why in failed.items():
        if why:
            print(f"{name:28s} export failed: {why}", flush=True)
    if args.export_only:
        return
    from mnntool.threadpool import tune_process
    tune_process()
    refs = tuple(r for r in args.refs.split(",") if r)
    try:
        import openvino  # noqa: F401
    except ImportError:
        refs = tuple(r for r in refs if r != "ov")
    i, n = map(int, args.shard.split("/"))
    models = args.models[i::n]
    rows, t0 = [], time.time()
    suffix = "" if args.shard == "0/1" else f"_s{i}of{n}"

    def save():     # after every model: a shard stopped at its time limit keeps what it measured
        result = {"cpu": cpu_name(), "threads": args.threads, "refs": list(refs), "seconds": round(time.time() - t0),
                  "command": "python " + " ".join(sys.argv), "date": time.strftime("%Y-%m-%d"),
                  "rows": rows, "geomean": geomeans(rows, refs)}
        (out / f"wide_speed_t{args.threads}{suffix}.json").write_text(json.dumps(result, indent=1))
    for name in models:
        if failed.get(name):
            rows.append({"model": name, "group": SET[name].group, "error": f"export: {failed[name]}"})
            continue
        for r in measure(name, out, args.threads, args.budget_s, refs):
            rows.append(r)
            if "error" in r:
                print(f"{r['model']:28s} failed: {r['error']}", flush=True)
            else:
                print(f"{r['model']:28s} mnntool {r['mnntool_ms']:9.2f} ms  "
                      + "  ".join(f"{ref} {r[f'{ref}_ms']:9.2f} x{r[f'vs_{ref}']:.2f}" for ref in refs)
                      + (f"  1->{args.threads} threads x{r['speedup_from_1_thread']:.2f}"
                         if "speedup_from_1_thread" in r else ""), flush=True)
        save()
    save()
    gm = geomeans(rows, refs)
    print("geometric mean over the models that ran: " + "  ".join(f"x {k[3:]} {v:.3f}" for k, v in gm.items()
                                                                  if k.startswith("vs_")))


if __name__ == "__main__":
    main()
