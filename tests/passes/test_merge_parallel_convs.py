"""merge_parallel_convs: RepVGG's and MobileOne's training-time branches (3x3, 1x1 and identity BatchNorm,
dense and depthwise, stride 1 and 2) become one convolution per block, with the model's meaning in both
runtimes (against onnxruntime: cosine >= 0.9999, max error <= 1e-3 of the output's scale). Branches that
do not sum to one convolution (a ReLU inside a branch, different inputs, an output read elsewhere) stay."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from mnntool import api  # noqa: E402
from mnntool.loading import load_graph  # noqa: E402
from mnntool.runners import backend_runner  # noqa: E402
from tests.conftest import assert_close, ort_run  # noqa: E402


def _cb(cin, cout, k, stride=1, groups=1):
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout))


class RepBlock(nn.Module):
    """k parallel kxk conv-BN branches, a 1x1 conv-BN branch and (stride 1, same width) an identity BN."""
    def __init__(self, cin, cout, stride=1, groups=1, branches=1):
        super().__init__()
        self.kxk = nn.ModuleList(_cb(cin, cout, 3, stride, groups) for _ in range(branches))
        self.one = _cb(cin, cout, 1, stride, groups)
        self.ident = nn.BatchNorm2d(cin) if stride == 1 and cin == cout else None

    def forward(self, x):
        y = self.one(x)
        for b in self.kxk:
            y = y + b(x)
        if self.ident is not None:
            y = y + self.ident(x)
        return torch.relu(y)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = RepBlock(3, 16, stride=2)                        # RepVGG's first block: no identity
        self.b = RepBlock(16, 16)                                  # RepVGG: 3x3 + 1x1 + identity
        self.c = RepBlock(16, 16, groups=16, branches=3)           # MobileOne's depthwise half
        self.d = RepBlock(16, 32, stride=2, groups=16, branches=2)     # grouped, strided
        self.e = nn.Conv2d(32, 32, 3, 1, 1)
        self.f = nn.Conv2d(32, 32, 1)

    def forward(self, x):
        y = self.d(self.c(self.b(self.a(x))))
        return self.e(y) + torch.relu(self.f(y))        # a ReLU inside one branch: not one convolution


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    torch.manual_seed(0)
    m = Net()
    for mod in m.modules():         # measured statistics, so the branches' sums keep their scale
        if isinstance(mod, nn.BatchNorm2d):
            mod.momentum = None
    with torch.no_grad():
        m.train()(torch.randn(8, 3, 32, 40))
    d = tmp_path_factory.mktemp("rep")
    src, dst = d / "m.onnx", d / "m.mnn"
    torch.onnx.export(m.eval(), (torch.randn(1, 3, 32, 40),), str(src), dynamo=False, opset_version=17,
                      input_names=["x"], output_names=["y"])
    report = api.convert(src, dst)
    return src, dst, report


def test_each_block_is_one_convolution(files):
    _, dst, report = files
    ops = [n.op for n in load_graph(dst).nodes]
    # 4 blocks + e + f, block d's channel multiplier then split in two depthwise (split_grouped_conv)
    assert ops.count("Convolution") + ops.count("ConvolutionDepthwise") == 7, ops
    assert ops.count("BinaryOp") == 1 and "Scale" not in ops, ops                       # the e + relu(f) sum
    assert report["passes"]["merge_parallel_convs"]["removed"]["BinaryOp"] == 9


@pytest.mark.parametrize("backend", ["numba", "mnn"])
def test_meaning_in_both_runtimes(files, backend):
    if backend == "mnn":
        pytest.importorskip("MNN")
    src, dst, _ = files
    x = np.random.default_rng(2).standard_normal((1, 3, 32, 40)).astype(np.float32)
    assert_close(ort_run(src, {"x": x})["y"], backend_runner(dst, backend, 1).run({"x": x})["y"])


def test_off_without_the_pass(files, tmp_path):
    from mnntool.passes import resolve
    src, _, _ = files
    api.convert(src, tmp_path / "o.mnn", passes=[p for p in resolve(1) if p != "merge_parallel_convs"])
    assert [n.op for n in load_graph(tmp_path / "o.mnn").nodes].count("BinaryOp") == 10
