"""A squeeze-excite product read by an int8 1x1 convolution runs as one ScaledPointwise step (plan stage
fuse_channel_scale; the product quantized in the convolution's packing pass, int8_conv.quantize_packed_scaled):
the same bytes as the multiply as a step of its own, on the integer kernel and on the float fallback, and
the same meaning as the file has in MNN (cosine >= 0.9999; >= 0.99 to fp32, so a file broken in both fails)."""
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


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("se")
    rng = np.random.default_rng(0)
    shape = (1, 3, 40, 52)
    fp32, int8 = _exported(tmp, SqueezeExcite, shape)
    quantize_file(fp32, int8, QuantConfig(int8=True, calib=[{"x": rng.standard_normal(shape).astype(np.float32)}
                                                            for _ in range(8)], method="mse"))
    return fp32, int8, {"x": rng.standard_normal(shape).astype(np.float32)}


@pytest.mark.parametrize("vnni", [True, False])
def test_fused_product_gives_the_same_bytes(files, vnni, monkeypatch):
    if not vnni:        # the float fallback (convolution._grid_input multiplies, then rounds)
        monkeypatch.setattr(int8_gemm, "HAS_VNNI", False)
    elif not int8_gemm.HAS_VNNI:
        pytest.skip("no VNNI")
    _, int8, feeds = files
    g = reader.load(int8)
    fused, apart = Session(g, 1), Session(g, 1, off={"fuse_channel_scale"})
    got, want = fused.run(feeds)["y"], apart.run(feeds)["y"]
    scaled = [st for st in fused.plan.ran if st.op == "ScaledPointwise"]
    assert len(scaled) == 2 and all(st.kernel.out_grid for st in scaled)        # int8 layers both
    assert not any(st.op == "ScaledPointwise" for st in apart.plan.ran)
    assert got.tobytes() == want.tobytes()


def test_fused_product_means_what_mnn_computes(files):
    fp32, int8, feeds = files
    ours = Session(reader.load(int8)).run(feeds)["y"]
    theirs = mnn_run(int8, ["x"], ["y"], feeds)["y"].reshape(ours.shape)
    ref = Session(reader.load(fp32)).run(feeds)["y"]
    assert metrics(ref, theirs)["cosine"] >= 0.99
    agree = metrics(theirs, ours)
    assert agree["cosine"] >= 0.9999, agree
