"""MNN-LLM (the `mnn` wheel's `MNN.llm`) as an oracle and a backend, always in a child process.

A child because MNN-LLM crashes its process on some inputs (releasing logits after their Llm, invalid
UTF-8 in a context) and keeps state across calls that must not leak between measurements. The child
prints one JSON line; the parent gets plain lists back.

`run(bundle, ids, steps)`: prefill `ids` with `forward`, then `steps` greedy decode steps, each one
token through `forward` (the engine advances its own KV cache and positions); returns the logits of
every step and the tokens. `exact=True` sets precision/memory high, the mode whose arithmetic is
float32 end to end (the default low/low runs int weights through dynamic-quantized kernels).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

_CHILD = r'''
import json, sys, time
import numpy as np
args = json.loads(sys.argv[1])
import MNN.llm as llm
m = llm.create(args["config"])
m.load()
out = {"steps": [], "tokens": []}
def logits_of(v):
    a = np.array(v.read(), dtype=np.float32).reshape(-1)
    return a
t = time.perf_counter()
v = m.forward(args["ids"])
a = logits_of(v)
del v
out["prefill_s"] = time.perf_counter() - t
for step in range(args["steps"] + 1):
    if args["keep"]:
        out["steps"].append(a.tolist())
    out["tokens"].append(int(a.argmax()))
    if step == args["steps"]:
        break
    v = m.forward([int(a.argmax())])
    a = logits_of(v)
    del v
if args["encode"] is not None:
    out["encoded"] = [list(m.tokenizer_encode(s)) for s in args["encode"]]
print("\nRESULT " + json.dumps(out))
sys.stdout.flush()
import os
os._exit(0)
'''


def runtime_config(bundle, tmp, threads: int = 1, exact: bool = True, **extra) -> str:
    """A config.json in `tmp` that points at the bundle (base_dir) with these settings: MNN-LLM reads
    precision and memory at create(); set_config() after it does not change them."""
    cfg = json.loads(open(os.path.join(str(bundle), "config.json")).read())
    cfg.update(base_dir=os.path.abspath(str(bundle)) + os.sep, thread_num=threads, **extra)
    if exact:
        cfg.update(precision="high", memory="high")
    path = os.path.join(str(tmp), "config.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def run(bundle, ids: list[int], steps: int = 0, exact: bool = True, threads: int = 1, keep_logits: bool = True,
        encode: list[str] | None = None, timeout: float = 600) -> dict:
    """Prefill + greedy steps in MNN-LLM; {'steps': [logits...], 'tokens': [...], 'prefill_s'}."""
    with tempfile.TemporaryDirectory() as tmp:
        args = {"config": runtime_config(bundle, tmp, threads, exact), "ids": [int(i) for i in ids],
                "steps": steps, "keep": keep_logits, "encode": encode}
        p = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(args)], capture_output=True, text=True,
                           timeout=timeout)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    tail = " | ".join((p.stdout + p.stderr).strip().splitlines()[-4:])
    raise RuntimeError(f"MNN-LLM failed on {bundle} (exit {p.returncode}): {tail[:500]}")
