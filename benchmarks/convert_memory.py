"""Peak resident memory of `mnntool convert` against the model's size, for ONNX files with embedded and
with external weights.

    python benchmarks/convert_memory.py [--mb 100 350] [--json out.json]

Each conversion runs in a fresh interpreter; its peak RSS (VmHWM) is reported in MB, as a ratio to
the model's bytes, and above a tiny model's (the interpreter and imports)."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# VmHWM, not ru_maxrss: ru_maxrss survives fork+exec, so a child would report its parent's peak
PEAK = ("import sys; sys.path.insert(0, sys.argv[3]); from mnntool import api; "
        "api.convert(sys.argv[1], sys.argv[2]); print(open('/proc/self/status').read().split('VmHWM:')[1].split()[0])")


def build(path: Path, mb: int, external: bool) -> int:
    """An MLP of square Gemm layers whose weights come to about `mb` MB."""
    import numpy as np
    import onnx
    from onnx import TensorProto as TP, helper as h, numpy_helper as nh
    n = 2048
    layers = max(1, round(mb * 2**20 / (n * n * 4)))
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for k in range(layers):
        inits += [nh.from_array(rng.standard_normal((n, n), np.float32) * 0.02, f"w{k}"),
                  nh.from_array(np.zeros(n, np.float32), f"b{k}")]
        nodes += [h.make_node("Gemm", [x, f"w{k}", f"b{k}"], [f"g{k}"], transB=1), h.make_node("Relu", [f"g{k}"], [f"r{k}"])]
        x = f"r{k}"
    nodes[-1].output[0] = "y"
    g = h.make_graph(nodes, "mlp", [h.make_tensor_value_info("x", TP.FLOAT, [1, n])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [1, n])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    if external:
        onnx.save(m, path, save_as_external_data=True, location=path.name + ".data")
        return path.stat().st_size + (path.parent / (path.name + ".data")).stat().st_size
    onnx.save(m, path)
    return path.stat().st_size


def peak_mb(src: Path) -> float:
    out = subprocess.run([sys.executable, "-c", PEAK, str(src), str(src.with_suffix(".mnn")), str(ROOT)],
                         capture_output=True, text=True, check=True).stdout
    return int(out.split()[-1]) / 1024


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, nargs="+", default=[100, 350])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        build(tmp / "tiny.onnx", 1, False)
        base = peak_mb(tmp / "tiny.onnx")
        for mb in args.mb:
            for external in (False, True):
                src = tmp / f"m{mb}{'_ext' if external else ''}.onnx"
                size = build(src, mb, external) / 2**20
                peak = peak_mb(src)
                rows.append({"model_mb": round(size, 1), "external": external, "peak_mb": round(peak, 1),
                             "ratio": round(peak / size, 2), "above_tiny_ratio": round((peak - base) / size, 2)})
                print(f"{size:8.1f} MB {'external' if external else 'embedded':9s} peak {peak:8.1f} MB  "
                      f"{peak / size:.2f}x  ({(peak - base) / size:.2f}x above a tiny model's {base:.0f} MB)", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
