"""Calibration and `llm eval` throughput on a Ray cluster of 1, 2 and 4 raylets started on this machine.

    python benchmarks/ray_scaling.py [--raylets 1 2 4] [--cpus-per-raylet 1] [--json OUT]
        [--model efficientnet_b0 | --mnn FILE] [--size 224] [--samples 256] [--method kl]
        [--bundle DIR | --checkpoint DIR | --llm-size small|0.5b] [--bits 4] [--text FILE] [--ctx 128]
        [--tokens 4096] [--skip-calib] [--skip-llm] [--no-workers] [--out build/ray_scaling]

Why: issue 50 asks that calibration on a cluster scale (>= 3x samples/s at 4 raylets over 1 on the
16-core machine). Each raylet count gets a cluster of its own, started as users start one
(fixtures/ray_cluster.py: `ray start --head --node-ip-address 127.0.0.1`, then `ray start --address` per
further raylet, each --num-cpus C, token authentication on) and stopped by process group after. The
driver (this process, Python API only) connects once (quant.cluster.connected), runs each job once to
warm up (workers started, mnntool imported and its kernels loaded in each), then times:
- calibration: quant.ptq.calibrate of the EfficientNet-class model (timm `efficientnet_b0`,
  pretrained=False, exported to ONNX and converted; or --mnn) over --samples .npy samples read by the
  workers from a folder, as `quant --int8 --calib DIR --ray ADDRESS` does; samples/s, and a digest of the
  grids and means, the same at every raylet count and in one process (the merge is exact);
- llm eval: mnntool.llm.evaluate over --tokens tokens of text in --ctx windows (the tiny qwen2
  fixture's 8-bit bundle by default; --llm-size small: a 22M-parameter random Qwen2 whose windows cost
  more than a task's MNN-LLM child start; 0.5b: a random Qwen2.5-0.5B-shaped checkpoint at --bits; or
  --bundle / --checkpoint); scored tokens/s including the driver's tokenization, and the perplexity, the
  same at every count.
One process without Ray (and with --workers local processes at the largest count) is measured in the
same run as the baseline. Speed-ups are against 1 raylet.

Per row, `serial_s` is the driver's time outside the parallel parts (quant.shards.timed: from a job's
first task sent to its last result merged), `spans` those parts; per job, `fit` is seconds = fixed +
parallel / raylets over the cluster rows, whose `fixed` also holds what each worker pays once (its first
run). MNN-LLM runs in a child process of each worker, which sees only the environment: the benchmark
puts the folder it imports MNN from on PYTHONPATH for itself and the `ray start` daemons (a wheel
installed with pip --target, as on the device machine), checks that a child on every raylet imports
MNN.llm before the llm eval rows, and records a failing row's error instead of stopping.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.wide_speed import cpu_name  # noqa: E402
from fixtures.ray_cluster import LoopbackCluster  # noqa: E402


# ------------------------------------------------------------------------------------------ inputs

def model_file(args) -> Path:
    """The .mnn to calibrate: --mnn, or the zoo model exported (legacy ONNX) and converted at --size."""
    if args.mnn:
        return Path(args.mnn)
    out = Path(args.out) / f"{args.model}_{args.size}.mnn"
    if out.exists():
        return out
    from fixtures.zoo import ZOO, export, wrapped
    import mnntool
    import torch
    entry = ZOO[args.model]
    torch.manual_seed(0)
    model = wrapped(entry.build().eval())
    entry = replace(entry, inputs=lambda seed=0: (torch.randn(1, 3, args.size, args.size),), dynamic={})
    onnx = out.with_suffix(".onnx")
    export(entry, model, onnx, "legacy")
    mnntool.convert(onnx, out)
    return out


def calib_folder(args, g) -> Path:
    """--samples .npy files of the model's input shape (seeded normal noise), written once."""
    name = g.inputs[0]
    shape = [d if isinstance(d, int) and d > 0 else 1 for d in g.info(name).shape]
    folder = Path(args.out) / f"calib_{'x'.join(map(str, shape))}_{args.samples}"
    if len(list(folder.glob("*.npy"))) != args.samples:
        folder.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(0)
        for k in range(args.samples):
            np.save(folder / f"{k:04d}.npy", rng.standard_normal(shape).astype(np.float32))
    return folder


# a 22M-parameter Qwen2 (8 layers of 512): 4096 tokens take seconds a task, where the 2-layer fixture's take
# less than the MNN-LLM child's start
SMALL = dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=8, num_attention_heads=8,
             num_key_value_heads=2, max_position_embeddings=1024)


def bundle_dir(args) -> Path:
    if args.bundle:
        return Path(args.bundle)
    from fixtures.llm_checkpoints import build_random
    from mnntool.llm.bundle import export
    if args.checkpoint:
        src, tag = Path(args.checkpoint), Path(args.checkpoint).name
    elif args.llm_size == "small":      # windows that cost more than the MNN-LLM child's start, built in seconds
        src, tag = build_random("qwen2", Path(args.out) / "qwen2-small", **SMALL), "qwen2-small"
    elif args.llm_size:
        src = build_random("qwen2", ROOT / "build" / "llm" / f"qwen2-{args.llm_size}", size=args.llm_size,
                           dtype="bfloat16")
        tag = f"qwen2-{args.llm_size}"
    else:
        src, tag = build_random("qwen2", ROOT / "build" / "llm" / "checkpoints" / "qwen2"), "qwen2-tiny"
    out = Path(args.out) / f"{tag}-b{args.bits}"
    if not (out / "config.json").exists():
        export(src, out, bits=args.bits, block=64, overwrite=True)
    return out


def text_file(args) -> Path:
    if args.text:
        return Path(args.text)
    from fixtures.llm_checkpoints import corpus_files
    out = Path(args.out) / "text.txt"
    if not out.exists():
        out.write_text("\n".join(p.read_text(encoding="utf-8", errors="replace") for p in corpus_files()[:40]))
    return out


# -------------------------------------------------------------------------------------------- jobs

def digest(grids: dict, means: dict) -> str:
    h = hashlib.sha256()
    for k in sorted(grids):
        h.update(repr((k, grids[k])).encode())
    for k in sorted(means):
        h.update(k.encode() + np.asarray(means[k], np.float64).tobytes())
    return h.hexdigest()[:16]


def _timed(fn) -> tuple:
    """fn()'s result, its seconds, and the parallel spans inside (quant.shards.timed): the driver's serial
    share is the time outside them (loading nothing: the model, samples and bundle are ready before)."""
    from mnntool.quant.shards import timed
    with timed() as spans:
        t = time.perf_counter()
        r = fn()
        dt = time.perf_counter() - t
    par = sum(s["end"] - s["start"] for s in spans)
    return r, dt, {"serial_s": round(dt - par, 3) if spans else None,
                   "serial_share": round((dt - par) / dt, 4) if spans else None,
                   "spans": [{"fn": s["fn"], "tasks": s["tasks"], "seconds": round(s["end"] - s["start"], 3),
                              "driver_merge_s": round(s["driver_s"], 3)} for s in spans]}


class Calibration:
    def __init__(self, mnn: Path, folder: Path, method: str):
        from mnntool.format import reader
        from mnntool.quant.data import FolderReader
        from mnntool.quant.ptq import targets
        self.g = reader.load(mnn)
        self.nodes = targets(self.g, set())
        self.data = FolderReader(folder, self.g)
        self.method = method

    def run(self, ray=None, workers: int = 1, warm: bool = True, tasks: int = 1) -> dict:
        from mnntool.quant.ptq import calibrate
        if warm:        # chunks of a few samples each: every worker gets some (mnntool imported, kernels loaded)
            few = min(len(self.data), 8 * max(workers, tasks))
            calibrate(self.g, self.data.split(few)[0], self.method, self.nodes, workers=workers, ray=ray)
        (grids, means), dt, serial = _timed(
            lambda: calibrate(self.g, self.data, self.method, self.nodes, workers=workers, ray=ray))
        n = len(self.data)
        return {"samples": n, "seconds": round(dt, 3), "samples_per_s": round(n / dt, 3), **serial,
                "digest": digest(grids, means)}


class Eval:
    def __init__(self, bundle: Path, text: Path, ctx: int, tokens: int, threads: int, engine: bool = False):
        self.bundle, self.text, self.ctx, self.tokens, self.threads = bundle, text, ctx, tokens, threads
        self.engine = {"kv_int8": False} if engine else None     # scored by mnntool's engine, not MNN-LLM

    def run(self, ray=None, workers: int = 1, warm: bool = True, tasks: int = 1) -> dict:
        from mnntool.llm.evaluate import evaluate
        if warm:
            evaluate(self.bundle, self.text, ctx=self.ctx, max_tokens=self.ctx * 4, threads=self.threads,
                     workers=workers, ray=ray, engine=self.engine)
        r, dt, serial = _timed(lambda: evaluate(self.bundle, self.text, ctx=self.ctx, max_tokens=self.tokens,
                                                threads=self.threads, workers=workers, ray=ray, engine=self.engine))
        return {"tokens": r["tokens"], "windows": r["windows"], "seconds": round(dt, 3),
                "tokens_per_s": round(r["tokens"] / dt, 2), **serial, "ppl": r["ppl"]}


# --------------------------------------------------------------------- what the workers need of MNN

_MNN_CHECK = "import sys, MNN.llm; print(sys.executable, sys.version.split()[0], MNN.__file__)"


def mnn_pythonpath() -> str:
    """PYTHONPATH with the folder this process imports MNN from and the repository first: MNN-LLM runs in a
    child process of each worker (mnntool.llm.evaluate), which sees only its environment, not a sys.path
    set up at run time (the device installs the mnn wheel with pip --target into a folder of its own).
    The `ray start` daemons get it, and their workers and the workers' children inherit it."""
    import importlib.util
    import site
    parts = [str(ROOT)]
    spec = importlib.util.find_spec("MNN")
    own = {str(Path(p).resolve()) for p in site.getsitepackages() + [site.getusersitepackages()]}
    if spec is not None and spec.submodule_search_locations:
        where = Path(list(spec.submodule_search_locations)[0]).parent.resolve()
        if str(where) not in own:       # an interpreter's own site-packages every child has anyway
            parts.insert(0, str(where))
    old = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join(dict.fromkeys(parts + old))


def mnn_child_check() -> str:
    """What a child process of this one reports importing MNN.llm: 'python version MNN-path', or the error."""
    import subprocess
    p = subprocess.run([sys.executable, "-c", _MNN_CHECK], capture_output=True, text=True, timeout=120)
    if p.returncode == 0:
        return p.stdout.strip().splitlines()[-1]       # MNN prints its CPU features first
    return "error: " + " | ".join((p.stdout + p.stderr).strip().splitlines()[-2:])


def _worker_env() -> dict:
    """A worker's PYTHONPATH, interpreter and working directory (why a child of it may not find MNN)."""
    return {"PYTHONPATH": os.environ.get("PYTHONPATH"), "executable": sys.executable, "cwd": os.getcwd()}


def cluster_mnn_check(ray) -> list[str]:
    """mnn_child_check on every node of the cluster (a task pinned to each): the llm eval rows need all."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    check = ray.remote(num_cpus=1)(mnn_child_check)
    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    return ray.get([check.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote()
                    for n in nodes])


@contextmanager
def driver_env(cluster: LoopbackCluster):
    """This process as a user's driver of `cluster`: its token file named, no other Ray setting."""
    saved, env = dict(os.environ), cluster.driver_env()     # (read before the clear: it copies os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def exit_on_term() -> None:
    """SIGTERM (a run cut by `timeout`) as SystemExit: the clusters are stopped on the way out
    (LoopbackCluster's exit) and the rows written so far are kept."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def _row(job, setup: str, raylets: int, **kw) -> dict:
    """job.run(**kw) as a row; a failure is the row's `error` line, and the other rows still run."""
    try:
        r = job.run(**kw)
    except Exception as e:      # noqa: BLE001 - recorded, not raised: one row's failure spoils no other
        r = {"error": f"{type(e).__name__}: {' '.join(str(e).split())[:400]}"}
    return dict(r, setup=setup, raylets=raylets)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--raylets", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--cpus-per-raylet", type=int, default=1)
    ap.add_argument("--model", default="efficientnet_b0", help="a fixtures/zoo.py model (timm, random weights)")
    ap.add_argument("--mnn", help="calibrate this .mnn instead of --model")
    ap.add_argument("--size", type=int, default=224, help="input height and width of --model")
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--method", default="mse", help="calibration method (mse: quant's default)")
    ap.add_argument("--bundle", help="an MNN-LLM bundle for llm eval")
    ap.add_argument("--checkpoint", help="a Hugging Face checkpoint folder, exported at --bits")
    ap.add_argument("--llm-size", choices=["small", "0.5b", "1.5b"],
                    help="a random Qwen2 checkpoint: small (22M parameters) or Qwen2.5-0.5B/1.5B-shaped")
    ap.add_argument("--bits", type=int, default=8)
    ap.add_argument("--text", help="the text to score (default: 40 stdlib sources)")
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=1, help="MNN-LLM threads per task")
    ap.add_argument("--engine", action="store_true",
                    help="llm eval scores windows in mnntool's engine (no MNN-LLM child in the workers)")
    ap.add_argument("--skip-calib", action="store_true")
    ap.add_argument("--skip-llm", action="store_true")
    ap.add_argument("--no-workers", action="store_true", help="leave out the --workers (local processes) row")
    ap.add_argument("--out", default=str(ROOT / "build" / "ray_scaling"))
    ap.add_argument("--json", help="write the results here (after every row: a run cut short keeps its rows)")
    ap.add_argument("--tables", help="also write docs/results-style tables (columns and rows) into this folder: "
                                     "ray_scaling_calibration.json, ray_scaling_llm_eval.json")
    args = ap.parse_args(argv)
    exit_on_term()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ["PYTHONPATH"] = mnn_pythonpath()     # this process's children and the clusters' daemons

    res: dict = {"host": cpu_name(), "cores": os.cpu_count(), "cpus_per_raylet": args.cpus_per_raylet,
                 "args": {k: v for k, v in vars(args).items() if k != "json"}}
    save = lambda: args.json and Path(args.json).write_text(json.dumps(res, indent=2) + "\n")     # noqa: E731
    jobs = {}
    if not args.skip_calib:
        mnn = model_file(args)
        from mnntool.format import reader
        jobs["calibration"] = Calibration(mnn, calib_folder(args, reader.load(mnn)), args.method)
    if not args.skip_llm:
        res["mnn_driver_child"] = mnn_child_check()
        print("MNN in a child of the driver:", res["mnn_driver_child"], file=sys.stderr, flush=True)
        if res["mnn_driver_child"].startswith("error"):
            res["llm_eval"] = {"rows": [], "error": f"MNN not importable in a child of the driver: "
                                                    f"{res['mnn_driver_child']}"}
        else:
            jobs["llm_eval"] = Eval(bundle_dir(args), text_file(args), args.ctx, args.tokens, args.threads,
                                   args.engine)
    wide = max(args.raylets) * args.cpus_per_raylet
    for name in jobs:
        res[name] = {"rows": [], "identical": None}
    # one process and local workers first, then one cluster per raylet count serving both jobs
    for name, job in jobs.items():
        rows = res[name]["rows"]
        rows.append(_row(job, "one process", 0))
        if wide > 1 and not args.no_workers:
            rows.append(_row(job, f"--workers {wide}", 0, workers=wide))
        for r in rows:
            print(name, json.dumps(r), file=sys.stderr, flush=True)
        save()
    for n in args.raylets:
        tasks = n * args.cpus_per_raylet
        setup = f"ray {n} raylet{'s' * (n > 1)}"
        with LoopbackCluster(raylets=n, cpus=args.cpus_per_raylet) as cluster, driver_env(cluster):
            from mnntool.quant.cluster import connected
            with connected(cluster.address) as ray:
                exit_on_term()      # ray.init installed its own handler, which ends the process at once
                for name, job in jobs.items():
                    if name == "llm_eval":
                        checks = cluster_mnn_check(ray)
                        res.setdefault("worker_env", {})[str(n)] = ray.get(ray.remote(num_cpus=1)(_worker_env).remote())
                        res.setdefault("mnn_raylet_children", {})[str(n)] = checks
                        bad = [c for c in checks if c.startswith("error")]
                        if bad:
                            res[name]["rows"].append({"setup": setup, "raylets": n, "error": "MNN not importable "
                                                      f"in a child of a raylet's worker: {bad[0]}"})
                            continue
                    res[name]["rows"].append(_row(job, setup, n, ray=cluster.address, tasks=tasks))
                    print(name, json.dumps(res[name]["rows"][-1]), file=sys.stderr, flush=True)
                    save()
    for name in jobs:
        rows = [r for r in res[name]["rows"] if "error" not in r]
        key = "samples_per_s" if name == "calibration" else "tokens_per_s"
        one = next((r[key] for r in rows if r["raylets"] == 1), None)
        for r in rows:
            r["speedup_vs_1_raylet"] = round(r[key] / one, 3) if one else None
        same = "digest" if name == "calibration" else "ppl"
        res[name]["identical"] = len({r[same] for r in rows}) == 1 if rows else None
        res[name]["fit"] = fit([(r["raylets"], r["seconds"]) for r in rows if r["raylets"] > 0])
    table(res)
    save()
    if args.tables:
        given, kept = list(argv or sys.argv[1:]), []
        while given:            # the command without where this run wrote
            arg = given.pop(0)
            if arg in ("--json", "--tables"):
                given = given[1:]
            else:
                kept.append(arg)
        command = " ".join(["python benchmarks/ray_scaling.py", *kept])
        for name, data in docs_tables(res, command).items():
            (Path(args.tables) / f"ray_scaling_{name}.json").write_text(json.dumps(data, indent=1) + "\n")
    return res


def docs_tables(res: dict, command: str) -> dict:
    """Each job's rows as a docs/results table (tools/results_tables.py's plain kind)."""
    import datetime
    out = {}
    for name, unit, same in (("calibration", "samples", "digest"), ("llm_eval", "tokens", "ppl")):
        rows = [r for r in res.get(name, {}).get("rows", []) if "error" not in r]
        if not rows:
            continue
        key = f"{unit}_per_s"
        out[name] = {"cpu": res["host"], "date": datetime.date.today().isoformat(), "command": command,
                     "columns": ["setup", unit, "seconds", f"{unit}/s", "driver serial s", "vs 1 raylet",
                                 "grid digest" if same == "digest" else "perplexity"],
                     "rows": [[r["setup"], r[unit], r["seconds"], r[key],
                               "-" if r.get("serial_s") is None else r["serial_s"],
                               f"{r['speedup_vs_1_raylet']:.2f}x" if r.get("speedup_vs_1_raylet") else "-",
                               r[same] if same == "digest" else f"{r[same]:.6g}"] for r in rows]}
    return out


def fit(points: list) -> dict | None:
    """seconds = fixed + parallel / raylets, least squares over the cluster rows: `fixed` is every cost that
    more raylets do not divide (the driver's serial share, and per-worker costs such as a first run), and
    fixed + parallel over fixed + parallel / n the speed-up n raylets can give."""
    if len({n for n, _ in points}) < 2:
        return None
    x, y = np.array([1.0 / n for n, _ in points]), np.array([t for _, t in points])
    p, s = np.polyfit(x, y, 1)
    return {"fixed_s": round(float(s), 3), "parallel_s": round(float(p), 3)}


def table(res: dict) -> None:
    print(f"{res['host']}, {res['cores']} cores, {res['cpus_per_raylet']} CPU per raylet")
    for name in ("calibration", "llm_eval"):
        if name not in res:
            continue
        key = "samples_per_s" if name == "calibration" else "tokens_per_s"
        f = res[name].get("fit")
        fitted = f" seconds = {f['fixed_s']:.2f} + {f['parallel_s']:.2f} / raylets;" if f else ""
        if "error" in res[name]:
            print(f"\n{name}: {res[name]['error']}")
            continue
        print(f"\n{name} (identical results: {res[name]['identical']};{fitted} serial: the driver's time outside "
              f"the parallel parts)")
        print(f"{'setup':<16} {key:>14} {'seconds':>9} {'serial s':>9} {'serial %':>9} {'x 1 raylet':>11}")
        for r in res[name]["rows"]:
            if "error" in r:
                print(f"{r['setup']:<16} {r['error'][:100]}")
                continue
            ser = "-" if r.get("serial_s") is None else f"{r['serial_s']:.2f}"
            share = "-" if r.get("serial_share") is None else f"{100 * r['serial_share']:.1f}"
            print(f"{r['setup']:<16} {r[key]:>14.2f} {r['seconds']:>9.2f} {ser:>9} {share:>9} "
                  f"{r.get('speedup_vs_1_raylet') or 0:>11.2f}")


if __name__ == "__main__":
    main()
