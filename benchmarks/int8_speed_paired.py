"""Int8 against fp32 in mnntool's runtime, paired run by run in one process, with a per-step profile.

    python benchmarks/int8_speed_paired.py [--models resnet18 mobilenetv2 efficientnet_b0 regnety_008 resnet50]
        [--threads 1] [--runs 20] [--profile] [--dir build/int8_speed] [--json out.json]

Each model is converted to fp32 and quantized with `quant --int8 --method mse` on 16 seeded normal
samples (files kept in --dir and reused). Both files run in the same process, taking turns run by run,
timed at 1 thread in the calling thread's CPU time (one-thread kernels run there; the machines this runs
on are shared, so wall time counts other processes, and process time counts idle workers' spinning),
at more threads in wall time;
the ratio is the median of the per-pair ratios int8 / fp32 (below 1: int8 faster). --profile adds the
time per op type, int8 against fp32, from the session's per-step profile, which shows where int8
loses. Accuracy: cosine of the int8 output to the fp32 output on one seeded input.

Models: the fixtures (fixtures/models.py), the zoo (fixtures/zoo.py) or any timm name.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SAMPLES = 16


def onnx_of(name: str, out: Path) -> Path:
    """The model's ONNX file: a fixture, a zoo entry or a timm architecture with random weights."""
    from fixtures import models
    if name in models.FIXTURES:
        return models.build(name, ROOT / "build" / "fixtures")
    dst = out / f"{name}.onnx"
    if dst.exists():
        return dst
    from fixtures.zoo import ZOO, Entry, _image, _timm, export, wrapped
    entry = ZOO.get(name) or Entry(_timm(name), _image())
    tmp = out / f"{name}.tmp.onnx"
    export(entry, wrapped(entry.build()), tmp, "legacy")
    tmp.replace(dst)
    return dst


def files_of(name: str, out: Path) -> tuple[Path, Path]:
    """(fp32 .mnn, int8 .mnn) for the model, made when missing."""
    from mnntool.api import convert
    from mnntool.quant import QuantConfig, quantize_file
    fp32, int8 = out / f"{name}.mnn", out / f"{name}_int8.mnn"
    if not fp32.exists():
        convert(onnx_of(name, out), fp32)
    if not int8.exists():
        calib = out / f"calib_{name}"
        calib.mkdir(exist_ok=True)
        shape = _input_shape(fp32)
        for k in range(SAMPLES):
            np.save(calib / f"{k:03d}.npy", np.random.default_rng(k).standard_normal(shape).astype(np.float32))
        quantize_file(fp32, int8, QuantConfig(int8=True, calib=calib, method="mse"))
    return fp32, int8


IMAGE = (1, 3, 224, 224)      # the input shape where the file leaves dimensions open


def _feeds(g) -> dict:
    """One seeded input per graph input, at IMAGE where the file's shape has open dimensions."""
    from mnntool.inputs import random_feeds
    shapes = {n: IMAGE for n in g.inputs
              if g.tensors[n].shape is None or not all(isinstance(d, int) for d in g.tensors[n].shape)}
    return random_feeds(g, shapes or None, seed=0)


def _input_shape(path: Path) -> tuple:
    from mnntool.loading import load_graph
    return next(iter(_feeds(load_graph(path)).values())).shape


def _session(path: Path, threads: int):
    from mnntool.loading import load_graph
    from mnntool.runtime.session import Session
    g = load_graph(path)
    return g, Session(g, threads)


def _by_op(s, feeds, runs: int) -> dict[str, float]:
    total = defaultdict(float)
    for _ in range(runs):
        seconds: list = []
        s.run(feeds, profile=seconds)
        for step, dt in zip(s.plan.ran, seconds):
            total[step.op] += dt / runs * 1e3
    return total


def measure(name: str, out: Path, threads: int, runs: int, profile: bool) -> dict:
    fp32, int8 = files_of(name, out)
    (g, s32), (_, s8) = _session(fp32, threads), _session(int8, threads)
    feeds = _feeds(g)
    y32, y8 = (np.concatenate([v.reshape(-1) for v in s.run(feeds).values()]) for s in (s32, s8))
    cos = float(np.dot(y32, y8) / (np.linalg.norm(y32) * np.linalg.norm(y8) + 1e-30))
    for _ in range(3):
        s32.run(feeds), s8.run(feeds)
    t32, t8, ratios = [], [], []
    clock = time.thread_time if threads == 1 else time.perf_counter
    for k in range(runs):
        order = (s32, s8) if k % 2 == 0 else (s8, s32)
        got = {}
        for s in order:
            t0 = clock()
            s.run(feeds)
            got[id(s)] = clock() - t0
        t32.append(got[id(s32)] * 1e3)
        t8.append(got[id(s8)] * 1e3)
        ratios.append(got[id(s8)] / got[id(s32)])
    row = {"model": name, "threads": threads, "fp32_ms": float(np.median(t32)), "int8_ms": float(np.median(t8)),
           "int8_over_fp32": float(np.median(ratios)), "cosine_int8_fp32": cos}
    if profile:
        p32, p8 = _by_op(s32, feeds, max(3, runs // 4)), _by_op(s8, feeds, max(3, runs // 4))
        row["profile_ms"] = {op: {"fp32": p32.get(op, 0.0), "int8": p8.get(op, 0.0)}
                             for op in sorted(set(p32) | set(p8), key=lambda o: -(p8.get(o, 0) - p32.get(o, 0)))}
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["resnet18", "mobilenetv2", "efficientnet_b0", "regnety_008",
                                                    "resnet50"])
    ap.add_argument("--threads", type=int, nargs="+", default=[1])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--dir", default=str(ROOT / "build" / "int8_speed"))
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    from mnntool.runtime.kernels.micro.int8_gemm import HAS_VNNI
    print(f"integer int8 kernels (AVX-512 VNNI): {'yes' if HAS_VNNI else 'no'}", flush=True)
    rows = []
    for name in args.models:
        for t in args.threads:
            row = measure(name, out, t, args.runs, args.profile)
            rows.append(row)
            print(f"{name:18s} t={t}  fp32 {row['fp32_ms']:8.2f}  int8 {row['int8_ms']:8.2f} ms  "
                  f"int8/fp32 x{row['int8_over_fp32']:.3f}  cosine {row['cosine_int8_fp32']:.5f}", flush=True)
            for op, v in (row.get("profile_ms") or {}).items():
                if max(v.values()) >= 0.05:
                    print(f"    {op:24s} fp32 {v['fp32']:7.2f}  int8 {v['int8']:7.2f} ms", flush=True)
    ratios = [r["int8_over_fp32"] for r in rows]
    print(f"geometric mean int8/fp32: {float(np.exp(np.mean(np.log(ratios)))):.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
