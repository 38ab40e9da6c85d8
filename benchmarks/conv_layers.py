"""One convolution at a time, mnntool against onnxruntime at 1 thread: where a CNN's ratio comes from.

    python benchmarks/conv_layers.py [--layers 64,256,56,1,1 ...] [--runs 15] [--json out.json]

Each layer is an ONNX model Conv (+ bias) -> ReLU -> GlobalAveragePool (the pool keeps the output copy
out of the timing; both runtimes pay for it alike), converted by mnntool. The two runtimes take turns,
each timed on the calling thread's CPU time (time.thread_time: both run a 1-thread session in the calling
thread), so a shared machine's other tenants do not move the ratio. A layer is `cin,cout,hw,k,stride[,group]`
with k a number or `KHxKW` (Inception's 1x7 and 7x1: "192,192,17,1x7,1"), "same" padding k // 2 per axis; the default set is ResNet-50's layers, the stems and strided 3x3 layers of the
mobile networks, and the 7x7 and 14x14 maps of their last stages. Prints mnntool's strategy per layer
(conv_strategies.pick), GFLOP/s of both, and the ratio; --json writes the rows with the CPU's name.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mnntool.threadpool import tune_process  # noqa: E402

tune_process()

LAYERS = [
    # ResNet-50: 1x1 at every stage, the strided 3x3s, the stride-1 3x3s (Winograd), the stem
    "64,256,56,1,1", "256,64,56,1,1", "256,128,56,1,1", "128,512,28,1,1", "512,128,28,1,1", "1024,256,14,1,1",
    "256,1024,14,1,1", "2048,512,7,1,1", "512,2048,7,1,1", "256,512,56,1,2", "128,128,56,3,2", "256,256,28,3,2",
    "512,512,14,3,2", "64,64,56,3,1", "128,128,28,3,1", "256,256,14,3,1", "512,512,7,3,1", "3,64,224,7,2",
    # mobile networks: 3x3/2 stems and downsampling, pointwise on 14x14 and 7x7, depthwise
    "3,16,224,3,2", "3,32,224,3,2", "32,32,112,3,2", "32,96,56,3,2", "96,576,14,1,1", "576,96,14,1,1",
    "160,960,7,1,1", "960,160,7,1,1", "144,144,56,3,1,144", "240,240,28,5,1,240", "672,672,14,5,2,672",
    # Inception-v3: 1x1 and the 1x7 / 7x1 pairs on 17x17 maps, 5x5 on 35x35
    "768,192,17,1,1", "192,192,17,1x7,1", "192,192,17,7x1,1", "160,160,17,1x7,1", "48,64,35,5,1",
]


def _model(spec: str, d: Path) -> tuple[Path, Path, tuple]:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from mnntool import api
    a = spec.split(",")
    cin, cout, hw, s = int(a[0]), int(a[1]), int(a[2]), int(a[4])
    kh, kw = (int(v) for v in a[3].split("x")) if "x" in a[3] else (int(a[3]),) * 2
    g = int(a[5]) if len(a) > 5 else 1
    src, dst = d / f"{spec.replace(',', '_')}.onnx", d / f"{spec.replace(',', '_')}.mnn"
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((cout, cin // g, kh, kw)) * 0.05).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[kh, kw], strides=[s, s],
                              pads=[kh // 2, kw // 2] * 2, group=g),
             helper.make_node("Relu", ["c"], ["r"]), helper.make_node("GlobalAveragePool", ["r"], ["y"])]
    graph = helper.make_graph(nodes, "layer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, hw, hw])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cout, 1, 1])],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(src))
    api.convert(src, dst)
    oh, ow = (hw + 2 * (kh // 2) - kh) // s + 1, (hw + 2 * (kw // 2) - kw) // s + 1
    return src, dst, (cin, cout, hw, kh, kw, s, g, oh, ow)


def _strategy(cin, cout, hw, kh, kw, s, g, oh, ow) -> str:
    from mnntool.runtime.kernels.ops.conv_strategies import Geometry, pick
    t, l = kh // 2, kw // 2
    return pick(Geometry(1, cin, hw, hw, cout, oh, ow, kh, kw, s, s, 1, 1, t, l, t, l, g)).name


def measure(spec: str, d: Path, runs: int) -> dict:
    import numpy as np
    from mnntool.runners import backend_runner
    src, dst, (cin, cout, hw, kh, kw, s, g, oh, ow) = _model(spec, d)
    feeds = {"x": np.random.default_rng(1).standard_normal((1, cin, hw, hw)).astype(np.float32)}
    r = {"mnntool": backend_runner(dst, "numba", 1, None), "ort": backend_runner(src, "onnxruntime", 1, None)}
    for x in r.values():
        x.run(feeds)
    flops = 2 * cout * oh * ow * (cin // g) * kh * kw
    reps = max(1, int(2e7 / flops))         # ~20 MFLOP a turn: tiny layers are timed over several runs
    times = {n: [] for n in r}
    for i in range(runs):
        for n in (("mnntool", "ort") if i % 2 else ("ort", "mnntool")):
            c0 = time.thread_time()
            for _ in range(reps):
                r[n].run(feeds)
            times[n].append((time.thread_time() - c0) / reps * 1e3)
    ms = {n: statistics.median(v) for n, v in times.items()}
    return {"layer": spec, "strategy": _strategy(cin, cout, hw, kh, kw, s, g, oh, ow), "mflop": flops / 1e6,
            "mnntool_ms": ms["mnntool"], "ort_ms": ms["ort"], "vs_ort": ms["mnntool"] / ms["ort"],
            "mnntool_gflops": flops / ms["mnntool"] / 1e6, "ort_gflops": flops / ms["ort"] / 1e6}


def main():
    from benchmarks.wide_speed import cpu_name
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", nargs="+", default=LAYERS, help="cin,cout,hw,k,stride[,group] each")
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for spec in args.layers:
            row = measure(spec, Path(tmp), args.runs)
            rows.append(row)
            print(f"{spec:22s} {row['strategy']:18s} mnntool {row['mnntool_ms']:7.3f} ms {row['mnntool_gflops']:6.1f} "
                  f"GF/s  ort {row['ort_ms']:7.3f} ms {row['ort_gflops']:6.1f} GF/s  x{row['vs_ort']:.3f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu_name(), "threads": 1, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
