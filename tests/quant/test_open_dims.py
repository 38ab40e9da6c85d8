"""int8 quantization of a model whose batch and image size stay open: --input-shape fixes the size the
calibration images are read at, and the quantized file keeps the open dims (it runs at other sizes in
both runtimes). Without a size, image calibration stops with one line.

Reference: the float model in mnntool's runtime; int8 output cosine >= 0.98 at every size (a random-weight
CNN calibrated on 6 images, its 4 outputs compared: measured 0.9893 / 0.9900; the same model from seeds 0-5
measures 0.927-0.998, mean 0.972, with the convolution before the average pool in int8, and 0.908-0.9998,
mean 0.971, with it float), and the two runtimes agree on the int8 file at cosine >= 0.999.
"""
import contextlib
import io
import subprocess
import sys

import numpy as np
import pytest

from mnntool import api
from mnntool.runtime.session import Session

torch = pytest.importorskip("torch")


def _cos(a, b):
    return float(a.ravel() @ b.ravel() / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_quant_with_input_shape_keeps_open_dims(tmp_path):
    from PIL import Image
    from mnntool.runtime.mnn_backend import MnnSession
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3, stride=2),
                            torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 4)).eval()
    src = tmp_path / "m.onnx"
    with contextlib.redirect_stdout(io.StringIO()):
        torch.onnx.export(m, (torch.randn(1, 3, 32, 32),), str(src), input_names=["x"], output_names=["y"],
                          dynamo=False, dynamic_axes={"x": {0: "N", 2: "H", 3: "W"}, "y": {0: "N"}})
    api.convert(src, tmp_path / "f.mnn")
    calib = tmp_path / "calib"
    calib.mkdir()
    rng = np.random.RandomState(0)
    for i in range(6):
        Image.fromarray((rng.rand(40, 50, 3) * 255).astype(np.uint8)).save(calib / f"{i}.png")
    run = lambda *a: subprocess.run([sys.executable, "-m", "mnntool", *map(str, a)], capture_output=True, text=True)  # noqa: E731
    p = run("quant", tmp_path / "f.mnn", tmp_path / "none.mnn", "--int8", "--calib", calib)
    assert p.returncode == 2 and "--input-shape" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "none.mnn").exists()
    p = run("quant", tmp_path / "f.mnn", tmp_path / "q.mnn", "--int8", "--calib", calib, "--input-shape", "x:1x3x32x32")
    assert p.returncode == 0, p.stderr
    q = api.load_graph(tmp_path / "q.mnn")
    assert not isinstance(q.tensors["x"].shape[2], int), "the calibration size was written into the file"
    f = Session(api.load_graph(tmp_path / "f.mnn"))
    ours, theirs = Session(q), MnnSession(str(tmp_path / "q.mnn"), q.inputs, q.outputs)
    for shape in ((1, 3, 32, 32), (2, 3, 48, 40)):
        x = (np.random.RandomState(1).rand(*shape) * 2 - 1).astype(np.float32)
        ref = f.run({"x": x})["y"]
        a, b = ours.run({"x": x})["y"], theirs.run({"x": x})["y"]
        assert _cos(a, ref) >= 0.98 and _cos(b, ref) >= 0.98
        assert _cos(a, b) >= 0.999
