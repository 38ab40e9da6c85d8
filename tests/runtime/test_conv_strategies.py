"""Convolution dispatch: one layer per strategy, checking that `pick` chooses it (with and without
AVX-512) and that the strategy's kernel matches torch's conv2d. Every strategy must have a case here.
Tolerance: 5e-5 of the output's largest magnitude (fp32 sums of up to 1296 products; Winograd's
transforms scale values by up to 8x), and int8-grid outputs within one grid step."""
import numpy as np
import pytest

from mnntool.runtime.kernels.ops.conv_strategies import HAS_AVX512, STRATEGIES, Geometry, Layer, pick
from mnntool.runtime.kernels.micro.epilogue import NO_GRID, RELU6, grid_of

torch = pytest.importorskip("torch")
F = torch.nn.functional


def geo(n, cin, h, w, cout, k, s=1, p=0, group=1, d=1):
    oh = (h + 2 * p - d * (k - 1) - 1) // s + 1
    ow = (w + 2 * p - d * (k - 1) - 1) // s + 1
    return Geometry(n, cin, h, w, cout, oh, ow, k, k, s, s, d, d, p, p, p, p, group)


# geometry -> (strategy with AVX-512, strategy without)
CASES = {
    "dw3 tiny map": (geo(1, 16, 7, 7, 16, 3, p=1, group=16), "dw-lanes", "dw3-plane"),
    "dw3 tiny map, 8 channels": (geo(1, 8, 7, 7, 8, 3, p=1, group=8), "dw-flat", "dw3-plane"),
    "dw5 tiny map, two images": (geo(2, 24, 7, 7, 24, 5, p=2, group=24), "dw-lanes", "dw-channels-last"),
    "dw7 tiny map, 6x5": (geo(1, 8, 6, 5, 8, 7, p=3, group=8), "dw-flat", "dw-channels-last"),
    "dw3 wide map": (geo(1, 8, 70, 70, 8, 3, p=1, group=8), "dw3-rows", "dw3-plane"),
    "dw3 stride 2": (geo(2, 8, 40, 40, 8, 3, s=2, p=1, group=8), "dw-strips", "dw3-border"),
    "dw5 small map": (geo(1, 16, 14, 14, 16, 5, p=2, group=16), "dw-lanes", "dw-channels-last"),
    "dw5 stride 2": (geo(1, 8, 37, 35, 8, 5, s=2, p=2, group=8), "dw-strips", "dw-generic"),
    "dw5 stride 2 to 7x7, two images": (geo(2, 24, 14, 14, 24, 5, s=2, p=2, group=24), "dw-lanes", "dw-channels-last"),
    "dw3 stride 2 to 8x7, odd": (geo(1, 8, 15, 13, 8, 3, s=2, p=1, group=8), "dw-pairs", "dw-channels-last"),
    "dw7 stride 2 to 8x7, odd": (geo(1, 8, 15, 13, 8, 7, s=2, p=3, group=8), "dw-pairs", "dw-channels-last"),
    "dw7 stride 2 unpadded to 4x4": (geo(1, 16, 13, 13, 16, 7, s=2, group=16), "dw-lanes", "dw-channels-last"),
    "dw5 dilated": (geo(1, 8, 40, 40, 8, 5, p=4, group=8, d=2), "dw-strips", "dw-generic"),
    "dw7": (geo(1, 8, 23, 23, 8, 7, p=3, group=8), "dw-strips", "dw-generic"),
    "dw7 stride 2, unpadded": (geo(1, 8, 40, 40, 8, 7, s=2, group=8), "dw-strips", "dw-generic"),
    "dw 1x5 band on 14x14": (Geometry(1, 16, 14, 14, 16, 14, 14, 1, 5, 1, 1, 1, 1, 0, 2, 0, 2, 16), "dw-strips",
                             "dw-channels-last"),
    "dw 5x1 band on 40x40": (Geometry(1, 8, 40, 40, 8, 40, 40, 5, 1, 1, 1, 1, 1, 2, 0, 2, 0, 8), "dw-strips",
                             "dw-generic"),
    "dw4 small map": (geo(1, 16, 12, 12, 16, 4, p=1, group=16), "dw-channels-last", "dw-channels-last"),
    "dw4 large map": (geo(1, 8, 40, 40, 8, 4, p=1, group=8), "dw-generic", "dw-generic"),
    "3x3 dense": (geo(2, 16, 20, 20, 16, 3, p=1), "winograd", "blas-im2col"),
    "fc batch 1": (geo(1, 64, 1, 1, 32, 1), "matvec-lanes", "blas-rows"),
    "fc batch 1, 5 MB head": (geo(1, 1280, 1, 1, 1000, 1), "matvec", "blas-rows"),
    "fc many rows": (geo(64, 128, 1, 1, 128, 1), "row-gemm", "blas-rows"),
    "fc few rows": (geo(2, 16, 1, 1, 8, 1), "row-gemm", "blas-rows"),
    "1x1": (geo(1, 16, 20, 20, 32, 1), "pointwise", "blas-im2col"),
    "1x1 stride 2": (geo(2, 16, 20, 20, 24, 1, s=2), "pointwise", "blas-im2col"),
    "3x3 s2 to 7x7": (geo(1, 16, 14, 14, 32, 3, s=2, p=1), "im2col-oc", "blas-im2col"),
    # 7x7 maps with weights past L2, a 1x1 on a 7x7 map: float_gemm's 48-pixel tile and a 1-pixel tail
    "3x3 s2 to 7x7, weights past L2": (geo(1, 96, 14, 14, 96, 3, s=2, p=1), "im2col-implicit", "blas-im2col"),
    "1x1 on 7x7": (geo(1, 40, 7, 7, 24, 1), "pointwise", "blas-im2col"),
    "stem": (geo(1, 3, 64, 64, 16, 3, s=2, p=1), "im2col-in-place", "blas-im2col"),
    "3x3 s2 to 20 wide, few taps": (geo(1, 16, 40, 40, 24, 3, s=2, p=1), "im2col-wide", "blas-im2col"),
    "3x3 s2 to 56 wide": (geo(1, 8, 112, 112, 16, 3, s=2, p=1), "im2col-wide", "blas-im2col"),
    "5x5 dense": (geo(1, 32, 20, 20, 64, 5, p=2), "im2col-wide", "blas-im2col"),
    "3x3 s2, many taps": (geo(1, 144, 20, 20, 136, 3, s=2, p=1), "im2col-implicit", "blas-im2col"),
    # weights past L2, one thrown-away column of 11 against 8 channel blocks sharing a panel copy
    "3x3 s2, many taps, few channel blocks": (geo(1, 144, 20, 20, 64, 3, s=2, p=1), "im2col-wide", "blas-im2col"),
    # weights past L2 (104 x 672 floats): a kh x 1 window's planes are as wide as the output, so its taps are
    # read in place and it writes the output directly (no crop); its 1 x kw twin copies panels
    "7x1 past L2, two images": (Geometry(2, 96, 9, 11, 104, 9, 11, 7, 1, 1, 1, 1, 1, 3, 0, 3, 0, 1), "im2col-wide",
                                "blas-im2col"),
    "1x7 past L2": (Geometry(1, 96, 9, 11, 104, 9, 11, 1, 7, 1, 1, 1, 1, 0, 3, 0, 3, 1), "im2col-implicit",
                    "blas-im2col"),
    "patches 4x4/4, edges left over": (geo(2, 3, 30, 34, 24, 4, s=4), "patchify", "blas-im2col"),
    "patches 8x8/8 to 4x4 (tiny ViT)": (geo(1, 3, 32, 32, 64, 8, s=8), "patchify", "blas-im2col"),
    "grouped": (geo(2, 16, 10, 10, 16, 3, p=1, group=4), "grouped-in-place", "blas-im2col"),
    "grouped, 4 outputs a group, stride 2": (geo(1, 64, 29, 27, 128, 3, s=2, p=1, group=32), "grouped-in-place",
                                             "blas-im2col"),
    "grouped 1x1": (geo(1, 24, 9, 9, 48, 1, group=3), "grouped-in-place", "blas-im2col"),
    # 5 rows of the 29-wide planes: 145 pixels, the last one past whole tiles (channels in the lanes)
    "grouped, a pixel past whole tiles": (Geometry(1, 16, 5, 27, 40, 5, 27, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 4),
                                          "grouped-in-place", "blas-im2col"),
    "3x3 rate 12 on 16x16 (ASPP)": (geo(2, 24, 16, 16, 16, 3, p=12, d=12), "sparse-taps", "sparse-taps"),
    "3x3 rate 6 on 11x13": (geo(1, 8, 11, 13, 8, 3, p=6, d=6), "sparse-taps", "sparse-taps"),
}


# geometry -> strategy with AVX-512 under a fused activation past the ReLU bounds (a SiLU): the ones only
# such layers get (Strategy.post_only; none now: dw-pairs replaced dw-phased, at every activation)
POST_CASES: dict = {}


def test_every_strategy_has_a_case():
    covered = {name for _, fast, slow in CASES.values() for name in (fast, slow)}
    covered |= {fast for _, fast in POST_CASES.values()}
    assert covered == {s.name for s in STRATEGIES}


@pytest.mark.parametrize("case", list(CASES))
def test_pick(case):
    g, fast, slow = CASES[case]
    assert pick(g, avx512=True).name == fast
    assert pick(g, avx512=False).name == slow


def test_pick_leaves_row_depthwise_to_strips_under_a_fused_activation():
    """dw3-rows finishes each row under the activation's branch (spills); strips take layers with one."""
    g = CASES["dw3 wide map"][0]
    assert pick(g, avx512=True, post=False).name == "dw3-rows"
    assert pick(g, avx512=True, post=True).name == "dw-strips"


@pytest.mark.parametrize("case", list(POST_CASES))
def test_post_only_strategy_runs_layers_with_a_fused_activation(case):
    """Picked under a SiLU, not without one; its kernel (SiLU in its epilogue) matches torch."""
    from mnntool.runtime.kernels.micro.epilogue import POST_SILU
    g, fast = POST_CASES[case]
    if not HAS_AVX512:
        pytest.skip("this host has no AVX-512")
    assert pick(g, avx512=True, post=True).name == fast and pick(g, avx512=True, post=False).name != fast
    rng = np.random.default_rng(g.cin * g.h + g.kh)
    x = rng.standard_normal((g.n, g.cin, g.h, g.w)).astype(np.float32)
    w = (rng.standard_normal((g.cout, 1, g.kh, g.kw)) / g.kh).astype(np.float32)
    b = rng.standard_normal(g.cout).astype(np.float32)
    k = pick(g, avx512=True, post=True).build(g, Layer(w.reshape(g.cout, -1), b, 0, NO_GRID, 2, (POST_SILU, 0.0, 0.0)))
    y = np.full((g.n, g.cout, g.oh, g.ow), np.nan, np.float32)
    k.fn([x], [y])
    ref = F.silu(F.conv2d(F.pad(torch.from_numpy(x), (g.l, g.r, g.t, g.b)), torch.from_numpy(w), torch.from_numpy(b),
                          stride=(g.sh, g.sw), groups=g.group)).numpy()
    assert np.abs(y - ref).max() <= 5e-5 * np.abs(ref).max()


def _run(g: Geometry, strategy, act=RELU6, grid=NO_GRID, threads=2):
    rng = np.random.default_rng(g.cin * g.h + g.kh)
    x = rng.standard_normal((g.n, g.cin, g.h, g.w)).astype(np.float32)
    w = (rng.standard_normal((g.cout, g.cin // g.group, g.kh, g.kw)) / np.sqrt(g.cin * g.kh)).astype(np.float32)
    b = rng.standard_normal(g.cout).astype(np.float32)
    k = strategy.build(g, Layer(w.reshape(g.cout, -1), b, act, grid, threads))
    y = np.full((g.n, g.cout, g.oh, g.ow), np.nan, np.float32)
    k.fn([x], [y])
    ref = F.conv2d(F.pad(torch.from_numpy(x), (g.l, g.r, g.t, g.b)), torch.from_numpy(w), torch.from_numpy(b),
                   stride=(g.sh, g.sw), dilation=(g.dh, g.dw), groups=g.group)
    return torch.clamp(ref, 0, 6).numpy().astype(np.float64), y.astype(np.float64)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("avx512", [True, False])
def test_strategy_matches_torch(case, avx512):
    g, fast, slow = CASES[case]
    if avx512 and not HAS_AVX512:
        pytest.skip("this host has no AVX-512")
    ref, got = _run(g, pick(g, avx512))
    assert np.abs(got - ref).max() <= 5e-5 * np.abs(ref).max()


@pytest.mark.parametrize("case", ["7x1 past L2, two images", "3x3 s2, many taps, few channel blocks"])
@pytest.mark.parametrize("threads", [1, 4])
def test_wide_taps_past_l2_at_one_and_more_threads(case, threads):
    """At one thread these run in place (conv_grouped); with more threads than their tiles can keep busy,
    conv_im2col, which also splits the channel blocks."""
    g, fast, _ = CASES[case]
    if not HAS_AVX512:
        pytest.skip("this host has no AVX-512")
    ref, got = _run(g, pick(g), threads=threads)
    assert np.abs(got - ref).max() <= 5e-5 * np.abs(ref).max()


@pytest.mark.parametrize("case", ["dw3 tiny map", "dw5 stride 2 to 7x7, two images", "dw5 dilated", "dw4 large map", "fc batch 1", "1x1", "grouped",
                                  "3x3 rate 12 on 16x16 (ASPP)"])
def test_strategy_rounds_to_the_int8_grid(case):
    g, fast, _ = CASES[case]
    if not HAS_AVX512:
        fast = CASES[case][2]
    step = 0.05
    ref, got = _run(g, next(s for s in STRATEGIES if s.name == fast), grid=grid_of(step, -127, 127))
    on_grid = np.abs(got / step - np.rint(got / step))
    assert on_grid.max() < 1e-3
    assert np.abs(got - ref).max() <= step / 2 + 1e-4


def test_geometry_of_same_padding():
    c = {"kernelX": 3, "kernelY": 3, "strideX": 2, "strideY": 2, "padMode": "SAME", "group": 1}
    g = Geometry.of(c, (1, 4, 8, 9), (1, 4, 4, 5))
    assert (g.t, g.l, g.b, g.r) == (0, 1, 1, 1)     # odd totals put the extra row/column at the end


def test_fixture_convolutions_get_fast_kernels(fixture_model, tmp_path):
    """A strategy that raises falls back to the op's numpy definition (correct, ~10x slower): no
    convolution of the fixtures may end there."""
    from mnntool.api import convert, load_session
    convert(fixture_model("mobilenetv2"), tmp_path / "m.mnn")
    sess = load_session(tmp_path / "m.mnn", threads=1)
    sess.prepare({"input": (1, 3, 224, 224)})
    slow = [s.name for s in sess.plan.steps if s.op.startswith("Convolution")
            and "by_definition" in getattr(s.kernel.fn, "__qualname__", "")]
    assert not slow


@pytest.mark.parametrize("g, kept", [
    (geo(1, 8, 16, 16, 8, 3, p=24, d=24), (1, 1, 0, 0)),          # ASPP rate 24 on 16x16: its centre tap
    (geo(1, 8, 16, 16, 8, 3, p=36, d=36), (1, 1, 0, 0)),
    (geo(1, 8, 16, 16, 8, 3, p=12, d=12), (3, 3, 12, 12)),        # every tap reaches the map somewhere
    (geo(1, 4, 6, 9, 4, 5, s=2, p=6, d=3), None),                 # strided: trimmed where it is exact
    (geo(1, 6, 5, 5, 6, 3, p=8, d=8, group=6), (1, 1, 0, 0)),     # depthwise
])
def test_taps_reading_only_padding_are_dropped(g, kept):
    from mnntool.runtime.kernels.ops.conv_strategies import trimmed
    rng = np.random.default_rng(0)
    w = rng.standard_normal((g.cout, (g.cin // g.group) * g.kh * g.kw)).astype(np.float32)
    g2, w2 = trimmed(g, w)
    if kept is not None:
        assert (g2.kh, g2.kw, g2.t, g2.l) == kept
    assert (g2.oh, g2.ow) == (g.oh, g.ow) and min(g2.t, g2.l, g2.b, g2.r) >= 0
    g2.check(w2.size, "trimmed")
    x = rng.standard_normal((g.n, g.cin, g.h, g.w)).astype(np.float32)
    b = rng.standard_normal(g.cout).astype(np.float32)
    y = np.full((g.n, g.cout, g.oh, g.ow), np.nan, np.float32)
    pick(g2).build(g2, Layer(w2, b, 0, NO_GRID, 1)).fn([x], [y])
    ref = F.conv2d(F.pad(torch.from_numpy(x), (g.l, g.r, g.t, g.b)),
                   torch.from_numpy(w.reshape(g.cout, g.cin // g.group, g.kh, g.kw)), torch.from_numpy(b),
                   stride=(g.sh, g.sw), dilation=(g.dh, g.dw), groups=g.group).numpy()
    assert np.abs(y - ref).max() <= 5e-5 * np.abs(ref).max()


def _torch_post(kind, y, alpha, beta):
    from mnntool.runtime.kernels.micro import epilogue as gr
    return {gr.POST_SILU: F.silu, gr.POST_SIGMOID: torch.sigmoid, gr.POST_HARDSWISH: F.hardswish,
            gr.POST_GELU_TANH: lambda t: F.gelu(t, approximate="tanh"), gr.POST_GELU: F.gelu, gr.POST_TANH: torch.tanh,
            gr.POST_LEAKY: lambda t: F.leaky_relu(t, alpha), gr.POST_HARDSIGMOID: lambda t: torch.clamp(alpha * t + beta, 0, 1),
            gr.POST_CLIP: lambda t: torch.clamp(t, alpha, beta)}[kind](y)


@pytest.mark.parametrize("case", list(CASES))
def test_strategy_applies_a_fused_activation_like_torch(case):
    """Every strategy applies Layer.post after the bias and ReLU6: in its IR epilogue, or after its kernel
    (with_post). Reference: torch's conv2d, then torch's activation. Tolerance as above."""
    from mnntool.runtime.kernels.micro import epilogue as gr
    from mnntool.runtime.kernels.ops.conv_strategies import build
    g = CASES[case][0]
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((g.n, g.cin, g.h, g.w)) * 2).astype(np.float32)
    w = (rng.standard_normal((g.cout, g.cin // g.group, g.kh, g.kw)) / np.sqrt(g.cin * g.kh)).astype(np.float32)
    b = rng.standard_normal(g.cout).astype(np.float32)
    ref0 = F.conv2d(F.pad(torch.from_numpy(x), (g.l, g.r, g.t, g.b)), torch.from_numpy(w), torch.from_numpy(b),
                    stride=(g.sh, g.sw), dilation=(g.dh, g.dw), groups=g.group)
    for kind, alpha, beta, act in [(gr.POST_SILU, 0, 0, 0), (gr.POST_SIGMOID, 0, 0, 0), (gr.POST_HARDSWISH, 0, 0, 0),
                                   (gr.POST_GELU_TANH, 0, 0, 0), (gr.POST_GELU, 0, 0, 0), (gr.POST_TANH, 0, 0, 0),
                                   (gr.POST_LEAKY, 0.1, 0, 0), (gr.POST_HARDSIGMOID, 0.2, 0.5, 0),
                                   (gr.POST_CLIP, -1.5, 2.5, 0), (gr.POST_SILU, 0, 0, RELU6)]:
        y = np.full((g.n, g.cout, g.oh, g.ow), np.nan, np.float32)
        build(g, Layer(w.reshape(g.cout, -1), b, act, NO_GRID, 2, (kind, alpha, beta))).fn([x], [y])
        pre = torch.clamp(ref0, 0, 6) if act == RELU6 else ref0
        ref = _torch_post(kind, pre, alpha, beta).numpy()
        err = np.abs(y - ref).max()
        assert err <= 5e-5 * max(np.abs(ref).max(), 1), (kind, act, err)
