"""int8 accuracy, same calibration data, same held-out inputs: mnntool's four methods (files run in the
real MNN runtime), onnxruntime's quantize_static (QDQ, per-channel; MinMax and Percentile) and MNN's own
quantizer (KL). Reports cosine and top-1 agreement of int8 outputs vs fp32; mnntool's files are scored
in the MNN runtime and again in mnntool's own int8 runtime.

    python benchmarks/quant_accuracy.py [--models resnet18 mobilenetv2] [--calib 32] [--held-out 100]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fixtures.models import build  # noqa: E402
import mnntool  # noqa: E402
from mnntool.api import convert  # noqa: E402
from mnntool.errors import MnnToolError  # noqa: E402
from mnntool.format import reader  # noqa: E402
from mnntool.quant import QuantConfig, quantize_file  # noqa: E402
from mnntool.quant.data import ImagePrep  # noqa: E402
from mnntool.runtime.mnn_backend import MnnSession  # noqa: E402

MEAN, NORMAL = 127.5, 1 / 64.0


def images(folder: Path, count: int, seed: int):
    """Smooth random images (blurred noise plus gradients): closer to photos than white noise."""
    from PIL import Image, ImageFilter
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for k in range(count):
        base = rng.integers(0, 255, (56, 56, 3), dtype=np.uint8)
        img = Image.fromarray(base).resize((224, 224), Image.BICUBIC).filter(ImageFilter.GaussianBlur(2))
        img.save(folder / f"{k:03d}.png")
    return sorted(folder.glob("*.png"))


def preprocess(path):
    from PIL import Image
    x = np.asarray(Image.open(path).convert("RGB").resize((224, 224)), np.float32)
    return ((x - MEAN) * NORMAL).transpose(2, 0, 1)[None].copy()


def score(ref, got):
    cos = [float(a.ravel() @ b.ravel() / (np.linalg.norm(a) * np.linalg.norm(b))) for a, b in zip(ref, got)]
    top1 = [int(np.argmax(a) == np.argmax(b)) for a, b in zip(ref, got)]
    return {"cosine": float(np.mean(cos)), "top1_agreement": float(np.mean(top1))}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["resnet18", "mobilenetv2"])
    ap.add_argument("--calib", type=int, default=32)
    ap.add_argument("--held-out", type=int, default=100)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import onnxruntime as ort
    from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType,
                                          quantize_static)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        calib_imgs = images(tmp / "calib", args.calib, 1)
        test_x = [preprocess(p) for p in images(tmp / "test", args.held_out, 2)]
        for name in args.models:
            src = build(name, ROOT / "build" / "fixtures")
            fp32_mnn = tmp / f"{name}.mnn"
            convert(src, fp32_mnn)
            g = reader.load(fp32_mnn)
            sess = ort.InferenceSession(str(src))
            ref = [sess.run(None, {"input": x})[0] for x in test_x]
            results = {}
            for method in ("mse", "percentile", "minmax", "kl"):
                out = tmp / f"{name}_{method}.mnn"
                quantize_file(fp32_mnn, out, QuantConfig(int8=True, calib=tmp / "calib", method=method,
                                                         prep=ImagePrep(mean=(MEAN,) * 3, normal=(NORMAL,) * 3)))
                m = MnnSession(str(out), g.inputs, g.outputs)
                results[f"mnntool {method}"] = score(ref, [m.run({"input": x})["output"] for x in test_x])
                ours = mnntool.load(out)       # the same file in mnntool's own int8 runtime
                results[f"mnntool {method} (own runtime)"] = score(ref, [ours.run({"input": x})["output"] for x in test_x])

            class Reader(CalibrationDataReader):
                def __init__(self):
                    self.it = iter([{"input": preprocess(p)} for p in calib_imgs])

                def get_next(self):
                    return next(self.it, None)
            for label, cm in (("ORT MinMax", CalibrationMethod.MinMax), ("ORT Percentile", CalibrationMethod.Percentile)):
                out = tmp / f"{name}_ort_{label[4:]}.onnx"
                quantize_static(str(src), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                                activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, calibrate_method=cm)
                s = ort.InferenceSession(str(out))
                results[label] = score(ref, [s.run(None, {"input": x})[0] for x in test_x])
            from mnntool.mnn_tools import mnnconvert, mnnquant
            cfg = {"format": "RGB", "mean": [MEAN] * 3, "normal": [NORMAL] * 3, "width": 224, "height": 224,
                   "path": str(tmp / "calib") + "/", "used_image_num": args.calib,
                   "feature_quantize_method": "KL", "weight_quantize_method": "MAX_ABS"}
            (tmp / "cfg.json").write_text(json.dumps(cfg))
            theirs = tmp / f"{name}_mnn_fp32.mnn"
            try:
                mnnconvert("-f", "ONNX", "--modelFile", src, "--MNNModel", theirs, "--bizCode", "bench")
                mnnquant(theirs, tmp / f"{name}_mnnq.mnn", tmp / "cfg.json")
                m = MnnSession(str(tmp / f"{name}_mnnq.mnn"), ["input"], ["output"])
                results["MNN quantizer KL"] = score(ref, [m.run({"input": x})["output"] for x in test_x])
            except MnnToolError as e:      # MNN's tools crash on some models: report it, keep the rest
                print(f"{name}: {e}", flush=True)
                results["MNN quantizer KL"] = {"cosine": float("nan"), "top1_agreement": float("nan"),
                                               "error": str(e)[:200]}
            for label, r in results.items():
                rows.append({"model": name, "tool": label, **r})
                print(f"{name:12s} {label:32s} cosine {r['cosine']:.6f}  top-1 agreement {r['top1_agreement']:.2f}",
                      flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
