"""The forms MNN runs fastest, written for FastViT/MobileOne-style blocks: a layer scale (a per-channel
constant times an NC4HW4 tensor) stays in NC4HW4 with no conversions around it, and a grouped convolution
with a channel multiplier is split (split_grouped_conv). Both keep their meaning in fp32 (against
onnxruntime: cosine >= 0.9999, max error <= 1e-3 of the scale) and in int8 (the two runtimes agree at
cosine >= 0.9999, and MNN's int8 output is >= 0.99 of fp32), as tests/quant/test_int8_agreement.py asks."""
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


class RepMixerDown(nn.Module):
    """FastViT's RepMixer (x + gamma * (mixer(x) - norm(x))) then its down-sampling grouped convolution."""
    def __init__(self, c=16):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, 2, 1), nn.BatchNorm2d(c), nn.ReLU())
        self.mixer = nn.Sequential(nn.Conv2d(c, c, 3, 1, 1, groups=c), nn.BatchNorm2d(c))
        self.norm = nn.BatchNorm2d(c)
        self.gamma = nn.Parameter(torch.rand(c, 1, 1) + 0.5)
        self.down = nn.Sequential(nn.Conv2d(c, 2 * c, 7, 2, 3, groups=c), nn.BatchNorm2d(2 * c), nn.ReLU())
        self.head = nn.Conv2d(2 * c, 4, 1)

    def forward(self, x):
        s = self.stem(x)
        s = s + self.gamma * (self.mixer(s) - self.norm(s))
        return self.head(self.down(s))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    torch.manual_seed(0)
    m = RepMixerDown()
    for mod in m.modules():         # batch norms measured on data, so activations keep their scale
        if isinstance(mod, nn.BatchNorm2d):
            mod.momentum = None
            mod.reset_running_stats()
    with torch.no_grad():
        m.train()(torch.randn(8, 3, 48, 64))
    d = tmp_path_factory.mktemp("fastvit")
    src, fp32 = d / "m.onnx", d / "m.mnn"
    torch.onnx.export(m.eval(), (torch.randn(1, 3, 48, 64),), str(src), dynamo=False, opset_version=17,
                      input_names=["x"], output_names=["y"])
    api.convert(src, fp32)
    return src, fp32, d


def test_written_in_the_fast_forms(files):
    _, fp32, _ = files
    g = reader.load(fp32)
    ops = [n.op for n in g.nodes]
    assert "Convolution" in ops and ops.count("ConvolutionDepthwise") == 3, ops     # mixer + the split pair
    converted = {o for n in g.nodes if n.op == "ConvertTensor" for o in n.outputs + n.inputs}
    binary = [n for n in g.nodes if n.op == "BinaryOp"]
    assert len(binary) == 3 and not any(set(n.inputs + n.outputs) & converted for n in binary), \
        [(n.inputs, n.outputs) for n in binary]     # the layer scale computes in NC4HW4, no conversions


def test_fp32_means_the_same_in_both_runtimes(files):
    src, fp32, _ = files
    x = np.random.default_rng(1).standard_normal((1, 3, 48, 64)).astype(np.float32)
    ref = ort_run(src, {"x": x})["y"]
    assert_close(ref, Session(reader.load(fp32)).run({"x": x})["y"])
    pytest.importorskip("MNN")
    assert_close(ref, mnn_run(fp32, ["x"], ["y"], {"x": x})["y"])


def test_int8_means_the_same_in_both_runtimes(files):
    pytest.importorskip("MNN")
    _, fp32, d = files
    rng = np.random.default_rng(0)
    int8 = d / "m8.mnn"
    samples = [{"x": rng.standard_normal((1, 3, 48, 64)).astype(np.float32)} for _ in range(8)]
    quantize_file(fp32, int8, QuantConfig(int8=True, calib=samples, method="mse"))
    feeds = {"x": rng.standard_normal((1, 3, 48, 64)).astype(np.float32)}
    ref = Session(reader.load(fp32)).run(feeds)["y"]
    ours = Session(reader.load(int8)).run(feeds)["y"]
    theirs = mnn_run(int8, ["x"], ["y"], feeds)["y"].reshape(ours.shape)
    assert metrics(ref, theirs)["cosine"] >= 0.99
    agree = metrics(theirs, ours)
    assert agree["cosine"] >= 0.9999, agree
