"""`mnntool llm bench`: llama-bench's measurements of a bundle, in mnntool's runtime or in MNN-LLM.

Each (backend, threads) runs in a child process of its own (a clean peak RSS, nothing shared): load,
one warm-up, then `reps` repetitions of
    pp P    a prompt of P tokens from an empty cache (one forward over all of them)
    tg N    N tokens one at a time from an empty cache (llama-bench's tg: no prompt)
    pg P,N  (optional) P prompt tokens then N generated, timed together
The tokens are random ids drawn from a seeded generator (the speed does not depend on which), the
same for both backends. MNN-LLM runs through `MNN.llm`'s forward on the same bundle (low/low as
config.json says, or exact: precision/memory high), logits left unread (a Var per step is made and
dropped). Sanity: the engine's position after each run must equal the tokens fed, and MNN-LLM's last
logits must have the bundle's vocabulary; rates above 1e6 tokens/s are refused as impossible.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

_CHILD = r'''
import json, os, resource, sys, time
import numpy as np
a = json.loads(sys.argv[1])
rng = np.random.default_rng(a["seed"])
vocab_hint = a["vocab"]
P, N, R, PG = a["p"], a["n"], a["reps"], a["pg"]
out = {"pp": [], "tg": [], "pg": [], "checks": [], "pp_cpu": [], "tg_cpu": []}   # *_cpu: the process's CPU seconds
t0 = time.perf_counter()
if a["backend"] == "mnn":
    import MNN.llm as llm
    m = llm.create(a["config"]); m.load()
    out["load_s"] = time.perf_counter() - t0
    out["weight_bytes"] = os.path.getsize(os.path.join(a["bundle"], "llm.mnn.weight"))
    def fresh():
        m.reset()
    def fwd(ids):
        return m.forward(ids)
    def check(v, fed):
        shape = list(np.array(v.read()).shape)
        out["checks"].append({"fed": fed, "logits_shape": shape})
else:
    from mnntool.llm.engine.model import Model
    m = Model.load(a["bundle"], threads=a["threads"], context=max(P + N, PG[0] + PG[1] if PG else 0, 64) + 8,
                   precision="high" if a["exact"] else "normal", **({"kv_int8": True} if a["kv_int8"] else {}))
    out["load_s"] = time.perf_counter() - t0
    out["weight_bytes"] = m.weight_bytes()
    out["kv_bytes_mean"] = m.kv_bytes_per_token(max(N // 2, 0))
    def fresh():
        m.reset()
    def fwd(ids):
        return m.forward(ids)
    def check(v, fed):
        out["checks"].append({"fed": fed, "position": m.pos, "logits_shape": list(np.shape(v))})
def ids(n):
    return [int(x) for x in rng.integers(0, vocab_hint, n)]
# warm-up: kernels loaded, pages touched
t = time.perf_counter()
fresh(); v = fwd(ids(min(P, 64) or 1)); v = fwd(ids(1)); del v   # 64 tokens: the prefill's parallel steps compiled
out["warmup_s"] = time.perf_counter() - t
for r in range(R):
    if P:
        x = ids(P)
        fresh()
        c = time.process_time(); t = time.perf_counter(); v = fwd(x); dt = time.perf_counter() - t
        out["pp"].append(dt); out["pp_cpu"].append(time.process_time() - c)
        if r == R - 1: check(v, P)
        del v
    if N:
        x = ids(N)
        fresh()
        c = time.process_time(); t = time.perf_counter()
        for i in range(N):
            v = fwd([x[i]])
            if i < N - 1: del v
        dt = time.perf_counter() - t
        out["tg"].append(dt); out["tg_cpu"].append(time.process_time() - c)
        if r == R - 1: check(v, N)
        del v
    if PG:
        x, y = ids(PG[0]), ids(PG[1])
        fresh()
        t = time.perf_counter(); v = fwd(x); del v
        for i in range(PG[1]):
            v = fwd([y[i]])
            if i < PG[1] - 1: del v
        out["pg"].append(time.perf_counter() - t)
        del v
if a["profile"] and a["backend"] == "mnntool":
    from mnntool.llm.engine.profile import StepTimes
    out["profile"] = {}
    if P:
        x = ids(P); fresh(); m.prof = StepTimes()
        t = time.perf_counter(); fwd(x); wall = time.perf_counter() - t
        out["profile"]["prefill"] = m.prof.as_dict()
        out["profile"]["prefill"]["wall_ms"] = 1e3 * wall
    if N:
        x = ids(N); fresh(); fwd(x[:1]); m.prof = StepTimes()
        t = time.perf_counter()
        for i in range(1, N):
            v = fwd([x[i]]); tk = time.perf_counter(); int(np.argmax(v)); m.prof.lap("sampling", tk)
        wall = time.perf_counter() - t
        out["profile"]["decode"] = m.prof.as_dict(per=max(N - 1, 1))
        out["profile"]["decode"]["wall_ms"] = 1e3 * wall / max(N - 1, 1)
    m.prof = None
out["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print("\nRESULT " + json.dumps(out))
sys.stdout.flush()
os._exit(0)
'''


def run_child(backend: str, bundle, threads: int, p: int, n: int, reps: int, pg=None, exact: bool = False,
              seed: int = 0, vocab: int | None = None, timeout: float = 1800, wait: str = "auto",
              profile: bool = False, kv_int8: bool = False) -> dict:
    """One (backend, threads) measurement in a child process: times per repetition, load, RSS.
    mnntool only: `wait` the OpenMP workers' policy between regions (auto: kernels.passive_wait, passive,
    spin, spin:N: GOMP_SPINCOUNT N), `profile` adds per-step times of one more prefill and decode (profile.StepTimes),
    `kv_int8` the int8 KV cache."""
    from .files import open_bundle
    from .graph import read_plan
    bundle = os.path.abspath(str(bundle))
    files = open_bundle(bundle)
    plan = read_plan(files.graph, files.llm_config)
    n_params = n_parameters(plan, files.tie is not None)
    if vocab is None:
        vocab = plan.vocab
        tok = files.tokenizer
        if tok is not None and tok.is_file():      # draw ids the tokenizer knows (a padded vocabulary's tail is unused)
            from .tokenizer import Tokenizer
            vocab = min(vocab, Tokenizer(tok).vocab_size)
    with tempfile.TemporaryDirectory() as tmp:
        args = {"backend": backend, "bundle": bundle, "threads": threads, "p": p, "n": n, "reps": reps, "exact": exact,
                "pg": list(pg) if pg else None, "seed": seed, "vocab": int(vocab), "profile": profile,
                "kv_int8": kv_int8}
        if backend == "mnn":
            from ..mnn_llm import runtime_config
            args["config"] = runtime_config(bundle, tmp, threads, exact)
        env = dict(os.environ)
        if backend == "mnntool":
            from .kernels import wait_env
            env.setdefault("NUMBA_NUM_THREADS", str(max(threads, 1)))
            if wait == "passive":
                env.pop("GOMP_SPINCOUNT", None)
                env["OMP_WAIT_POLICY"] = "PASSIVE"
            elif wait == "spin":
                env["OMP_WAIT_POLICY"] = "ACTIVE"
            elif wait.startswith("spin:"):         # spin that many times, then sleep (libgomp's GOMP_SPINCOUNT)
                env.pop("OMP_WAIT_POLICY", None)
                env["GOMP_SPINCOUNT"] = str(int(wait[5:]))
            else:
                wait_env(threads, env)          # as Model does in-process (kernels.wait_policy)
        proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(args)], capture_output=True, text=True,
                              timeout=timeout, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            res = json.loads(line[7:])
            res.update(backend=backend, threads=threads, exact=exact, p=p, n=n, pg=pg, reps=reps, kv_int8=kv_int8,
                       n_params=n_params)
            _sanity(res)
            return res
    tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-4:])
    raise RuntimeError(f"{backend} bench child failed (exit {proc.returncode}): {tail[:600]}")


def n_parameters(plan, tied: bool) -> int:
    """llama-bench's model_n_params, from the plan: every linear layer's weights (biases and norms left
    out) and the embedding table unless it is the head's (tied)."""
    n = plan.head.oc * plan.head.ic
    for lp in plan.layers:
        for op in (lp.q, lp.k, lp.v, lp.o, lp.gate, lp.up, lp.down):
            if op is not None:
                n += op.oc * op.ic
    if not tied:
        n += plan.vocab * plan.hidden
    return int(n)


_BANDWIDTH: dict = {}     # threads -> membw.measure's result, once per process (per `llm bench` run)


def bandwidth(threads: int, mb: int = 512, timeout: float = 300) -> dict:
    """The host's read/copy bandwidth at `threads` (membw.py), in a child process of its own (its buffer
    outside the benchmark's peak RSS), measured once per run."""
    if threads not in _BANDWIDTH:
        from .kernels import wait_env
        env = dict(os.environ)
        env.setdefault("NUMBA_NUM_THREADS", str(max(threads, 1)))
        wait_env(threads, env)
        code = ("import json, sys; from mnntool.llm.engine.membw import measure; "
                f"print('RESULT ' + json.dumps(measure({int(threads)}, {int(mb)})))")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)
        line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if not line:
            raise RuntimeError(f"bandwidth child failed (exit {proc.returncode}): {proc.stderr.strip()[-400:]}")
        _BANDWIDTH[threads] = json.loads(line[-1][7:])
    return _BANDWIDTH[threads]


def decode_bound(res: dict, bw: dict) -> dict:
    """The tg row's distance from the bandwidth limit: bytes read per token (weights, plus the KV cache
    at the mean position of the run) over the measured read bandwidth."""
    per_token = res["weight_bytes"] + res.get("kv_bytes_mean", 0)
    limit = bw["read_GBps"] * 1e9 / per_token
    tps = res["n"] / float(np.mean(res["tg"]))
    return {"bandwidth_read_GBps": bw["read_GBps"], "bandwidth_copy_GBps": bw["copy_GBps"],
            "bytes_per_token": int(per_token), "bandwidth_limit_ts": limit, "bandwidth_fraction": tps / limit,
            "time_over_limit": limit / tps}


def _sanity(res: dict) -> None:
    for c in res["checks"]:
        if "position" in c and c["position"] != c["fed"]:
            raise RuntimeError(f"bench: the engine holds {c['position']} positions after {c['fed']} tokens")
        if not c["logits_shape"] or c["logits_shape"][-1] <= 1:
            raise RuntimeError(f"bench: {res['backend']} returned logits of shape {c['logits_shape']}")
    for key, count in (("pp", res["p"]), ("tg", res["n"])):
        for t in res[key]:
            if t <= 0 or count / t > 1e6:
                raise RuntimeError(f"bench: {res['backend']} {key} rate {count / max(t, 1e-12):.0f} tokens/s is impossible")


def rows(res: dict, bw: dict | None = None) -> list:
    """llama-bench's rows for one child's result: test, tokens, mean and stddev of tokens/s, samples;
    with `bw` (bandwidth()), the tg row's distance from the bandwidth limit (decode_bound)."""
    out = []
    tests = [("pp", res["p"], f"pp{res['p']}"), ("tg", res["n"], f"tg{res['n']}")]
    if res.get("pg"):
        tests.append(("pg", res["pg"][0] + res["pg"][1], f"pp{res['pg'][0]}+tg{res['pg'][1]}"))
    for key, count, name in tests:
        if not res[key] or not count:
            continue
        ts = np.asarray([count / t for t in res[key]])
        out.append({"backend": res["backend"] + (" exact" if res.get("exact") else ""), "threads": res["threads"],
                    "test": name, "n_prompt": res["p"] if key == "pp" else (res["pg"][0] if key == "pg" else 0),
                    "n_gen": res["n"] if key == "tg" else (res["pg"][1] if key == "pg" else 0),
                    "avg_ts": float(ts.mean()), "stddev_ts": float(ts.std(ddof=1)) if ts.size > 1 else 0.0,
                    "samples_ts": [float(x) for x in ts], "samples_ns": [int(t * 1e9) for t in res[key]],
                    "avg_ns": int(np.mean(res[key]) * 1e9), "stddev_ns": int(np.std(res[key], ddof=1) * 1e9) if len(res[key]) > 1 else 0,
                    "load_s": res["load_s"], "warmup_s": res.get("warmup_s"), "peak_rss": res["peak_rss"],
                    "type_k": "int8" if res.get("kv_int8") else ("f32" if res["backend"] == "mnntool" else "f16"),
                    "type_v": "int8" if res.get("kv_int8") else ("f32" if res["backend"] == "mnntool" else "f16"),
                    "model_size": res.get("weight_bytes"), "model_n_params": res.get("n_params"),
                    "n_threads": res["threads"]})
        if key == "tg" and bw is not None and res.get("weight_bytes"):
            out[-1].update(decode_bound(res, bw))
    return out


def host_info() -> dict:
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu_info": cpu, "n_cpus": os.cpu_count(), "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
