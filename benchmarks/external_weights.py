"""A model past the 2 GB a single .mnn holds: convert it with --external-weights and without the flag
(automatic past 2000 MB), run the pair in MNN and in mnntool, compare both with numpy, and report each
step's time and peak RSS as JSON.

    python benchmarks/external_weights.py [--dim 12288] [--layers 4] [--no-mnn-convert] [--json out.json]

The ONNX model is `layers` MatMul+Relu layers of dim x dim float32 weights (default 2.25 GiB), its
weights written with onnx's external data one layer at a time. Every step runs in a fresh interpreter
and reports its VmHWM (ru_maxrss would carry a parent's peak over exec), or its children's peak where
the work runs in one (MNN's converter). With MNN's converter
(--saveExternalData) too, unless --no-mnn-convert: its .weight file is compared with ours word by word."""
from __future__ import annotations

import argparse
import filecmp
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
HWM = "open('/proc/self/status').read().split('VmHWM:')[1].split()[0]"
CHILD = {
    "convert": "from mnntool import api; r = api.convert(A[0], A[1], external_weights=json.loads(A[2])); "
               "out = {'weight_file': r['weight_file'], 'bytes': r['size_bytes']}",
    "mnn_convert": "from mnntool.mnn_tools import mnnconvert; mnnconvert('-f', 'ONNX', '--modelFile', A[0], "
                   "'--MNNModel', A[1], '--bizCode', 'bench', '--saveExternalData'); out = {}",
    "run_mnn": "from mnntool.runtime.mnn_backend import MnnSession; import numpy as np; x = np.load(A[2]); "
               "t = time.perf_counter(); s = MnnSession(A[0], ['x'], ['y'], threads=1); "
               "load = time.perf_counter() - t; t = time.perf_counter(); y = s.run({'x': x})['y']; "
               "first = time.perf_counter() - t; t = time.perf_counter(); s.run({'x': x}); np.save(A[1], y); "
               "out = {'load_s': round(load, 2), 'first_run_s': round(first, 3), "
               "'second_run_s': round(time.perf_counter() - t, 3)}",
    "run_mnntool": "import mnntool, numpy as np; x = np.load(A[2]); t = time.perf_counter(); "
                   "s = mnntool.load(A[0], threads=1); load = time.perf_counter() - t; t = time.perf_counter(); "
                   "y = s.run({'x': x})['y']; first = time.perf_counter() - t; t = time.perf_counter(); "
                   "s.run({'x': x}); "
                   "np.save(A[1], y); out = {'load_s': round(load, 2), 'first_run_s': round(first, 3), "
                   "'second_run_s': round(time.perf_counter() - t, 3)}",
}


def child(step: str, *args) -> dict:
    """One step in a fresh interpreter: its result, seconds and peak RSS (MB)."""
    code = (f"import json, sys, time; sys.path.insert(0, {str(ROOT)!r}); A = sys.argv[1:]; t0 = time.perf_counter(); "
            f"{CHILD[step]}; out['seconds'] = round(time.perf_counter() - t0, 2); "
            f"import resource; kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss; "
            f"out['peak_rss_mb'] = round(max(int({HWM}), kids) / 1024); print(json.dumps(out))")
    p = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"{step} failed:\n{p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def build(path: Path, dim: int, layers: int) -> Path:
    """The ONNX model, its weights streamed into `<name>.data` layer by layer (never all in memory)."""
    import onnx
    from onnx import TensorProto as TP, helper as h
    data = path.parent / (path.name + ".data")
    rng = np.random.default_rng(0)
    inits, nodes, x, offset = [], [], "x", 0
    with open(data, "wb") as f:
        for k in range(layers):
            w = (rng.standard_normal((dim, dim), np.float32) * np.float32(1.5 / np.sqrt(dim)))
            f.write(w.tobytes())
            t = TP()
            t.name, t.data_type, t.data_location = f"w{k}", TP.FLOAT, TP.EXTERNAL
            t.dims.extend([dim, dim])
            for key, value in (("location", data.name), ("offset", str(offset)), ("length", str(w.nbytes))):
                t.external_data.add(key=key, value=value)
            offset += w.nbytes
            inits.append(t)
            nodes += [h.make_node("MatMul", [x, f"w{k}"], [f"m{k}"]), h.make_node("Relu", [f"m{k}"], [f"r{k}"])]
            x = f"r{k}"
    nodes[-1].output[0] = "y"
    g = h.make_graph(nodes, "big", [h.make_tensor_value_info("x", TP.FLOAT, [1, dim])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [1, dim])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    path.write_bytes(m.SerializeToString())
    return data


def reference(data: Path, x: np.ndarray, dim: int, layers: int) -> np.ndarray:
    w = np.memmap(data, np.float32, "r", shape=(layers, dim, dim))
    y = x.astype(np.float64)
    for k in range(layers):
        y = np.maximum(y @ w[k].astype(np.float64), 0)
    return y


def differ(a: Path, b: Path) -> dict:
    """Two weight files word by word: how many 4-byte words differ, and whether every difference is a
    zero's sign (MNN's converter writes -0.0 as +0.0)."""
    if a.stat().st_size != b.stat().st_size:
        return {"identical": False, "sizes": [a.stat().st_size, b.stat().st_size]}
    x, y = np.memmap(a, np.uint32, "r"), np.memmap(b, np.uint32, "r")
    n = zeros = 0
    for s in range(0, x.size, 1 << 24):
        d = x[s:s + (1 << 24)] != y[s:s + (1 << 24)]
        n += int(d.sum())
        zeros += int((((x[s:s + (1 << 24)] | y[s:s + (1 << 24)]) & 0x7FFFFFFF) == 0)[d].sum())
    return {"identical": n == 0, "differing_words": n, "all_differences_are_signed_zeros": n == zeros}


def compare(ref, got) -> dict:
    ref, got = np.asarray(ref, np.float64).reshape(-1), np.asarray(got, np.float64).reshape(-1)
    cos = float(ref @ got / (np.linalg.norm(ref) * np.linalg.norm(got) + 1e-30))
    return {"cosine": round(cos, 9), "max_abs": float(np.abs(ref - got).max()),
            "max_abs_rel": float(np.abs(ref - got).max() / np.abs(ref).max())}


def cpu() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dim", type=int, default=12288)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--no-mnn-convert", action="store_true")
    ap.add_argument("--dir", default=None, help="Work here (needs ~3x the weights on disk) instead of a temp dir.")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        tmp = Path(tmp)
        t = time.perf_counter()
        data = build(tmp / "big.onnx", args.dim, args.layers)
        report = {"cpu": cpu(), "threads": 1, "weights_bytes": data.stat().st_size,
                  "weights_gib": round(data.stat().st_size / 2**30, 2), "build_s": round(time.perf_counter() - t, 1)}
        print(json.dumps(report), flush=True)
        x = np.random.default_rng(1).standard_normal((1, args.dim)).astype(np.float32)
        np.save(tmp / "x.npy", x)
        flagged = child("convert", tmp / "big.onnx", tmp / "flag.mnn", "true")
        ours = tmp / "flag.mnn.weight"
        report["convert_external_weights"] = dict(flagged, mnn_bytes=(tmp / "flag.mnn").stat().st_size)
        print(json.dumps(report["convert_external_weights"]), flush=True)
        auto = child("convert", tmp / "big.onnx", tmp / "auto.mnn", "null")
        if auto["weight_file"]:
            auto["same_weight_file"] = filecmp.cmp(ours, auto["weight_file"], shallow=False)
            Path(auto["weight_file"]).unlink()
        report["convert_automatic"] = auto
        print(json.dumps(auto), flush=True)
        if not args.no_mnn_convert:
            theirs = child("mnn_convert", tmp / "big.onnx", tmp / "theirs.mnn")
            theirs["weight_file_vs_ours"] = differ(tmp / "theirs.mnn.weight", ours)
            report["mnn_converter_saveExternalData"] = theirs
            print(json.dumps(theirs), flush=True)
            (tmp / "theirs.mnn.weight").unlink()
        report["run_mnn"] = child("run_mnn", tmp / "flag.mnn", tmp / "y_mnn.npy", tmp / "x.npy")
        print(json.dumps(report["run_mnn"]), flush=True)
        report["run_mnntool"] = child("run_mnntool", tmp / "flag.mnn", tmp / "y_ours.npy", tmp / "x.npy")
        print(json.dumps(report["run_mnntool"]), flush=True)
        ref = reference(data, x, args.dim, args.layers)
        y_mnn, y_ours = np.load(tmp / "y_mnn.npy"), np.load(tmp / "y_ours.npy")
        report["outputs"] = {"mnn_vs_numpy": compare(ref, y_mnn), "mnntool_vs_numpy": compare(ref, y_ours),
                             "mnntool_vs_mnn": compare(y_mnn, y_ours)}
    print(json.dumps(report, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
