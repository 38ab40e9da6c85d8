"""The forms MNN runs fastest, written for FastViT/MobileOne-style blocks: a layer scale (a per-channel
constant times an NC4HW4 tensor) stays in NC4HW4 with no conversions around it, and a grouped convolution
with a channel multiplier is split (split_grouped_conv). Both keep their meaning in fp32 (against
onnxruntime: cosine >= 0.9999, max error <= 1e-3 of the scale) and in int8 (the two runtimes agree at
cosine >= 0.9999, and MNN's int8 output is >= 0.99 of fp32), as tests/quant/test_int8_agreement.py asks."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from mnntool.format import reader  # noqa: E402
from tests.passes.both_runtimes import agreement_tests, exported  # noqa: E402


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
    d = tmp_path_factory.mktemp("fastvit")
    return (*exported(RepMixerDown(), (1, 3, 48, 64), d), d)


def test_written_in_the_fast_forms(files):
    _, fp32, _ = files
    g = reader.load(fp32)
    ops = [n.op for n in g.nodes]
    assert "Convolution" in ops and ops.count("ConvolutionDepthwise") == 3, ops     # mixer + the split pair
    converted = {o for n in g.nodes if n.op == "ConvertTensor" for o in n.outputs + n.inputs}
    binary = [n for n in g.nodes if n.op == "BinaryOp"]
    assert len(binary) == 3 and not any(set(n.inputs + n.outputs) & converted for n in binary), \
        [(n.inputs, n.outputs) for n in binary]     # the layer scale computes in NC4HW4, no conversions


test_fp32_means_the_same_in_both_runtimes, test_int8_means_the_same_in_both_runtimes = agreement_tests((1, 3, 48, 64))
