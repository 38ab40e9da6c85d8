"""A squeeze-excite product read by an int8 1x1 convolution runs as one ScaledPointwise step, a BatchNorm left as
a Scale (DenseNet's pre-activations) as one AffinePointwise step (plan stage fuse_channel_scale; the product or
the Scale computed in the convolution's packing pass, int8_conv.quantize_packed_scaled / _affine): the same
bytes as the op as a step of its own, on the integer kernel and on the float fallback, and the same meaning
as the file has in MNN (cosine >= 0.9999; >= 0.99 to fp32, so a file broken in both fails)."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from mnntool.compare import metrics  # noqa: E402
from mnntool.format import reader  # noqa: E402
from mnntool.quant import QuantConfig, quantize_file  # noqa: E402
from mnntool.runtime.kernels.micro import int8_gemm  # noqa: E402
from mnntool.runtime.session import Session  # noqa: E402
from tests.conftest import mnn_run  # noqa: E402
from tests.quant.test_int8_agreement import _exported  # noqa: E402


class SqueezeExcite(nn.Module):
    """EfficientNet's block: depthwise + SiLU, a squeeze-excite gate, x * gate into a 1x1 projection
    (channels not a multiple of 4 in the second block: the packing's channel tail)."""
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 24, 3, 2, 1), nn.BatchNorm2d(24), nn.SiLU())
        self.dw = nn.Sequential(nn.Conv2d(24, 24, 3, 1, 1, groups=24), nn.BatchNorm2d(24), nn.SiLU())
        self.se = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(24, 6, 1), nn.SiLU(), nn.Conv2d(6, 24, 1),
                                nn.Sigmoid())
        self.proj = nn.Sequential(nn.Conv2d(24, 18, 1), nn.BatchNorm2d(18))
        self.dw2 = nn.Sequential(nn.Conv2d(18, 18, 3, 1, 1, groups=18), nn.BatchNorm2d(18), nn.SiLU())
        self.se2 = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(18, 4, 1), nn.SiLU(), nn.Conv2d(4, 18, 1),
                                 nn.Sigmoid())
        self.pw2 = nn.Sequential(nn.Conv2d(18, 16, 1), nn.BatchNorm2d(16), nn.ReLU())
        self.head = nn.Conv2d(16, 8, 3, 1, 1)       # (a file's last layer may stay float)

    def forward(self, x):
        d = self.dw(self.stem(x))
        p = self.proj(d * self.se(d))
        e = self.dw2(p)
        return self.head(self.pw2(e * self.se2(e)))


class DenseLike(nn.Module):
    """DenseNet's layers: BatchNorm + ReLU on a Concat (a Scale: nothing to fold it into) before a 1x1
    convolution, twice; and a plain BatchNorm (no ReLU) before the head's 1x1."""
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.ReLU())
        self.l1 = self._layer(16)
        self.l2 = self._layer(24)
        self.bn, self.head = nn.BatchNorm2d(32), nn.Conv2d(32, 8, 1)
        self.out = nn.Conv2d(8, 4, 3, 1, 1)

    @staticmethod
    def _layer(c):
        return nn.Sequential(nn.BatchNorm2d(c), nn.ReLU(), nn.Conv2d(c, 24, 1), nn.BatchNorm2d(24), nn.ReLU(),
                             nn.Conv2d(24, 8, 3, 1, 1))

    def forward(self, x):
        a = self.stem(x)
        b = torch.cat([a, self.l1(a)], 1)
        c = torch.cat([b, self.l2(b)], 1)
        return self.out(self.head(self.bn(c)))


MODELS = {"squeeze_excite": (SqueezeExcite, "ScaledPointwise", 2), "dense": (DenseLike, "AffinePointwise", 3)}


@pytest.fixture(scope="module", params=sorted(MODELS))
def files(tmp_path_factory, request):
    tmp = tmp_path_factory.mktemp("se")
    rng = np.random.default_rng(0)
    shape = (1, 3, 40, 52)
    model, op, count = MODELS[request.param]
    fp32, int8 = _exported(tmp, model, shape)
    quantize_file(fp32, int8, QuantConfig(int8=True, calib=[{"x": rng.standard_normal(shape).astype(np.float32)}
                                                            for _ in range(8)], method="mse"))
    return fp32, int8, {"x": rng.standard_normal(shape).astype(np.float32)}, op, count


@pytest.mark.parametrize("vnni", [True, False])
def test_fused_product_gives_the_same_bytes(files, vnni, monkeypatch):
    if not vnni:        # the float fallback (convolution._grid_input multiplies, then rounds)
        monkeypatch.setattr(int8_gemm, "HAS_VNNI", False)
    elif not int8_gemm.HAS_VNNI:
        pytest.skip("no VNNI")
    _, int8, feeds, op, count = files
    g = reader.load(int8)
    fused, apart = Session(g, 1), Session(g, 1, off={"fuse_channel_scale"})
    got, want = fused.run(feeds)["y"], apart.run(feeds)["y"]
    steps = [st for st in fused.plan.ran if st.op == op]
    assert len(steps) == count and all(st.kernel.out_grid for st in steps)        # int8 layers all
    assert not any(st.op == op for st in apart.plan.ran)
    assert got.tobytes() == want.tobytes()


def test_fused_product_means_what_mnn_computes(files):
    fp32, int8, feeds, _, _ = files
    ours = Session(reader.load(int8)).run(feeds)["y"]
    theirs = mnn_run(int8, ["x"], ["y"], feeds)["y"].reshape(ours.shape)
    ref = Session(reader.load(fp32)).run(feeds)["y"]
    assert metrics(ref, theirs)["cosine"] >= 0.99
    agree = metrics(theirs, ours)
    assert agree["cosine"] >= 0.9999, agree
