"""A GPT-2-style decoder's single-token step (KV cache of --past tokens) in fp32 and weight-only int8/int4
(HQQ, blocks of 64, the vocabulary head at 8 bits): next-token logits cosine vs eager torch and
tokens/s, paired run by run in one process.

    python benchmarks/decode_speed.py [--dim 512 --layers 6 --vocab 8000 --past 128 --runs 60]

Runtimes: mnntool; MNN with its default memory mode (weight-only weights dequantized at load); MNN
with memory "low" (its LLM setting: weights stay quantized, dynamic-quant kernels); onnxruntime on the
fp32 ONNX file for scale.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mnntool.threadpool import tune_process  # noqa: E402

tune_process()

import numpy as np  # noqa: E402

FORMATS = {"fp32": None, "int8": ["--weight-bits", "8", "--block-size", "64", "--hqq"],
           "int4": ["--weight-bits", "4", "--block-size", "64", "--hqq"]}


def _cos(a, b) -> float:
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def build(d: Path, args):
    import torch
    from fixtures.decoder import export
    from mnntool import api
    from mnntool.quant import QuantConfig, quantize_file
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        m = export(d / "dec.onnx", dynamo=True, vocab=args.vocab, dim=args.dim, heads=args.heads,
                   layers=args.layers)
    api.convert(d / "dec.onnx", d / "fp32.mnn")
    files = {"fp32": d / "fp32.mnn"}
    for name in ("int8", "int4"):
        files[name] = d / f"{name}.mnn"
        quantize_file(files["fp32"], files[name], QuantConfig(weight_bits=int(name[3:]), block_size=64, hqq=True))
    gen = torch.Generator().manual_seed(0)
    hd = args.dim // args.heads
    ids = torch.randint(0, args.vocab, (1, 1), generator=gen)
    pk, pv = (torch.randn(args.layers, 1, args.heads, args.past, hd, generator=gen) for _ in range(2))
    with torch.no_grad():
        ref = m(ids, pk, pv)[0].numpy()
    feeds = {"ids": ids.numpy().astype(np.int32), "past_k": pk.numpy(), "past_v": pv.numpy()}
    return files, feeds, ref


def runners(files: dict, onnx_path: Path, threads: int) -> dict:
    import onnxruntime as ort
    from mnntool import api
    from mnntool.runtime.mnn_backend import MnnSession
    from mnntool.runtime.session import Session
    out = {}
    for fmt, path in files.items():
        g = api.load_graph(path)
        s = Session(g, threads)
        out[(fmt, "mnntool")] = lambda f, s=s: s.run(f)["logits"]
        for mem in ("normal", "low"):
            ms = MnnSession(str(path), g.inputs, g.outputs, threads, memory=mem)
            out[(fmt, f"mnn-{mem}")] = lambda f, ms=ms: ms.run(f)["logits"]
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    o = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
    out[("fp32", "onnxruntime")] = lambda f: o.run(["logits"], {**f, "ids": f["ids"].astype(np.int64)})[0]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--past", type=int, default=128)
    ap.add_argument("--runs", type=int, default=60)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        files, feeds, ref = build(d, args)
        rs = runners(files, d / "dec.onnx", args.threads)
        cos = {k: _cos(r(feeds), ref) for k, r in rs.items()}
        for r in rs.values():
            for _ in range(5):
                r(feeds)
        names = list(rs)
        times = {k: [] for k in names}
        for i in range(args.runs):
            for k in names[i % len(names):] + names[:i % len(names)]:
                t0 = time.perf_counter()
                rs[k](feeds)
                times[k].append((time.perf_counter() - t0) * 1e3)
        sizes = {f: p.stat().st_size / 2**20 for f, p in files.items()}
    base = statistics.median(times[("fp32", "mnntool")])
    print(f"decoder dim {args.dim}, {args.layers} layers, vocab {args.vocab}, past {args.past}, "
          f"{args.threads} thread(s), {args.runs} paired runs")
    print(f"{'format':6} {'runtime':12} {'MB':>6} {'cos vs torch':>12} {'ms/token':>9} {'tokens/s':>9} {'x fp32':>7}")
    for (fmt, rt) in names:
        ms = statistics.median(times[(fmt, rt)])
        fp32 = statistics.median(times[("fp32", rt)])
        print(f"{fmt:6} {rt:12} {sizes[fmt]:6.1f} {cos[(fmt, rt)]:12.6f} {ms:9.3f} {1e3 / ms:9.1f} {fp32 / ms:7.2f}")
    print(f"(mnntool fp32: {base:.3f} ms/token)")


if __name__ == "__main__":
    main()
