"""The forms MNN runs fastest for EfficientNet/RexNet-style blocks, as MNN's converter writes them:
x * sigmoid(x) as one UnaryOp SILU (fuse_silu), and a squeeze-excite gate (N, C, 1, 1) times its
feature map computed in NC4HW4 with no conversions around it (layout). Both keep their meaning in fp32
(against onnxruntime: cosine >= 0.9999, max error <= 1e-3 of the output's scale, in mnntool's runtime and
in MNN) and in int8 (the two runtimes agree at cosine >= 0.9999, MNN's int8 output >= 0.99 of fp32: MNN
computes a UnaryOp SILU in float and a float add reads it unrounded, runtime/plan/int8_store.raw_reads)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from mnntool import api  # noqa: E402
from mnntool.format import reader  # noqa: E402
from mnntool.ir.graph import Graph, Node  # noqa: E402
from mnntool.passes.fuse_silu import FuseSiluPass  # noqa: E402
from tests.passes.both_runtimes import agreement_tests  # noqa: E402


class SwishSE(nn.Module):
    """Conv+SiLU, depthwise+SiLU, a squeeze-excite (mean, 1x1 conv, SiLU, 1x1 conv, sigmoid, gate times
    the map, the gate on either side), a residual add of the float gate product and the int8 SiLU output,
    then a head; x * sigmoid(x) written out by hand in one place."""
    def __init__(self, c=16):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, 2, 1), nn.BatchNorm2d(c))
        self.dw = nn.Sequential(nn.Conv2d(c, c, 3, 1, 1, groups=c), nn.BatchNorm2d(c), nn.SiLU())
        self.se = nn.Sequential(nn.Conv2d(c, 4, 1), nn.SiLU(), nn.Conv2d(4, c, 1), nn.Sigmoid())
        self.se2 = nn.Sequential(nn.Conv2d(c, 4, 1), nn.ReLU(), nn.Conv2d(4, c, 1), nn.Sigmoid())
        self.head = nn.Conv2d(c, 4, 1)

    def forward(self, x):
        s = self.stem(x)
        s = s * torch.sigmoid(s)
        d = self.dw(s)
        d = d * self.se(d.mean((2, 3), keepdim=True))
        d = self.se2(d.mean((2, 3), keepdim=True)) * d
        return self.head(d + s)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    torch.manual_seed(0)
    m = SwishSE()
    d = tmp_path_factory.mktemp("silu_se")
    src, fp32 = d / "m.onnx", d / "m.mnn"
    torch.onnx.export(m.eval(), (torch.randn(1, 3, 40, 56),), str(src), dynamo=False, opset_version=17,
                      input_names=["x"], output_names=["y"])
    api.convert(src, fp32)
    return src, fp32, d


def test_written_in_the_fast_forms(files):
    _, fp32, _ = files
    g = reader.load(fp32)
    unary = [n.param.get("opType") for n in g.nodes if n.op == "UnaryOp"]
    assert unary.count("SILU") == 3 and unary.count("SIGMOID") == 2, unary
    converts = [n for n in g.nodes if n.op == "ConvertTensor"]
    made = {o for n in converts for o in n.outputs}
    gates = [n for n in g.nodes if n.op == "BinaryOp" and n.param.get("opType") == "MUL"]
    assert len(gates) == 2 and not any(set(n.inputs) & made for n in gates), \
        [(n.inputs, n.outputs) for n in gates]      # the gate multiplies in NC4HW4, no conversions
    # the input, the head's output, and each mean's way to NCHW and its 1x1 result back: nothing else
    assert len(converts) == 6, [(n.inputs, n.outputs) for n in converts]


test_fp32_means_the_same_in_both_runtimes, test_int8_means_the_same_in_both_runtimes = agreement_tests((1, 3, 40, 56))


def test_a_sigmoid_read_elsewhere_stays():
    """The sigmoid is kept when anything besides the product reads it (or it is an output)."""
    g = Graph(inputs=["x"], outputs=["y", "s"])
    g.nodes = [Node("UnaryOp", ["x"], ["s"], "sig", {"opType": "SIGMOID", "T": "DT_FLOAT"}),
               Node("BinaryOp", ["x", "s"], ["y"], "mul", {"opType": "MUL", "T": "DT_FLOAT", "activationType": 0})]
    assert not FuseSiluPass()(g)
    g.outputs = ["y"]
    assert FuseSiluPass()(g) and [(n.op, n.param["opType"], n.inputs) for n in g.nodes] == [("UnaryOp", "SILU", ["x"])]
