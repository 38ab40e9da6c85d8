"""Int8 vs fp32 speed: mnntool's int8 files in mnntool's runtime and in MNN's, next to the fp32 files.

    python benchmarks/int8_speed.py [--threads 1 2] [--runs 30] [--models resnet18 mobilenetv2]

The int8 file is made by `mnntool quant --int8 --method minmax` from 4 random calibration samples
(speed does not depend on the calibration). Ratios below 1.0 mean int8 is faster than fp32.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fixtures.models import build  # noqa: E402
from mnntool.api import convert  # noqa: E402
from benchmarks.isolated import bench, save_rows, speed_args  # noqa: E402
from mnntool.quant import QuantConfig, quantize_file  # noqa: E402
from mnntool.runtime.kernels.micro.int8_gemm import HAS_VNNI  # noqa: E402


def main():
    args = speed_args(["resnet18", "mobilenetv2"])
    print(f"integer int8 kernels (AVX-512 VNNI): {'yes' if HAS_VNNI else 'no, float kernels on the int8 grid'}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name in args.models:
            fp32, int8 = tmp / f"{name}.mnn", tmp / f"{name}_int8.mnn"
            convert(build(name, ROOT / "build" / "fixtures"), fp32)
            calib = tmp / f"calib_{name}"
            calib.mkdir()
            for k in range(4):
                np.save(calib / f"{k}.npy", np.random.default_rng(k).standard_normal((1, 3, 224, 224)).astype(np.float32))
            quantize_file(fp32, int8, QuantConfig(int8=True, calib=calib, method="minmax"))
            for t in args.threads:
                ms = {f"{who}_{kind}": bench(path, who, t, 5, args.runs)["median_ms"]
                      for kind, path in (("fp32", fp32), ("int8", int8)) for who in ("numba", "mnn")}
                row = {"model": name, "threads": t, **ms,
                       "mnntool_int8_vs_fp32": ms["numba_int8"] / ms["numba_fp32"],
                       "mnntool_int8_vs_mnn_int8": ms["numba_int8"] / ms["mnn_int8"]}
                rows.append(row)
                print(f"{name:12s} t={t}  mnntool fp32 {ms['numba_fp32']:7.2f}  int8 {ms['numba_int8']:7.2f} ms "
                      f"(x{row['mnntool_int8_vs_fp32']:.2f})   MNN fp32 {ms['mnn_fp32']:7.2f}  int8 {ms['mnn_int8']:7.2f} ms"
                      f"   mnntool int8 / MNN int8 {row['mnntool_int8_vs_mnn_int8']:.2f}", flush=True)
    save_rows(args.json, rows)


if __name__ == "__main__":
    main()
