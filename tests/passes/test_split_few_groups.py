"""split_few_groups: a convolution of 2 to 4 groups is written as MNN's converter writes it (a channel
Slice, one convolution per group, a channel Concat, all in NC4HW4); 8 groups stay one grouped
convolution. Meaning kept in fp32 (against onnxruntime: cosine >= 0.9999, max error <= 1e-3 of the
output's scale, in mnntool's runtime and in MNN) and in int8 (the two runtimes agree at cosine >= 0.9999,
MNN's int8 output >= 0.99 of fp32)."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from mnntool import api  # noqa: E402
from mnntool.compare import metrics  # noqa: E402
from mnntool.format import reader  # noqa: E402
from mnntool.quant import QuantConfig, quantize_file  # noqa: E402
from mnntool.runtime.session import Session  # noqa: E402
from tests.conftest import assert_close, mnn_run, ort_run  # noqa: E402

SHAPE = (1, 3, 30, 34)


class Grouped(nn.Module):
    """ResNeSt-style radix-2 3x3 (with BatchNorm and ReLU), a 4-group 1x1, an 8-group 3x3."""
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 24, 3, 2, 1), nn.ReLU())
        self.g2 = nn.Sequential(nn.Conv2d(24, 48, 3, 1, 1, groups=2), nn.BatchNorm2d(48), nn.ReLU())
        self.g4 = nn.Conv2d(48, 32, 1, groups=4)
        self.g8 = nn.Conv2d(32, 32, 3, 1, 1, groups=8)

    def forward(self, x):
        return self.g8(self.g4(self.g2(self.stem(x))))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    torch.manual_seed(0)
    m = Grouped()
    for mod in m.modules():         # batch norms measured on data, so activations keep their scale
        if isinstance(mod, nn.BatchNorm2d):
            mod.momentum = None
            mod.reset_running_stats()
    with torch.no_grad():
        m.train()(torch.randn(8, *SHAPE[1:]))
    d = tmp_path_factory.mktemp("few_groups")
    src, fp32 = d / "m.onnx", d / "m.mnn"
    torch.onnx.export(m.eval(), (torch.randn(*SHAPE),), str(src), dynamo=False, opset_version=17,
                      input_names=["x"], output_names=["y"])
    api.convert(src, fp32)
    return src, fp32, d


def test_written_split(files):
    g = reader.load(files[1])
    groups = sorted(int(n.param["common"]["group"]) for n in g.nodes if n.op == "Convolution")
    assert groups == [1] * 7 + [8], groups          # stem, 2 + 4 split, the 8-group one kept
    ops = [n.op for n in g.nodes]
    assert ops.count("Slice") == 2 and ops.count("Concat") == 2 and ops.count("ConvertTensor") == 2, ops
    relu = [n.param["common"].get("relu") for n in g.nodes if n.op == "Convolution"]
    assert relu.count(True) == 3, relu              # the stem's and both halves of the radix-2 one


def test_fp32_means_the_same_in_both_runtimes(files):
    src, fp32, _ = files
    x = np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32)
    ref = ort_run(src, {"x": x})["y"]
    assert_close(ref, Session(reader.load(fp32)).run({"x": x})["y"])
    pytest.importorskip("MNN")
    assert_close(ref, mnn_run(fp32, ["x"], ["y"], {"x": x})["y"])


def test_int8_means_the_same_in_both_runtimes(files):
    pytest.importorskip("MNN")
    _, fp32, d = files
    rng = np.random.default_rng(0)
    int8 = d / "m8.mnn"
    samples = [{"x": rng.standard_normal(SHAPE).astype(np.float32)} for _ in range(8)]
    quantize_file(fp32, int8, QuantConfig(int8=True, calib=samples, method="mse"))
    feeds = {"x": rng.standard_normal(SHAPE).astype(np.float32)}
    ref = Session(reader.load(fp32)).run(feeds)["y"]
    ours = Session(reader.load(int8)).run(feeds)["y"]
    theirs = mnn_run(int8, ["x"], ["y"], feeds)["y"].reshape(ours.shape)
    assert metrics(ref, theirs)["cosine"] >= 0.99
    agree = metrics(theirs, ours)
    assert agree["cosine"] >= 0.9999, agree
