"""Channel slices and concats of NC4HW4 tensors stay in NC4HW4, as MNN's converter writes them (layout's
`_moves_packed`): RexNet's partial residual (an ONNX Slice over channels, an add, a Concat) and a Split
with a Concat, with no ConvertTensor around them. Their meaning is kept in fp32 (against onnxruntime:
cosine >= 0.9999, max error <= 1e-3 of the output's scale, in mnntool's runtime and in MNN) and in int8
(the two runtimes agree at cosine >= 0.9999, MNN's int8 output >= 0.99 of fp32)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from mnntool.format import reader  # noqa: E402
from tests.passes.both_runtimes import agreement_tests, files_fixture  # noqa: E402

SHAPE = (1, 3, 36, 44)


class PartialResidual(nn.Module):
    """x (10 channels) -> y (22): cat(y[:, :10] + x, y[:, 10:]); then split 9/13 and concat the other way."""
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 10, 3, 2, 1), nn.BatchNorm2d(10), nn.ReLU6())
        self.grow = nn.Sequential(nn.Conv2d(10, 22, 1), nn.BatchNorm2d(22))
        self.dw = nn.Sequential(nn.Conv2d(22, 22, 3, 1, 1, groups=22), nn.ReLU())
        self.head = nn.Conv2d(22, 4, 1)

    def forward(self, x):
        x = self.stem(x)
        y = self.grow(x)
        y = torch.cat([y[:, :10] + x, y[:, 10:]], 1)
        a, b = self.dw(y).split([9, 13], 1)
        return self.head(torch.cat([b, a], 1))


files = files_fixture(PartialResidual, SHAPE, "packed_movement")


def test_written_in_nc4hw4(files):
    _, fp32, _ = files
    g = reader.load(fp32)
    ops = [n.op for n in g.nodes]
    assert ops.count("Concat") == 2 and ops.count("StridedSlice") == 2 and ops.count("Slice") == 1, ops
    assert ops.count("ConvertTensor") == 2, ops        # the input's and the output's only


test_fp32_means_the_same_in_both_runtimes, test_int8_means_the_same_in_both_runtimes = agreement_tests(SHAPE)
