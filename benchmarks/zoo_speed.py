"""Speed on architectures the fixtures do not cover: the model zoo's (fixtures/zoo.py) ONNX files from
the default exporter, mnntool against onnxruntime and MNN at 1 thread (or --threads N, all three
runtimes), paired run by run in one process (the method of paired_speed.py), with the geometric mean
of the ratios. At more threads mnntool at 1 thread takes turns as well, for its time against its own.

    python benchmarks/zoo_speed.py [--models efficientnet_b0 ...] [--runs 60] [--threads 1] [--out build/zoo]

Exports are cached in --out (benchmarks/model_zoo.py writes the same files). Inputs are the zoo's example
shapes. Prints a table and writes <out>/zoo_speed[_tN].json.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mnntool.threadpool import tune_process  # noqa: E402

tune_process()      # as the CLI does: the timed runs are in this process
from benchmarks.paired_speed import paired  # noqa: E402


def _files(name: str, out: Path) -> tuple[Path, Path]:
    from fixtures.zoo import ZOO, export, wrapped
    from mnntool import api
    import torch
    src = out / f"{name}.dynamo.onnx"
    if not src.exists():
        torch.manual_seed(0)
        export(ZOO[name], wrapped(ZOO[name].build().eval()), src, "dynamo")
    dst = out / f"{name}.speed.mnn"
    if not dst.exists():
        entry = ZOO[name]
        shape = tuple(entry.inputs()[0].shape)
        g = api.load_graph(src)
        api.convert(src, dst, input_shapes={g.inputs[0]: shape})    # the example shape, as the others run it
    return src, dst


def main():
    from fixtures.zoo import ZOO
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="*", default=[m for m in ZOO if m not in ("wav2vec2",)])
    ap.add_argument("--runs", type=int, default=60)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "build" / "zoo"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.models:
        try:
            src, dst = _files(name, out)
            # at more threads mnntool at 1 thread takes turns too: the same pauses and warm-up runs
            # (against the 1-thread table's back-to-back runs, tiny transformers looked 4-10% slower
            # at 2 threads; measured alike they are 5-10% faster)
            r = paired(dst, src, args.runs, args.threads, own_at=1 if args.threads > 1 else None)
        except Exception as e:      # noqa: BLE001 - a model that fails is a row
            print(f"{name:28s} failed: {' '.join(str(e).split())[:150]}", flush=True)
            continue
        if "vs_own" in r:
            r["vs_1_thread"] = r.pop("vs_own")
        rows.append({"model": name, **r})
        print(f"{name:28s} mnntool {r['mnntool_ms']:8.2f} ms  ort {r['ort_ms']:8.2f}  mnn {r['mnn_ms']:8.2f}  "
              f"x ort {r['vs_ort']:.2f}  x mnn {r['vs_mnn']:.2f}"
              + (f"  x own 1-thread {r['vs_1_thread']:.2f}" if "vs_1_thread" in r else ""), flush=True)
    if rows:
        gm = {k: math.exp(sum(math.log(r[k]) for r in rows) / len(rows)) for k in ("vs_ort", "vs_mnn")}
        print(f"geometric mean over {len(rows)}: x ort {gm['vs_ort']:.2f}  x mnn {gm['vs_mnn']:.2f}")
        name = "zoo_speed.json" if args.threads == 1 else f"zoo_speed_t{args.threads}.json"
        (out / name).write_text(json.dumps({"threads": args.threads, "rows": rows, "geomean": gm}, indent=1))


if __name__ == "__main__":
    main()
