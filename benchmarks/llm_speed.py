"""Decode and prefill speed of mnntool's runtime against MNN-LLM (and onnxruntime-genai), paired run by run.

    python benchmarks/llm_speed.py [BUNDLE] [--threads 1,2] [--rounds 3] [-p 512] [-n 128] [--json OUT]
                                   [--ort-genai [--checkpoint HF_DIR]] [--no-exact]

BUNDLE defaults to build/llmbench/out-mnntool-q4 (a Qwen2.5-0.5B-shaped random checkpoint at 4 bits,
block 64), built when absent (Python API only: the random checkpoint by fixtures.llm_checkpoints,
bfloat16, then mnntool.llm.bundle.export --bits 4 --block 64).
Every round runs, at each thread count, one child process per runtime in turn (mnntool, MNN-LLM as
users run it: precision/memory low, MNN-LLM exact: precision/memory high, and with --ort-genai
onnxruntime-genai on the int4 model its own builder makes from the same checkpoint, block 64, offline:
`python -m onnxruntime_genai.models.builder -i HF_DIR -o OUT -p int4 -e cpu`), each doing a warm-up then
one prefill of P random tokens and N decode steps from an empty cache (engine/bench.py; for
onnxruntime-genai a Generator: append_tokens of the prompt, then one token and N - 1
generate_next_token). Rounds interleave the runtimes so that a busy host slows them alike; the table
gives per-round figures and the median of the per-round ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mnntool.llm.engine.bench import host_info, run_child  # noqa: E402

DEFAULT = ROOT / "build" / "llmbench" / "out-mnntool-q4"
CHECKPOINT = ROOT / "build" / "llmbench" / "qwen2-0.5b-bfloat16"
BACKENDS = [("mnntool", False), ("mnn", False), ("mnn", True)]


def ensure_checkpoint(src: Path) -> Path:
    if not (src / "config.json").is_file():
        if src != CHECKPOINT:
            raise SystemExit(f"{src}: no checkpoint there")
        from fixtures.llm_checkpoints import build_random
        build_random("qwen2", src, size="0.5b", dtype="bfloat16")
    return src


def ensure_bundle(path: Path) -> Path:
    if (path / "llm.mnn").is_file():
        return path
    if path != DEFAULT:
        raise SystemExit(f"{path}: no bundle there")
    from mnntool.llm.bundle import export
    export(ensure_checkpoint(CHECKPOINT), path, bits=4, block=64)
    return path


def ensure_ortgenai(src: Path, out: Path) -> Path:
    """onnxruntime-genai's int4 model of the checkpoint, by its own builder (offline: -i, a local folder)."""
    if (out / "genai_config.json").is_file():
        return out
    code = ("import sys, runpy; sys.modules['torchvision'] = None; "     # torchvision's CUDA wheel breaks transformers' imports
            "sys.argv = ['builder'] + sys.argv[1:]; "
            "runpy.run_module('onnxruntime_genai.models.builder', run_name='__main__')")
    tmp = out.with_name(out.name + ".partial")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-c", code, "-i", str(src), "-o", str(tmp), "-p", "int4", "-e", "cpu",
                           "-c", str(tmp) + ".cache", "--extra_options", "int4_block_size=64"], env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0 or not (tmp / "genai_config.json").is_file():
        raise SystemExit(f"onnxruntime-genai's builder failed on {src}: {proc.stderr.strip()[-800:]}")
    tmp.rename(out)
    return out


_OG_CHILD = r'''
import json, os, resource, sys, time
import numpy as np
a = json.loads(sys.argv[1])
import onnxruntime_genai as og
rng = np.random.default_rng(a["seed"])
P, N = a["p"], a["n"]
t0 = time.perf_counter()
cfg = og.Config(a["model"])
cfg.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": a["threads"],
                                                                   "inter_op_num_threads": 1}}}}))
model = og.Model(cfg)
load_s = time.perf_counter() - t0
vocab = a["vocab"]
def gen(max_len):
    p = og.GeneratorParams(model)
    p.set_search_options(max_length=max_len, min_length=max_len, do_sample=False)
    return og.Generator(model, p)
def ids(n):
    return [int(x) for x in rng.integers(0, vocab, n)]
g = gen(40); g.append_tokens(ids(16)); g.generate_next_token(); del g      # warm-up
x = ids(P); g = gen(P + 8)
t = time.perf_counter(); g.append_tokens(x); pp = time.perf_counter() - t
assert g.get_logits().shape[-1] >= vocab
del g
x = ids(1); g = gen(N + 8)
t = time.perf_counter()
g.append_tokens(x)
for i in range(N - 1):
    g.generate_next_token()
tg = time.perf_counter() - t
count = g.token_count()
assert count == N, (count, N)
print("RESULT " + json.dumps({"pp": [pp], "tg": [tg], "load_s": load_s,
                              "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
sys.stdout.flush()
os._exit(0)
'''


def run_ortgenai(model: Path, threads: int, p: int, n: int, vocab: int, seed: int = 0) -> dict:
    args = {"model": str(model), "threads": threads, "p": p, "n": n, "vocab": vocab, "seed": seed}
    proc = subprocess.run([sys.executable, "-c", _OG_CHILD, json.dumps(args)], capture_output=True, text=True,
                          timeout=1800)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-4:])
    raise RuntimeError(f"onnxruntime-genai child failed (exit {proc.returncode}): {tail[:600]}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle", nargs="?", default=str(DEFAULT))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--no-exact", action="store_true", help="skip MNN-LLM's exact mode (slow)")
    ap.add_argument("--ort-genai", action="store_true", help="also onnxruntime-genai (its int4 builder's model)")
    ap.add_argument("--checkpoint", default=str(CHECKPOINT), help="the HF checkpoint onnxruntime-genai's model is built from")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    bundle = ensure_bundle(Path(a.bundle))
    backends = [b for b in BACKENDS if not (a.no_exact and b[1])]
    og_model = vocab = None
    if a.ort_genai:
        src = ensure_checkpoint(Path(a.checkpoint))
        og_model = ensure_ortgenai(src, ROOT / "build" / "llmbench" / f"ortgenai-{src.name}-int4-b64")
        backends.append(("ort-genai", False))
        from mnntool.llm.engine.tokenizer import Tokenizer
        vocab = Tokenizer(bundle / "tokenizer.mtok").vocab_size      # the ids both runtimes get: the tokenizer's
    counts = [int(t) for t in a.threads.split(",")]
    runs = []
    for rnd in range(a.rounds):
        for t in counts:
            for backend, exact in backends:
                if backend == "ort-genai":
                    r = run_ortgenai(og_model, t, a.p, a.n, vocab, seed=rnd)
                else:
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
