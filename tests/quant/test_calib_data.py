"""Calibration data as MNN's quantizer reads it. Images: resized corner to corner, bilinear, without
antialiasing, then channel order and (x - mean) * normal -- the reference is MNN's own ImageProcess (the
`mnn` package's CVImageProcess, what its quantizer's dataset calls), exact to float32 rounding (atol 1e-4
on values up to ~255 * normal). Resizing that changes the aspect ratio is reported. Multi-input models
take a folder per sample."""
import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h

from mnntool import api
from tests.conftest import save_onnx
from mnntool.ir.graph import Graph, TensorInfo
from mnntool.quant.data import RAW_PIXELS_NOTE, FolderReader, ImagePrep

MNN = pytest.importorskip("MNN")
Image = pytest.importorskip("PIL.Image")

FORMATS = {"RGB": "CV_ImageFormat_RGB", "BGR": "CV_ImageFormat_BGR", "GRAY": "CV_ImageFormat_GRAY"}


def _mnn_preprocess(img: np.ndarray, w: int, h: int, fmt: str, mean, normal) -> np.ndarray:
    """What MNN's quantizer's dataset does: the image as RGBA (stbi_load with 4 channels), corner-to-corner
    matrix, bilinear."""
    H, W = img.shape[:2]
    c = 1 if fmt == "GRAY" else 3
    rgba = np.concatenate([img, np.full((H, W, 1), 255, np.uint8)], 2).reshape(-1)
    src = np.zeros(max(rgba.size, h * w * c), np.uint8)     # pymnn wants the buffer no smaller than the tensor
    src[:rgba.size] = rgba
    proc = MNN.CVImageProcess({"sourceFormat": MNN.CV_ImageFormat_RGBA, "destFormat": getattr(MNN, FORMATS[fmt]),
                               "mean": tuple(mean) + (0.0,) * (4 - len(mean)),
                               "normal": tuple(normal) + (1.0,) * (4 - len(normal)),
                               "filterType": MNN.CV_Filter_BILINEAL})
    m = MNN.CVMatrix()      # MNN's dataset maps the corners onto each other
    m.setScale((W - 1) / (w - 1), (H - 1) / (h - 1))
    proc.setMatrix(m)
    t = MNN.Tensor((1, h, w, c), MNN.Halide_Type_Float, np.zeros((1, h, w, c), np.float32),
                   MNN.Tensor_DimensionType_Tensorflow)
    proc.convert(src, W, H, W * 4, t)
    return np.array(t.getData(), np.float32).reshape(h, w, c).transpose(2, 0, 1)[None]


def _image_graph(c, h, w):
    g = Graph(nodes=[], inputs=["x"], outputs=["x"])
    g.tensors["x"] = TensorInfo("x", "float32", (1, c, h, w))
    return g


@pytest.mark.parametrize("src,dst", [((97, 131), (24, 32)), ((20, 30), (47, 41)), ((64, 64), (64, 64)),
                                     ((480, 640), (224, 224))])
@pytest.mark.parametrize("fmt", ["RGB", "BGR", "GRAY"])
def test_images_are_read_as_mnns_quantizer_reads_them(tmp_path, src, dst, fmt):
    rng = np.random.RandomState(sum(src) + sum(dst))
    img = rng.randint(0, 256, src + (3,)).astype(np.uint8)
    folder = tmp_path / "calib"
    folder.mkdir()
    Image.fromarray(img).save(folder / "a.png")
    mean, normal = (123.7, 116.3, 103.5)[:1 if fmt == "GRAY" else 3], (0.017, 0.0175, 0.0174)[:1 if fmt == "GRAY" else 3]
    h, w = dst
    prep = ImagePrep(mean=mean, normal=normal, fmt=fmt)
    got = next(iter(FolderReader(folder, _image_graph(len(mean), h, w), prep)))["x"]
    ref = _mnn_preprocess(img, w, h, fmt, mean, normal)
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-4)


def test_aspect_ratio_change_is_reported(tmp_path):
    folder = tmp_path / "calib"
    folder.mkdir()
    for k, size in enumerate([(40, 40), (60, 40), (32, 32)]):     # (width, height)
        Image.fromarray(np.zeros(size[::-1] + (3,), np.uint8)).save(folder / f"{k}.png")
    r = FolderReader(folder, _image_graph(3, 16, 16))
    assert r.notes[-1] == RAW_PIXELS_NOTE       # no --mean/--std: said so
    r.notes.pop()
    assert len(r.notes) == 1 and "1 of 3 calibration images change aspect ratio" in r.notes[0] and "1.png" in r.notes[0]
    assert "2 of 3" in FolderReader(folder, _image_graph(3, 16, 16), ImagePrep(size=(24, 16))).notes[0]  # 60x40 fits
    (folder / "1.png").unlink()
    assert FolderReader(folder, _image_graph(3, 16, 16)).notes == [RAW_PIXELS_NOTE]


def _two_inputs(path):
    rng = np.random.RandomState(0)
    w = onnx.numpy_helper.from_array(rng.randn(8, 3, 3, 3).astype(np.float32), "w")
    w2 = onnx.numpy_helper.from_array(rng.randn(8, 8, 1, 1).astype(np.float32), "w2")
    nodes = [h.make_node("Conv", ["image", "w"], ["c0"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["c0"], ["r"]),
             h.make_node("Conv", ["r", "w2"], ["c"]),     # the mean's conv stays float; this one is int8
             h.make_node("ReduceMean", ["c"], ["m"], axes=[2, 3], keepdims=0),
             h.make_node("Add", ["m", "extra:0"], ["y"])]
    g = h.make_graph(nodes, "two", [h.make_tensor_value_info("image", TP.FLOAT, [1, 3, 16, 16]),
                                    h.make_tensor_value_info("extra:0", TP.FLOAT, [1, 8])],
                     [h.make_tensor_value_info("y", TP.FLOAT, None)], [w, w2])
    save_onnx(g, path)


def test_a_folder_per_sample_feeds_a_multi_input_model(tmp_path):
    _two_inputs(tmp_path / "m.onnx")
    api.convert(tmp_path / "m.onnx", tmp_path / "m.mnn")
    calib = tmp_path / "calib"
    rng = np.random.RandomState(1)
    for k in range(5):
        d = calib / f"s{k}"
        d.mkdir(parents=True)
        if k % 2:       # an image for the image input, and a .npy
            Image.fromarray(rng.randint(0, 256, (16, 16, 3)).astype(np.uint8)).save(d / "image.png")
        else:
            np.save(d / "image.npy", rng.rand(1, 3, 16, 16).astype(np.float32))
        np.save(d / "extra_0.npy", rng.randn(1, 8).astype(np.float32))     # 'extra:0' under its file name
    samples = list(FolderReader(calib, api.load_graph(tmp_path / "m.mnn")))
    assert len(samples) == 5 and all(set(s) == {"image", "extra:0"} for s in samples)
    assert samples[1]["image"].max() > 1.5 and samples[0]["image"].max() <= 1.0      # png bytes vs the .npy
    p = subprocess.run([sys.executable, "-m", "mnntool", "quant", str(tmp_path / "m.mnn"), str(tmp_path / "q.mnn"),
                        "--int8", "--calib", str(calib), "--json"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-1500:]
    r = json.loads(p.stdout)
    assert r["calibration_samples"] + r["held_out_samples"] == 5 and r["int8_layers"] >= 1
    (calib / "s3" / "extra_0.npy").unlink()
    p = subprocess.run([sys.executable, "-m", "mnntool", "quant", str(tmp_path / "m.mnn"), str(tmp_path / "q2.mnn"),
                        "--int8", "--calib", str(calib)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "s3: no file for input 'extra:0'" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "q2.mnn").exists()
