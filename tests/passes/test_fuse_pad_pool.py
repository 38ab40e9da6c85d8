"""fuse_pad_into_avg_pool: an average pooling counting equal padding on both sides is written as MNN's
converter writes it (the pooling's own pads, INCLUDE_PADDING) instead of a Padding op before it; a ceil
window keeps the explicit padding (MNN's divisor differs there). Meaning kept: against onnxruntime,
cosine >= 0.9999 and max error <= 1e-3 of the output's scale, in mnntool's runtime and in MNN."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from mnntool import api  # noqa: E402
from mnntool.format import reader  # noqa: E402
from tests.passes.both_runtimes import assert_fp32_same, assert_int8_same  # noqa: E402

SHAPE = (1, 8, 17, 22)


class Pools(nn.Module):
    """Inception's branch pooling (3x3, stride 1, pad 1), a stride-2 one and a 5x5 pad-2 one (fused), and
    a ceil-mode one (kept explicit), each after a convolution."""
    def __init__(self):
        super().__init__()
        self.c = nn.Sequential(nn.Conv2d(8, 32, 3, 1, 1), nn.ReLU(), nn.Conv2d(32, 32, 3, 1, 1))
        self.p1 = nn.AvgPool2d(3, 1, 1, count_include_pad=True)
        self.p2 = nn.AvgPool2d(3, 2, 1, count_include_pad=True)
        self.p3 = nn.AvgPool2d(5, 1, 2, count_include_pad=True)
        self.p4 = nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=True)

    def forward(self, x):
        y = self.c(x)
        return torch.cat([self.p1(y).flatten(1), self.p2(y).flatten(1), self.p3(y).flatten(1),
                          self.p4(y).flatten(1)], 1)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("pad_pool")
    src, dst = d / "m.onnx", d / "m.mnn"
    torch.manual_seed(0)
    torch.onnx.export(Pools().eval(), (torch.randn(*SHAPE),), str(src), dynamo=False, opset_version=17,
                      input_names=["x"], output_names=["y"])
    api.convert(src, dst)
    return src, dst


def test_padding_goes_into_the_pooling(files):
    g = reader.load(files[1])
    pools = [n.param for n in g.nodes if n.op == "Pooling"]
    assert [p.get("countType") for p in pools].count("INCLUDE_PADDING") == 3, pools
    assert [n.op for n in g.nodes].count("Padding") == 1      # the ceil-mode pooling's


def test_means_the_same_in_both_runtimes(files):
    src, dst = files
    assert_fp32_same(src, dst, SHAPE)


def test_int8_means_the_same_in_both_runtimes(files, tmp_path):
    """The padded averages on int8 tensors: the two runtimes agree (cosine >= 0.9999), MNN's int8 output
    >= 0.99 of fp32."""
    assert_int8_same(files[1], tmp_path / "m8.mnn", SHAPE)
