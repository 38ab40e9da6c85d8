"""Byte-flipped .mnn files through `info` and `run`, and byte-flipped .onnx files through `convert` and a
run of what it wrote: each must end in a correct run or one clean error (MnnToolError), never a crash,
a hang or another exception.

    python benchmarks/fuzz_mnn.py [--target mnn|onnx] [--cases 10000] [--seed 0] [--json out.json]

Each case runs in a forked child (a segfault kills only the child) with a 4 GB address-space limit
beyond what the parent had mapped: an allocation past it is a MemoryError, which the CLI reports in
one line; the count of those is reported apart, since each may be a bound the runtime lacks
and a time limit. The seed files are small models converted by mnntool whose parameter tables are a
large share of their bytes, so flips reach shapes, axes, strides and groups, not only weights.
"""
from __future__ import annotations

import json
import os
import random
import resource
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# GNU OpenMP aborts a child forked after its pool started; Numba's own work queue survives a fork
os.environ.setdefault("NUMBA_THREADING_LAYER", "workqueue")

OK, CLEAN, OOM, EXCEPTION, CRASH, HANG = "ok", "clean error", "out of memory", "exception", "crash", "hang"
TIME_LIMIT = 30.0
EXTRA_ADDRESS_SPACE = 4 << 30


def seed_models(folder: Path) -> list[Path]:
    """Two small ONNX graphs covering convolution (grouped, depthwise, strided), pooling, reshape, gemm,
    softmax, resize, concat, slice and transpose, converted to .mnn."""
    import numpy as np
    import onnx
    from onnx import TensorProto as TP, helper as h, numpy_helper as nh

    from mnntool.api import convert
    rng = np.random.default_rng(0)

    def w(name, *shape):
        return nh.from_array(rng.standard_normal(shape).astype(np.float32) * 0.2, name)
    a = h.make_graph([
        h.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], group=2),
        h.make_node("Relu", ["c1"], ["r1"]),
        h.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        h.make_node("Conv", ["p1", "w2"], ["c2"], pads=[1, 1, 1, 1], group=4, strides=[2, 2]),
        h.make_node("Reshape", ["c2", "shape"], ["f"]),
        h.make_node("Gemm", ["f", "w3", "b3"], ["g"], transB=1),
        h.make_node("Softmax", ["g"], ["y"], axis=1)], "a",
        [h.make_tensor_value_info("x", TP.FLOAT, [1, 4, 8, 8])], [h.make_tensor_value_info("y", TP.FLOAT, [1, 5])],
        [w("w1", 4, 2, 3, 3), w("w2", 4, 1, 3, 3), nh.from_array(np.array([1, -1], np.int64), "shape"),
         w("w3", 5, 16), w("b3", 5)])
    b = h.make_graph([
        h.make_node("Conv", ["x", "w1"], ["c1"], pads=[0, 0, 0, 0]),
        h.make_node("Resize", ["c1", "", "scales"], ["u"], mode="linear"),
        h.make_node("Concat", ["u", "u"], ["cat"], axis=1),
        h.make_node("Slice", ["cat", "st", "en", "ax"], ["s"]),
        h.make_node("Transpose", ["s"], ["t"], perm=[0, 2, 3, 1]),
        h.make_node("ReduceMean", ["t"], ["y"], axes=[1, 2], keepdims=0)], "b",
        [h.make_tensor_value_info("x", TP.FLOAT, [1, 3, 6, 6])], [h.make_tensor_value_info("y", TP.FLOAT, [1, 4])],
        [w("w1", 3, 3, 1, 1), nh.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
         nh.from_array(np.array([1], np.int64), "st"), nh.from_array(np.array([5], np.int64), "en"),
         nh.from_array(np.array([1], np.int64), "ax")])
    out = []
    for name, g in (("a", a), ("b", b)):
        src, dst = folder / f"{name}.onnx", folder / f"{name}.mnn"
        onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 13)]), src)
        convert(src, dst)
        out.append(dst)
    return out


def mutate(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    kind = rng.random()
    if kind < 0.1:
        return bytes(b[:rng.randrange(len(b))])                      # truncated
    for _ in range(rng.choice((1, 1, 2, 4, 8))):
        i = rng.randrange(len(b))
        r = rng.random()
        b[i] = rng.choice((0x00, 0xFF, 0x7F, 0x80)) if r < 0.3 else (b[i] ^ (1 << rng.randrange(8))) if r < 0.7 \
            else rng.randrange(256)
    return bytes(b)


def _child(path: str) -> None:
    """info, then a run on random inputs, as the CLI does them (an .onnx is converted first)."""
    from mnntool import api
    from mnntool.errors import MnnToolError
    from mnntool.inputs import random_feeds
    from mnntool.runtime.session import Session
    try:
        if path.endswith(".onnx"):
            out = path[:-5] + ".mnn"
            if os.path.exists(out):
                os.unlink(out)
            api.convert(path, out)
            path = out
        api.info(path)
        g = api.load_graph(path)
        Session(g, 1).run(random_feeds(g, None))
        os._exit(0)
    except MnnToolError as e:
        os._exit(3 if "\n" not in str(e) else 5)
    except MemoryError:         # the CLI prints it as one line; counted apart: a bound may be missing
        os._exit(6)
    except BaseException as e:
        tb = traceback.extract_tb(e.__traceback__)[-1]
        sys.stderr.write(f"{type(e).__name__}: {str(e)[:120]} @ {Path(tb.filename).name}:{tb.lineno}\n")
        sys.stderr.flush()
        os._exit(4)


def run_case(path: str, log: str) -> tuple[str, str]:
    pid = os.fork()
    if pid == 0:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 2)
        os.dup2(fd, 1)
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        mapped = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (mapped + EXTRA_ADDRESS_SPACE, hard))
        _child(path)
    deadline = time.monotonic() + TIME_LIMIT
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return HANG, ""
        time.sleep(0.002)
    detail = Path(log).read_text(errors="replace").strip().splitlines()
    detail = detail[-1] if detail else ""
    if os.WIFSIGNALED(status):
        return CRASH, f"signal {os.WTERMSIG(status)} {detail}"
    code = os.WEXITSTATUS(status)
    return {0: (OK, ""), 3: (CLEAN, ""), 6: (OOM, "")}.get(code, (EXCEPTION, detail if code == 4 else f"multi-line error {detail}"))


def fuzz(cases: int, seed: int = 0, progress=None, target: str = "mnn") -> dict:
    from mnntool import api
    from mnntool.inputs import random_feeds
    from mnntool.runtime.session import Session
    rng = random.Random(seed)
    counts, failures = Counter(), []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        seeds = seed_models(tmp)
        for s in seeds:      # compile every kernel in the parent: children inherit it
            g = api.load_graph(s)
            Session(g, 1).run(random_feeds(g, None))
        if target == "onnx":
            seeds = [s.with_suffix(".onnx") for s in seeds]
        blobs = [s.read_bytes() for s in seeds]
        case_path, log = str(tmp / f"case.{target}"), str(tmp / "case.log")
        for k in range(cases):
            Path(case_path).write_bytes(mutate(rng.choice(blobs), rng))
            outcome, detail = run_case(case_path, log)
            counts[outcome] += 1
            if outcome not in (OK, CLEAN, OOM):
                failures.append({"case": k, "outcome": outcome, "detail": detail})
            if progress:
                progress(k + 1, counts)
    return {"target": target, "cases": cases, "seed": seed, "counts": dict(counts), "failures": failures}


def main():
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=str, default=None)
    ap.add_argument("--target", choices=("mnn", "onnx"), default="mnn")
    args = ap.parse_args()
    t0 = time.time()

    def progress(k, counts):
        if k % 500 == 0:
            print(f"{k} cases {dict(counts)} {time.time() - t0:.0f}s", flush=True)
    r = fuzz(args.cases, args.seed, progress, args.target)
    r["seconds"] = time.time() - t0
    kinds = Counter(f["detail"].split(" @ ")[-1] + " " + f["detail"].split(":")[0] for f in r["failures"])
    print(json.dumps(r["counts"]), f"in {r['seconds']:.0f}s")
    for k, n in kinds.most_common(30):
        print(f"{n:5d}  {k}")
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=1))


if __name__ == "__main__":
    main()
