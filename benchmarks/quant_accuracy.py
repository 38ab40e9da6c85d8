"""int8 accuracy, same calibration data, same held-out inputs: mnntool's four methods (files run in the
real MNN runtime), onnxruntime's quantize_static (QDQ, per-channel; MinMax and Percentile) and MNN's own
quantizer (KL). Reports cosine and top-1 agreement of int8 outputs vs fp32; mnntool's files are scored
in the MNN runtime and again in mnntool's own int8 runtime.

    python benchmarks/quant_accuracy.py [--models resnet18 mobilenetv2] [--calib 32] [--held-out 100]

`--zoo` instead scores held-out architectures (timm/torchvision with random weights, the DBNet-style
detector of fixtures/dbnet.py; exported with torch.onnx, dynamo=False) with one method (`--method`,
mse by default): per model the int8 file's size ratio, its cosine vs fp32 in MNN and in mnntool's
runtime, the two runtimes' agreement on the same file, and beside them onnxruntime's quantize_static
(MinMax, QDQ per-channel) and MNN's own quantizer (KL) where they run:

    python benchmarks/quant_accuracy.py --zoo [names...] [--calib 16] [--held-out 8]

`--ocr` scores PP-OCR's detector (1x3x320x320), recognizer (1x3x48x320) and direction classifier
(1x3x48x192) from the rapidocr-onnxruntime wheel on rendered text pages and lines, against onnxruntime:

    python benchmarks/quant_accuracy.py --ocr [--calib 16] [--held-out 4] [--auto-skip 0.99]
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


def preprocess(path, size=(224, 224)):
    """An image as the model's input: resized to size (H, W), (x - mean) * normal, NCHW."""
    from PIL import Image
    x = np.asarray(Image.open(path).convert("RGB").resize(size[::-1]), np.float32)
    return ((x - MEAN) * NORMAL).transpose(2, 0, 1)[None].copy()


def save(path: str | None, kind: str, rows: list[dict]) -> None:
    """The rows with where, when and how they were measured: the file tools/results_tables.py renders
    (`<!-- results: NAME.json -->` in docs/reference/results.md) when kept in docs/results/."""
    if not path:
        return
    import os
    import time

    from benchmarks.wide_speed import cpu_name
    doc = {"kind": kind, "cpu": cpu_name(), "cores": os.cpu_count(), "date": time.strftime("%Y-%m-%d"),
           "command": "python " + " ".join(sys.argv), "rows": rows}
    Path(path).write_text(json.dumps(doc, indent=1))


def score(ref, got):
    cos = [float(a.ravel() @ b.ravel() / (np.linalg.norm(a) * np.linalg.norm(b))) for a, b in zip(ref, got)]
    top1 = [int(np.argmax(a) == np.argmax(b)) for a, b in zip(ref, got)]
    return {"cosine": float(np.mean(cos)), "top1_agreement": float(np.mean(top1))}


ZOO_DEFAULT = ["squeezenet1_1", "mobilenetv3_large_100", "efficientnet_b0", "regnety_008", "ghostnet_100",
               "densenet121", "resnext26ts", "shufflenet_v2_x1_0", "lraspp_mobilenet_v3_large", "dbnet",
               "vit_tiny_patch16_224"]


def _zoo_onnx(name: str, path: Path) -> tuple[str, tuple]:
    """Export one held-out architecture; returns its input name and shape."""
    import torch
    if name == "dbnet":
        from fixtures.dbnet import export
        export(path, size=(224, 224))
        return "images", (1, 3, 224, 224)
    from fixtures.zoo import ZOO, _timm, _tv, _without_torchvision_ops, export as zoo_export, wrapped, Entry, _image
    entry = ZOO.get(name) or Entry(_tv(name) if name in ("squeezenet1_1",) else _timm(name), _image())
    _without_torchvision_ops()
    torch.manual_seed(0)
    model = wrapped(entry.build().eval())
    shape = (1, 3, 224, 224) if name != "lraspp_mobilenet_v3_large" else (1, 3, 256, 256)
    entry = Entry(entry.build, _image(*shape[:1], *shape[2:]), names=entry.names)
    zoo_export(entry, model, path, "legacy")
    return entry.names[0], shape


def zoo_rows(names, calib_n: int, held_n: int, method: str, auto_skip: float | None = None,
             others: bool = True) -> list[dict]:
    import onnxruntime as ort
    from mnntool.compare import metrics
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        calib_imgs = images(tmp / "imgs", calib_n, 1)
        test_imgs = images(tmp / "test", held_n, 2)
        for name in names:
            src = tmp / f"{name}.onnx"
            inp, shape = _zoo_onnx(name, src)
            size = shape[2:]
            calib = tmp / f"calib_{name}"
            calib.mkdir()
            for k, p in enumerate(calib_imgs):
                np.save(calib / f"{k:03d}.npy", preprocess(p, size))
            test_x = [preprocess(p, size) for p in test_imgs]
            fp32, int8 = tmp / f"{name}.mnn", tmp / f"{name}_int8.mnn"
            convert(src, fp32)
            ort_sess = ort.InferenceSession(str(src))
            out_name = ort_sess.get_outputs()[0].name
            ref = [ort_sess.run(None, {inp: x})[0] for x in test_x]
            report = quantize_file(fp32, int8, QuantConfig(int8=True, calib=str(calib), method=method,
                                                           auto_skip=auto_skip))
            theirs = MnnSession(str(int8), [inp], [out_name])
            mnn_out = [theirs.run({inp: x})[out_name].reshape(r.shape) for x, r in zip(test_x, ref)]
            ours_sess = mnntool.load(int8)
            ours = [ours_sess.run({inp: x})[out_name].reshape(r.shape) for x, r in zip(test_x, ref)]
            row = {"model": name, "size_ratio": fp32.stat().st_size / int8.stat().st_size,
                   "float_layers": len(report.get("float_layers", [])),
                   "auto_skipped": len(report.get("auto_skipped") or []),
                   "cos_mnn": score(ref, mnn_out)["cosine"], "cos_mnntool": score(ref, ours)["cosine"],
                   "agree": float(np.mean([metrics(a, b)["cosine"] for a, b in zip(mnn_out, ours)]))}
            if not others:
                row["cos_ort_minmax"] = row["cos_mnn_quantizer"] = float("nan")
            else:
                _others(row, name, tmp, src, calib, calib_n, size, inp, out_name, test_x, ref)
            rows.append(row)
            print(f"{name:26s} size {row['size_ratio']:.2f}x  cos MNN {row['cos_mnn']:.6f}  mnntool "
                  f"{row['cos_mnntool']:.6f}  agree {row['agree']:.6f}  ORT {row['cos_ort_minmax']:.6f}  "
                  f"MNN-quant {row['cos_mnn_quantizer']:.6f}  float {row['float_layers']} "
                  f"(auto-skip {row['auto_skipped']})", flush=True)
    return rows


def _others(row, name, tmp, src, calib, calib_n, size, inp, out_name, test_x, ref):
    """onnxruntime's quantize_static and MNN's own quantizer on the same model and data."""
    import onnxruntime as ort
    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, quantize_static
    from mnntool.mnn_tools import mnnconvert, mnnquant

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{inp: np.load(p)} for p in sorted(calib.glob("*.npy"))])

        def get_next(self):
            return next(self.it, None)
    try:
        q = tmp / f"{name}_ort.onnx"
        quantize_static(str(src), str(q), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                        calibrate_method=CalibrationMethod.MinMax)
        s = ort.InferenceSession(str(q))
        row["cos_ort_minmax"] = score(ref, [s.run(None, {inp: x})[0] for x in test_x])["cosine"]
    except Exception as e:       # noqa: BLE001 -- a tool that fails on a model is reported, not fatal
        row["cos_ort_minmax"] = float("nan")
        print(f"{name}: onnxruntime quantize_static: {type(e).__name__}: {str(e)[:120]}", flush=True)
    cfg = {"format": "RGB", "mean": [MEAN] * 3, "normal": [NORMAL] * 3, "width": size[1], "height": size[0],
           "path": str(tmp / "imgs") + "/", "used_image_num": calib_n,
           "feature_quantize_method": "KL", "weight_quantize_method": "MAX_ABS"}
    (tmp / "cfg.json").write_text(json.dumps(cfg))
    try:
        mf = tmp / f"{name}_mnn_fp32.mnn"
        mnnconvert("-f", "ONNX", "--modelFile", src, "--MNNModel", mf, "--bizCode", "bench")
        mnnquant(mf, tmp / f"{name}_mnnq.mnn", tmp / "cfg.json")
        m = MnnSession(str(tmp / f"{name}_mnnq.mnn"), [inp], [out_name])
        row["cos_mnn_quantizer"] = score(ref, [m.run({inp: x})[out_name].reshape(r.shape)
                                               for x, r in zip(test_x, ref)])["cosine"]
    except MnnToolError as e:
        row["cos_mnn_quantizer"] = float("nan")
        print(f"{name}: MNN's quantizer: {str(e)[:120]}", flush=True)


OCR_WHEEL = "rapidocr-onnxruntime==1.4.4"
# model file in the wheel -> (input shape, text-page size (W, H), font px range, mean, std): PP-OCR's own
# preprocessing (the detector: ImageNet mean/std; the recognizer and classifier: (x/255 - 0.5) / 0.5)
OCR_MODELS = {
    "ch_PP-OCRv4_det_infer.onnx": ((1, 3, 320, 320), (320, 320), (14, 40), (0.485, 0.456, 0.406),
                                   (0.229, 0.224, 0.225)),
    "ch_PP-OCRv4_rec_infer.onnx": ((1, 3, 48, 320), (320, 48), (18, 34), (0.5,) * 3, (0.5,) * 3),
    "ch_ppocr_mobile_v2.0_cls_infer.onnx": ((1, 3, 48, 192), (192, 48), (18, 34), (0.5,) * 3, (0.5,) * 3),
}


def ocr_models(out: Path) -> dict[str, Path]:
    """PP-OCR's detector, recognizer and direction classifier, as the rapidocr-onnxruntime wheel ships
    them (pip download --no-deps from the package index; only its .onnx files are used)."""
    import subprocess
    import zipfile
    out.mkdir(parents=True, exist_ok=True)
    wheels = list(out.glob("rapidocr_onnxruntime-*.whl"))
    if not wheels:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(out), OCR_WHEEL],
                       check=True)
        wheels = list(out.glob("rapidocr_onnxruntime-*.whl"))
    found = {}
    with zipfile.ZipFile(wheels[0]) as z:
        for name in z.namelist():
            base = name.rsplit("/", 1)[-1]
            if base in OCR_MODELS:
                target = out / base
                if not target.exists():
                    target.write_bytes(z.read(name))
                found[base] = target
    return found


def ocr_rows(calib_n: int, held_n: int, method: str, out: Path, auto_skip: float | None = None) -> list[dict]:
    """PP-OCR's three models quantized on rendered text (fixtures/textpages.py: dark words in PIL's
    default font on a light page; whole pages for the detector, single lines for the recognizer and
    classifier), each at its own preprocessing; scored on held-out renders against onnxruntime on the
    source .onnx: cosine in MNN and in mnntool's runtime, and the two runtimes' agreement on the file."""
    import onnxruntime as ort
    from fixtures.textpages import normalised, page
    from mnntool.compare import metrics
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name, src in sorted(ocr_models(out).items()):
            shape, size, px, mean, std = OCR_MODELS[name]
            render = lambda seed: normalised(page(seed, size, px), mean, std)  # noqa: E731
            calib = [{"x": render(k)} for k in range(calib_n)]
            held = [render(1000 + k) for k in range(held_n)]
            fp32, int8 = tmp / f"{name}.mnn", tmp / f"{name}_int8.mnn"
            convert(src, fp32, input_shapes={"x": shape})
            report = quantize_file(fp32, int8, QuantConfig(int8=True, calib=calib, method=method, auto_skip=auto_skip))
            sess = ort.InferenceSession(str(src))
            out_name = sess.get_outputs()[0].name
            ref = [sess.run(None, {"x": x})[0] for x in held]
            theirs = MnnSession(str(int8), ["x"], [out_name])
            mnn_out = [theirs.run({"x": x})[out_name].reshape(r.shape) for x, r in zip(held, ref)]
            ours_sess = mnntool.load(int8)
            ours = [ours_sess.run({"x": x})[out_name].reshape(r.shape) for x, r in zip(held, ref)]
            row = {"model": name, "input": "x".join(map(str, shape)),
                   "size_ratio": fp32.stat().st_size / int8.stat().st_size,
                   "float_layers": len(report.get("float_layers", [])),
                   "auto_skipped": len(report.get("auto_skipped") or []),
                   "cos_mnn": float(np.mean([metrics(r, m)["cosine"] for r, m in zip(ref, mnn_out)])),
                   "cos_mnn_min": float(np.min([metrics(r, m)["cosine"] for r, m in zip(ref, mnn_out)])),
                   "cos_mnntool": float(np.mean([metrics(r, o)["cosine"] for r, o in zip(ref, ours)])),
                   "agree": float(np.mean([metrics(m, o)["cosine"] for m, o in zip(mnn_out, ours)])),
                   "agree_min": float(np.min([metrics(m, o)["cosine"] for m, o in zip(mnn_out, ours)]))}
            rows.append(row)
            print(f"{name:38s} {row['input']:12s} size {row['size_ratio']:.2f}x  cos MNN {row['cos_mnn']:.6f} "
                  f"(min {row['cos_mnn_min']:.6f})  mnntool {row['cos_mnntool']:.6f}  agree {row['agree']:.6f} "
                  f"(min {row['agree_min']:.6f})  float {row['float_layers']} (auto-skip {row['auto_skipped']})",
                  flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ocr", action="store_true",
                    help="PP-OCR's detector, recognizer and classifier (rapidocr-onnxruntime's wheel) on rendered text")
    ap.add_argument("--ocr-dir", default=str(ROOT / "build" / "wheels"), help="--ocr: where the wheel is kept")
    ap.add_argument("--zoo", nargs="*", default=None, help="held-out architectures (default: a set of 10)")
    ap.add_argument("--method", default="mse")
    ap.add_argument("--auto-skip", type=float, default=None,
                    help="--zoo: quantize with --auto-skip X (the fewest layers kept float for held-out cosine >= X)")
    ap.add_argument("--mnntool-only", action="store_true",
                    help="--zoo: skip onnxruntime's and MNN's quantizers (their columns read nan)")
    ap.add_argument("--models", nargs="+", default=["resnet18", "mobilenetv2"])
    ap.add_argument("--calib", type=int, default=32)
    ap.add_argument("--held-out", type=int, default=100)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.ocr:
        rows = ocr_rows(args.calib, args.held_out, args.method, Path(args.ocr_dir), args.auto_skip)
        save(args.json, "quant_accuracy_ocr", rows)
        return
    if args.zoo is not None:
        rows = zoo_rows(args.zoo or ZOO_DEFAULT, args.calib, args.held_out, args.method, args.auto_skip,
                        not args.mnntool_only)
        save(args.json, "quant_accuracy_zoo", rows)
        return
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
    save(args.json, "quant_accuracy", rows)


if __name__ == "__main__":
    main()
