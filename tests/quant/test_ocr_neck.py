"""One meaning per int8 file for a text detector's neck at text-page statistics.

PP-OCRv4's detector (RSE-FPN neck: per level a 1x1 convolution and a squeeze-excite residual, top-down
nearest upsampling and additions, 3x3 convolutions with their own squeeze-excite, every level upsampled
to 1/4 and concatenated, then the DB head) came out of `quant --int8` at cosine 0.99 vs fp32 in
mnntool's runtime and 0.115 in MNN: the grid the quantizer gave a global average pooling's output
(the input of an int8 squeeze-excite convolution) was spread by MNN back onto the feature map it
averages, which then clamped that map for the additions and the upsampling (ptq.spread_grids).

The model here has the same neck on a small strided backbone, seeded, batch norms measured on text
pages (fixtures/textpages.py: dark words in PIL's default font on a light page, ImageNet mean/std).
Calibrated on 8 pages, judged on 2 others. Tolerances: the two runtimes agree at cosine >= 0.9999
on the same file, and the file's output is within cosine 0.99 of fp32 in MNN.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("PIL")
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from fixtures.textpages import pages  # noqa: E402
from fixtures.trained_stats import measure_batchnorm  # noqa: E402
from mnntool import api  # noqa: E402
from mnntool.compare import metrics  # noqa: E402
from mnntool.format import reader  # noqa: E402
from mnntool.quant import QuantConfig, quantize_file  # noqa: E402
from mnntool.quant.ptq import spread_grids  # noqa: E402
from mnntool.runtime.session import Session  # noqa: E402
from tests.conftest import mnn_run  # noqa: E402

SIZE = (128, 128)


def _cbh(cin, cout, stride):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.Hardswish())


class SE(nn.Module):
    """PP-OCR's squeeze-excite residual: x + x * hardsigmoid(fc2(relu(fc1(mean(x)))))."""
    def __init__(self, c):
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(c, c // 4, 1), nn.Conv2d(c // 4, c, 1)

    def forward(self, x):
        g = F.hardsigmoid(self.fc2(F.relu(self.fc1(F.adaptive_avg_pool2d(x, 1)))))
        return x + x * g


class RseNeckDetector(nn.Module):
    def __init__(self, chans=(16, 24, 32, 48), inner=32):
        super().__init__()
        self.stem = _cbh(3, chans[0], 2)
        self.stages = nn.ModuleList([_cbh(chans[0], chans[0], 2)] +
                                    [_cbh(chans[k - 1], chans[k], 2) for k in range(1, 4)])   # 1/4..1/32
        self.lateral = nn.ModuleList(nn.Sequential(nn.Conv2d(c, inner, 1, bias=False), SE(inner)) for c in chans)
        self.smooth = nn.ModuleList(nn.Sequential(nn.Conv2d(inner, inner // 4, 3, 1, 1, bias=False), SE(inner // 4))
                                    for _ in chans)
        self.head = nn.Sequential(nn.Conv2d(inner, inner // 4, 3, 1, 1, bias=False), nn.BatchNorm2d(inner // 4),
                                  nn.ReLU(), nn.ConvTranspose2d(inner // 4, 1, 4, 4))

    def forward(self, x):
        x = self.stem(x)
        feats = []
        for s in self.stages:
            x = s(x)
            feats.append(x)
        lat = [m(f) for m, f in zip(self.lateral, feats)]
        for k in range(3, 0, -1):       # top-down: nearest upsampling and additions
            lat[k - 1] = lat[k - 1] + F.interpolate(lat[k], scale_factor=2.0, mode="nearest")
        outs = [m(v) for m, v in zip(self.smooth, lat)]
        outs = [outs[0]] + [F.interpolate(o, scale_factor=2.0 ** k, mode="nearest") for k, o in enumerate(outs[1:], 1)]
        return torch.sigmoid(self.head(torch.cat(outs[::-1], 1)))


def _model(calib: list) -> nn.Module:
    """Seeded, batch norms measured on text pages (a trained network's activation scales)."""
    torch.manual_seed(0)
    m = RseNeckDetector()
    return measure_batchnorm(m, torch.from_numpy(np.concatenate(calib)))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ocr_neck")
    calib = pages(8, seed=0, size=SIZE)
    onnx_path, fp32, int8 = tmp / "det.onnx", tmp / "det.mnn", tmp / "det8.mnn"
    torch.onnx.export(_model(calib), (torch.from_numpy(calib[0]),), str(onnx_path), dynamo=False,
                      opset_version=17, input_names=["x"], output_names=["y"])
    api.convert(onnx_path, fp32)
    quantize_file(fp32, int8, QuantConfig(int8=True, calib=[{"x": x} for x in calib], method="mse"))
    return fp32, int8


def test_int8_detector_neck_means_the_same_in_both_runtimes(files):
    fp32, int8 = files
    ref_sess, ours_sess = Session(reader.load(fp32)), Session(reader.load(int8))
    for x in pages(2, seed=100, size=SIZE):
        ref = ref_sess.run({"x": x})["y"]
        ours = ours_sess.run({"x": x})["y"]
        theirs = mnn_run(int8, ["x"], ["y"], {"x": x})["y"].reshape(ours.shape)
        agree = metrics(ours, theirs)
        assert agree["cosine"] >= 0.9999, agree
        assert metrics(ref, theirs)["cosine"] >= 0.99, metrics(ref, theirs)


def test_no_grid_in_the_file_spreads_in_mnn(files):
    """Every int8 grid the file holds stays where the file puts it in MNN (no grid-spreading op between
    a gridded tensor and a float one that other layers read), and the backbone and head stay int8."""
    _, int8 = files
    q = reader.load(int8)
    gridded = {t for t, info in q.tensors.items() if info is not None and info.quant}
    assert not spread_grids(q, gridded)
    assert sum("symmetricQuan" in n.param for n in q.nodes) >= 5     # the backbone and the head


class ClsHead(nn.Module):
    """PP-OCR's direction classifier's end: a hard-swish map, a max pooling, a global average and a
    Linear before the softmax. The average's grid reached the hard-swish through both poolings in MNN,
    whose int8 max pooling then ran on signed bytes (probabilities 0.45/0.55 for 0.99/0.01)."""
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(_cbh(3, 16, 2), _cbh(16, 32, 1), nn.Conv2d(32, 48, 1), nn.BatchNorm2d(48),
                                  nn.Hardswish())
        self.fc = nn.Linear(48, 2)

    def forward(self, x):
        p = F.adaptive_avg_pool2d(F.max_pool2d(self.body(x), 2, 2), 1).flatten(1)
        return torch.softmax(self.fc(p) * 4, 1)


def test_int8_classifier_head_means_the_same_in_both_runtimes(tmp_path):
    """Text lines (192x48, PP-OCR's (x/255 - 0.5) / 0.5): class probabilities agree between the
    runtimes (cosine >= 0.9999, max difference <= 1e-3) and are within cosine 0.99 of fp32 in MNN."""
    from fixtures.textpages import normalised, page
    line = lambda seed: normalised(page(seed, (192, 48), (18, 34)), (0.5,) * 3, (0.5,) * 3)  # noqa: E731
    calib = [line(k) for k in range(8)]
    torch.manual_seed(0)
    m = ClsHead()
    measure_batchnorm(m, torch.from_numpy(np.concatenate(calib)))
    onnx_path, fp32, int8 = tmp_path / "cls.onnx", tmp_path / "cls.mnn", tmp_path / "cls8.mnn"
    torch.onnx.export(m.eval(), (torch.from_numpy(calib[0]),), str(onnx_path), dynamo=False, opset_version=17,
                      input_names=["x"], output_names=["y"])
    api.convert(onnx_path, fp32)
    quantize_file(fp32, int8, QuantConfig(int8=True, calib=[{"x": x} for x in calib], method="mse"))
    ref_sess, ours_sess = Session(reader.load(fp32)), Session(reader.load(int8))
    for x in (line(100), line(101)):
        ref, ours = ref_sess.run({"x": x})["y"], ours_sess.run({"x": x})["y"]
        theirs = mnn_run(int8, ["x"], ["y"], {"x": x})["y"].reshape(ours.shape)
        assert metrics(ours, theirs)["cosine"] >= 0.9999 and np.abs(ours - theirs).max() <= 1e-3, (ours, theirs)
        assert metrics(ref, theirs)["cosine"] >= 0.99, (ref, theirs)
