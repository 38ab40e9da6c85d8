"""Calibration and `llm eval` throughput on a Ray cluster of 1, 2 and 4 raylets started on this machine.

    python benchmarks/ray_scaling.py [--raylets 1 2 4] [--cpus-per-raylet 1] [--json OUT]
        [--model efficientnet_b0 | --mnn FILE] [--size 224] [--samples 256] [--method kl]
        [--bundle DIR | --checkpoint DIR | --llm-size 0.5b] [--bits 4] [--text FILE] [--ctx 128] [--tokens 4096]
        [--skip-calib] [--skip-llm] [--out build/ray_scaling]

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
  fixture's 8-bit bundle by default; --llm-size 0.5b: a random Qwen2.5-0.5B-shaped checkpoint at --bits,
  or --bundle / --checkpoint); scored tokens/s including the driver's tokenization, and the perplexity,
  the same at every count.
One process without Ray (and with --workers local processes at the largest count) is measured in the
same run as the baseline. Speed-ups are against 1 raylet.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
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


def bundle_dir(args) -> Path:
    if args.bundle:
        return Path(args.bundle)
    from fixtures.llm_checkpoints import build_random
    from mnntool.llm.bundle import export
    if args.checkpoint:
        src, tag = Path(args.checkpoint), Path(args.checkpoint).name
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


class Calibration:
    def __init__(self, mnn: Path, folder: Path, method: str):
        from mnntool.format import reader
        from mnntool.quant.data import FolderReader
        from mnntool.quant.ptq import targets
        self.g = reader.load(mnn)
        self.nodes = targets(self.g, set())
        self.data = FolderReader(folder, self.g)
        self.method = method

    def run(self, ray=None, workers: int = 1, warm: bool = True) -> dict:
        from mnntool.quant.ptq import calibrate
        if warm:
            calibrate(self.g, self.data.split(min(len(self.data), 8 * max(workers, 1)))[0], self.method, self.nodes,
                      workers=workers, ray=ray)
        t = time.perf_counter()
        grids, means = calibrate(self.g, self.data, self.method, self.nodes, workers=workers, ray=ray)
        dt = time.perf_counter() - t
        n = len(self.data)
        return {"samples": n, "seconds": round(dt, 3), "samples_per_s": round(n / dt, 3), "digest": digest(grids, means)}


class Eval:
    def __init__(self, bundle: Path, text: Path, ctx: int, tokens: int, threads: int):
        self.bundle, self.text, self.ctx, self.tokens, self.threads = bundle, text, ctx, tokens, threads

    def run(self, ray=None, workers: int = 1, warm: bool = True) -> dict:
        from mnntool.llm.evaluate import evaluate
        if warm:
            evaluate(self.bundle, self.text, ctx=self.ctx, max_tokens=self.ctx * 4, threads=self.threads,
                     workers=workers, ray=ray)
        t = time.perf_counter()
        r = evaluate(self.bundle, self.text, ctx=self.ctx, max_tokens=self.tokens, threads=self.threads,
                     workers=workers, ray=ray)
        dt = time.perf_counter() - t
        return {"tokens": r["tokens"], "windows": r["windows"], "seconds": round(dt, 3),
                "tokens_per_s": round(r["tokens"] / dt, 2), "ppl": r["ppl"]}


@contextmanager
def driver_env(cluster: LoopbackCluster):
    """This process as a user's driver of `cluster`: its token file named, no other Ray setting."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(cluster.driver_env())
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


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
    ap.add_argument("--llm-size", choices=["0.5b", "1.5b"], help="a random Qwen2.5-shaped checkpoint of this size")
    ap.add_argument("--bits", type=int, default=8)
    ap.add_argument("--text", help="the text to score (default: 40 stdlib sources)")
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=1, help="MNN-LLM threads per task")
    ap.add_argument("--skip-calib", action="store_true")
    ap.add_argument("--skip-llm", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "build" / "ray_scaling"))
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

    jobs = {}
    if not args.skip_calib:
        mnn = model_file(args)
        from mnntool.format import reader
        cal = Calibration(mnn, calib_folder(args, reader.load(mnn)), args.method)
        jobs["calibration"] = cal
    if not args.skip_llm:
        jobs["llm_eval"] = Eval(bundle_dir(args), text_file(args), args.ctx, args.tokens, args.threads)
    wide = max(args.raylets) * args.cpus_per_raylet
    res: dict = {"host": cpu_name(), "cores": os.cpu_count(), "cpus_per_raylet": args.cpus_per_raylet,
                 "args": {k: v for k, v in vars(args).items() if k != "json"}}
    for name, job in jobs.items():
        rows = [dict(job.run(), setup="one process", raylets=0)]
        if wide > 1:
            rows.append(dict(job.run(workers=wide), setup=f"--workers {wide}", raylets=0))
        for n in args.raylets:
            with LoopbackCluster(raylets=n, cpus=args.cpus_per_raylet) as cluster, driver_env(cluster):
                from mnntool.quant.cluster import connected
                with connected(cluster.address):
                    rows.append(dict(job.run(ray=cluster.address), setup=f"ray {n} raylet{'s' * (n > 1)}", raylets=n))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        key = "samples_per_s" if name == "calibration" else "tokens_per_s"
        one = next((r[key] for r in rows if r["raylets"] == 1), None)
        for r in rows:
            r["speedup_vs_1_raylet"] = round(r[key] / one, 3) if one else None
        same = "digest" if name == "calibration" else "ppl"
        res[name] = {"rows": rows, "identical": len({r[same] for r in rows}) == 1}
    table(res)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n")
    return res


def table(res: dict) -> None:
    print(f"{res['host']}, {res['cores']} cores, {res['cpus_per_raylet']} CPU per raylet")
    for name in ("calibration", "llm_eval"):
        if name not in res:
            continue
        key = "samples_per_s" if name == "calibration" else "tokens_per_s"
        print(f"\n{name} (identical results: {res[name]['identical']})")
        print(f"{'setup':<16} {key:>14} {'seconds':>9} {'x 1 raylet':>11}")
        for r in res[name]["rows"]:
            print(f"{r['setup']:<16} {r[key]:>14.2f} {r['seconds']:>9.2f} {r['speedup_vs_1_raylet'] or 0:>11.2f}")


if __name__ == "__main__":
    main()
