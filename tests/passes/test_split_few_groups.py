"""split_few_groups: a convolution of 2 to 4 groups is written as MNN's converter writes it (a channel
Slice, one convolution per group, a channel Concat, all in NC4HW4); 8 groups stay one grouped
convolution. Meaning kept in fp32 (against onnxruntime: cosine >= 0.9999, max error <= 1e-3 of the
output's scale, in mnntool's runtime and in MNN) and in int8 (the two runtimes agree at cosine >= 0.9999,
MNN's int8 output >= 0.99 of fp32)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from mnntool.format import reader  # noqa: E402
from tests.passes.both_runtimes import agreement_tests, files_fixture  # noqa: E402

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


files = files_fixture(Grouped, SHAPE, "few_groups")


def test_written_split(files):
    g = reader.load(files[1])
    groups = sorted(int(n.param["common"]["group"]) for n in g.nodes if n.op == "Convolution")
    assert groups == [1] * 7 + [8], groups          # stem, 2 + 4 split, the 8-group one kept
    ops = [n.op for n in g.nodes]
    assert ops.count("Slice") == 2 and ops.count("Concat") == 2 and ops.count("ConvertTensor") == 2, ops
    relu = [n.param["common"].get("relu") for n in g.nodes if n.op == "Convolution"]
    assert relu.count(True) == 3, relu              # the stem's and both halves of the radix-2 one


test_fp32_means_the_same_in_both_runtimes, test_int8_means_the_same_in_both_runtimes = agreement_tests(SHAPE)
