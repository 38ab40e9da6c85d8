"""The int8 KV cache against the float32 one in mnntool's engine: quality on a trained model, decode speed
at a long context.

    python benchmarks/llm_kv_int8.py [--checkpoint build/llm/trained-test] [--bits 16] [--tokens 4096]
                                     [--speed-bundle build/llmbench/out-mnntool-q4 --context 2048 -n 64]
                                     [--threads 1] [--rounds 3] [--json OUT]

Quality: the checkpoint (built by fixtures.llm_checkpoints' trained recipe when absent) exported with
mnntool at --bits, its held-out text scored in windows of --ctx tokens (stride ctx/2, the second half of
each window scored) with both caches: perplexity, mean KL(float32 cache || int8 cache) per token and the
same-top-1 rate. Speed (with --speed-bundle): a prompt of --context random tokens, then n decode steps,
both caches loaded in this one process and run in turn for --rounds rounds (paired; medians).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _logsoftmax(x):
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def quality(checkpoint: Path, bits: int, tokens: int, ctx: int, threads: int) -> dict:
    from fixtures.llm_checkpoints import build_trained
    from mnntool.llm import load
    from mnntool.llm.bundle import export
    if not (checkpoint / "config.json").is_file():
        build_trained(checkpoint, checkpoint.name.replace("trained-", "") or "test")
    out = ROOT / "build" / "llm" / f"kvint8-{checkpoint.name}-q{bits}"
    if not (out / "llm.mnn").is_file():
        export(checkpoint, out, bits=bits, block=32 if bits != 16 else 0, overwrite=True)
    text = (checkpoint / "heldout.txt").read_text()
    a, b = load(out, threads=threads, context=ctx), load(out, threads=threads, context=ctx, kv_int8=True)
    ids = a.encode(text)[:tokens]
    stride = ctx // 2
    nll = {"f32": [], "int8": []}
    kl, same = [], []
    for s in range(0, max(len(ids) - ctx, 0) + 1, stride):
        w = ids[s:s + ctx]
        if len(w) < 2:
            break
        first = 0 if s == 0 else ctx - stride
        la = _logsoftmax(a.forward(w, all_logits=True))[first:-1]
        lb = _logsoftmax(b.forward(w, all_logits=True))[first:-1]
        tgt = np.asarray(w[first + 1:])
        nll["f32"].extend(-la[np.arange(len(tgt)), tgt])
        nll["int8"].extend(-lb[np.arange(len(tgt)), tgt])
        kl.extend((np.exp(la) * (la - lb)).sum(-1))
        same.extend(la.argmax(-1) == lb.argmax(-1))
    ppl = {k: float(np.exp(np.mean(v))) for k, v in nll.items()}
    return {"bundle": str(out), "bits": bits, "tokens_scored": len(kl), "ctx": ctx, "ppl_f32": ppl["f32"],
            "ppl_int8": ppl["int8"], "ppl_delta": ppl["int8"] / ppl["f32"] - 1, "kl_mean": float(np.mean(kl)),
            "kl_p99": float(np.percentile(kl, 99)), "same_top1": float(np.mean(same)),
            "kv_bytes_f32": a.model.kv_bytes(), "kv_bytes_int8": b.model.kv_bytes()}


def speed(bundle: Path, context: int, n: int, threads: int, rounds: int) -> dict:
    from mnntool.llm.engine.model import Model
    models = {"f32": Model.load(bundle, threads=threads, context=context + n + 8),
              "int8": Model.load(bundle, threads=threads, context=context + n + 8, kv_int8=True)}
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 1000, context)
    steps = rng.integers(0, 1000, n)
    for m in models.values():             # warm-up: kernels compiled, pages touched
        m.reset()
        m.forward(prompt[:64])
        m.forward([1])
    runs = {k: [] for k in models}
    for _ in range(rounds):
        for name, m in models.items():
            m.reset()
            m.forward(prompt)
            t = time.perf_counter()
            for x in steps:
                m.forward([int(x)])
            runs[name].append(n / (time.perf_counter() - t))
    return {"bundle": str(bundle), "context": context, "n": n, "threads": threads, "rounds": rounds,
            "decode_tps": {k: float(np.median(v)) for k, v in runs.items()},
            "ratio_int8_over_f32": float(np.median([b / a for a, b in zip(runs["f32"], runs["int8"])])),
            "samples": runs}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default=str(ROOT / "build" / "llm" / "trained-test"))
    ap.add_argument("--bits", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--speed-bundle", default=None)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    res = {"quality": quality(Path(a.checkpoint), a.bits, a.tokens, a.ctx, a.threads)}
    q = res["quality"]
    print(f"quality ({q['tokens_scored']} tokens, windows of {q['ctx']}): perplexity {q['ppl_f32']:.4f} (float32 cache) "
          f"-> {q['ppl_int8']:.4f} (int8, {100 * q['ppl_delta']:+.3f}%), KL mean {q['kl_mean']:.2e} p99 {q['kl_p99']:.2e}, "
          f"same top-1 {100 * q['same_top1']:.2f}%; cache {q['kv_bytes_f32'] / 2**20:.1f} -> {q['kv_bytes_int8'] / 2**20:.1f} MB",
          flush=True)
    if a.speed_bundle:
        res["speed"] = s = speed(Path(a.speed_bundle), a.context, a.n, a.threads, a.rounds)
        print(f"decode after {a.context} tokens, {a.threads} thread(s): float32 cache {s['decode_tps']['f32']:.2f} tok/s, "
              f"int8 {s['decode_tps']['int8']:.2f} tok/s ({s['ratio_int8_over_f32']:.3f}x, median of {a.rounds} paired rounds)")
    from mnntool.llm.engine.bench import host_info
    res["host"] = host_info()
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
