"""How a float convolution runs: one unit per strategy, each saying which layers it suits and how it
builds the kernel; the first in `STRATEGIES` that suits a layer's `Geometry` runs it (as MNN's
ConvolutionFloatFactory picks among its executions).

Every threshold below carries the measurement that set it (1 thread unless said otherwise; the
commit that introduced the strategy has the model-level numbers).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from . import Kernel, sized, writes
from .conv_loops import bias_act, depthwise, depthwise3x3, depthwise3x3_s1, depthwise_hwc, im2col
from .grid import NO_GRID, apply_act, to_grid
from .llvmir import host_has

HAS_AVX512 = host_has("avx512f")

# Maps up to this wide run the 3x3 depthwise as one flat pass per channel: a 7-wide row strip leaves
# 9 of the 16 lanes idle.
FLAT_DW_MAX_WIDTH = 8
# Channels-innermost depthwise up to this output width: rows of 14 and 7 are too short to vectorize,
# 16 channels are not (14x14 and 7x7 layers 2-4x faster; MobileNetV2 17.5 -> 15.1 ms).
CHANNELS_LAST_MAX_WIDTH = 16
# The padded-plane 3x3 depthwise (MobileNetV2's depthwise 6.0 -> 3.2 ms) was measured on 3x3 layers
# padded by 1 and maps from 7 wide; narrower maps and wider pads were left to the other kernels
# without a measurement of their own.
PLANE_DW_MAX_PAD, PLANE_DW_MIN_WIDTH = 2, 7
# Winograd F(4x4, 3x3) from 8 input and output channels: below that its transforms cost more than
# the multiplications they save.
WINOGRAD_MIN_CHANNELS = 8
# Implicit im2col reads its taps in place (no panel copy) for output rows from 32 wide whose packed
# weights fit L2 (256 KB): MobileNetV2's stem 0.43 -> 0.28 ms, ResNet-18's 2.9 -> 2.5 ms.
TAPS_IN_PLACE_MIN_WIDTH, L2_BYTES = 32, 256 * 1024


@dataclass(frozen=True)
class Geometry:
    """A convolution layer's shapes and window, all a strategy needs to decide."""
    n: int
    cin: int
    h: int
    w: int
    cout: int
    oh: int
    ow: int
    kh: int = 1
    kw: int = 1
    sh: int = 1
    sw: int = 1
    dh: int = 1
    dw: int = 1
    t: int = 0
    l: int = 0      # noqa: E741
    b: int = 0
    r: int = 0
    group: int = 1

    @classmethod
    def of(cls, c: dict, in_shape, out_shape) -> Geometry:
        """From MNN's Convolution2DCommon table and the NCHW input and output shapes."""
        n, cin, h, w = (int(d) for d in in_shape)
        _, cout, oh, ow = (int(d) for d in out_shape)
        kh, kw = c.get("kernelY", 1), c.get("kernelX", 1)
        sh, sw = c.get("strideY", 1), c.get("strideX", 1)
        dh, dw = c.get("dilateY", 1), c.get("dilateX", 1)
        pads = c.get("pads")
        if c.get("padMode") == "SAME":
            ph = max((oh - 1) * sh + dh * (kh - 1) + 1 - h, 0)
            pw = max((ow - 1) * sw + dw * (kw - 1) + 1 - w, 0)
            t, l, b, r = ph // 2, pw // 2, ph - ph // 2, pw - pw // 2
        elif c.get("padMode") == "VALID":
            t = l = b = r = 0
        elif pads is not None and len(pads) == 4:
            t, l, b, r = (int(p) for p in pads)
        else:
            t = b = c.get("padY", 0)
            l = r = c.get("padX", 0)
        return cls(n, cin, h, w, cout, oh, ow, kh, kw, sh, sw, dh, dw, t, l, b, r, c.get("group", 1) or 1)

    @property
    def window(self) -> tuple:
        """(kh, kw, sh, sw, dh, dw, t, l, b, r) as the Numba kernels take it."""
        return self.kh, self.kw, self.sh, self.sw, self.dh, self.dw, self.t, self.l, self.b, self.r

    @property
    def padded(self) -> bool:
        return bool(self.t or self.l or self.b or self.r)

    @property
    def depthwise(self) -> bool:
        return self.group == self.cin == self.cout and self.group > 1

    @property
    def k3(self) -> bool:
        """3x3, undilated, the same stride both ways."""
        return self.kh == self.kw == 3 and self.dh == self.dw == 1 and self.sh == self.sw

    @property
    def fully_connected(self) -> bool:
        """A matmul's rows as a 1x1 convolution on 1x1 maps."""
        return self.kh == self.kw == 1 and self.h == self.w == self.oh == self.ow == 1 and self.group == 1

    @property
    def one_by_one(self) -> bool:
        """1x1, unpadded, group 1: a GEMM on (every sh-th row and sw-th column of) the input."""
        return self.kh == self.kw == 1 and not self.padded and self.group == 1

    @property
    def out_size(self) -> int:
        return self.cout * self.oh * self.ow

    @property
    def weight_bytes(self) -> int:
        return self.cout * (self.cin // self.group) * self.kh * self.kw * 4


class Layer(NamedTuple):
    """What a strategy builds from besides the geometry."""
    weight: np.ndarray      # (cout, cin/group * kh * kw)
    bias: np.ndarray
    act: int                # grid.RELU / RELU6 / 0
    grid: tuple = NO_GRID   # the int8 grid the output is rounded to, or NO_GRID
    threads: int = 1


class Strategy:
    name = ""
    avx512 = False      # needs AVX-512

    def suits(self, g: Geometry) -> bool:
        raise NotImplementedError

    def build(self, g: Geometry, layer: Layer) -> Kernel:
        raise NotImplementedError


def _per_image(g: Geometry, one):
    """A kernel running `one(x_i, y_i)` over the batch."""
    def run(inputs, outputs):
        x, y = inputs[0], outputs[0]
        for i in range(g.n):
            one(x[i], y[i])
    return writes(run)


def _regrid(g: Geometry, layer: Layer):
    """Rounding to the output grid, for the paths whose own epilogue does not round."""
    rounding = sized(to_grid, g.n * g.out_size, layer.threads)

    def regrid(y):
        if layer.grid[1] > 0:
            flat = y.reshape(-1, y.shape[-1])
            rounding(flat, layer.grid, flat)
    return regrid


def _padder(g: Geometry):
    padded = np.zeros((g.cin, g.h + g.t + g.b, g.w + g.l + g.r), np.float32) if g.padded else None

    def pad(x):
        if padded is None:
            return x
        padded[:, g.t:g.t + g.h, g.l:g.l + g.w] = x
        return padded
    return pad


# ------------------------------------------------------------------------------------- depthwise
class FlatDepthwise3x3(Strategy):
    """Tiny stride-1 maps as one flat run per channel (dw3.depthwise3x3_flat)."""
    name, avx512 = "dw3-flat", True

    def suits(self, g):
        return (g.depthwise and g.k3 and g.sh == 1 and (g.oh, g.ow) == (g.h, g.w)
                and g.ow <= FLAT_DW_MAX_WIDTH)

    def build(self, g, layer):
        from . import dw3
        from .fgemm import epilogue_of
        w9, (epf, on_grid) = _dw_weights(g, layer).reshape(-1), epilogue_of(layer.act, layer.grid)
        masks, offs = dw3.flat_masks(g.h, g.w, g.t, g.l)
        flat = sized(dw3.depthwise3x3_flat, g.out_size * 9, layer.threads)
        return _per_image(g, lambda x, y: flat(x, w9, layer.bias, masks, offs, epf, on_grid, y))


class RowDepthwise3x3(Strategy):
    """Wide maps (from dw3.ROWS_FROM_WIDTH) row by row, stride 1 or 2 (dw3.depthwise3x3)."""
    name, avx512 = "dw3-rows", True

    def suits(self, g):
        from . import dw3
        return g.depthwise and g.k3 and g.sh in (1, 2) and g.w >= dw3.ROWS_FROM_WIDTH

    def build(self, g, layer):
        from . import dw3
        from .fgemm import epilogue_of
        w9, (epf, on_grid) = _dw_weights(g, layer).reshape(-1), epilogue_of(layer.act, layer.grid)
        rows = sized(dw3.depthwise3x3, g.out_size * 9, layer.threads)
        return _per_image(g, lambda x, y: rows(x, w9, layer.bias, g.sh, g.t, g.l, epf, on_grid, y))


class StripDepthwise3x3(Strategy):
    """Narrower maps in strips of 16 columns down dw3.STRIP_ROWS rows, stride 1 or 2."""
    name, avx512 = "dw3-strips", True

    def suits(self, g):
        return g.depthwise and g.k3 and g.sh in (1, 2)

    def build(self, g, layer):
        from . import dw3
        from .fgemm import epilogue_of
        w9, (epf, on_grid) = _dw_weights(g, layer).reshape(-1), epilogue_of(layer.act, layer.grid)
        strips, zrow = sized(dw3.depthwise3x3_strips, g.out_size * 9, layer.threads), np.zeros(g.w, np.float32)
        return _per_image(g, lambda x, y: strips(x, w9, layer.bias, g.sh, g.t, g.l, epf, on_grid, zrow,
                                                 dw3.STRIP_ROWS, y))


class PlaneDepthwise3x3(Strategy):
    """Stride 1 on a zero-bordered copy of each channel (conv.depthwise3x3_s1): branch-free rows."""
    name = "dw3-plane"

    def suits(self, g):
        return (g.depthwise and g.k3 and g.sh == 1 and max(g.t, g.l, g.b, g.r) <= PLANE_DW_MAX_PAD
                and g.ow >= PLANE_DW_MIN_WIDTH)

    def build(self, g, layer):
        xp = np.zeros((g.cin, max(g.h + g.t + g.b, g.oh + 2), max(g.w + g.l + g.r, g.ow + 2)), np.float32)
        wd = _dw_weights(g, layer)
        fn = sized(depthwise3x3_s1, g.out_size * 9, layer.threads)
        return _per_image(g, lambda x, y: fn(x, wd, layer.bias, g.t, g.l, xp, y, layer.act, layer.grid))


class ChannelsLastDepthwise(Strategy):
    """Small maps with the channels innermost (conv.depthwise_hwc), any kernel size."""
    name = "dw-channels-last"

    def suits(self, g):
        return g.depthwise and g.ow <= CHANNELS_LAST_MAX_WIDTH and g.sh == g.sw and g.dh == g.dw == 1

    def build(self, g, layer):
        xp = np.zeros((max(g.h + g.t + g.b, (g.oh - 1) * g.sh + g.kh), max(g.w + g.l + g.r, (g.ow - 1) * g.sw + g.kw),
                       g.cin), np.float32)
        yp = np.empty((g.oh, g.ow, g.cout), np.float32)
        wt = np.ascontiguousarray(_dw_weights(g, layer).reshape(g.cout, g.kh * g.kw).T)
        hwc = sized(depthwise_hwc, g.out_size * g.kh * g.kw, layer.threads)
        return _per_image(g, lambda x, y: hwc(x, wt, layer.bias, g.kh, g.kw, g.sh, g.t, g.l, xp, yp, y, layer.act,
                                              layer.grid))


class BorderDepthwise3x3(Strategy):
    """3x3, stride 1 or 2, padding read as zeros by checking the border taps (conv.depthwise3x3)."""
    name = "dw3-border"

    def suits(self, g):
        return g.depthwise and g.k3 and g.sh in (1, 2) and max(g.t, g.l, g.b, g.r) <= PLANE_DW_MAX_PAD

    def build(self, g, layer):
        zrow, wd = np.zeros(g.w, np.float32), _dw_weights(g, layer)
        fn = sized(depthwise3x3, g.out_size * 9, layer.threads)
        return _per_image(g, lambda x, y: fn(x, wd, layer.bias, g.sh, g.t, g.l, zrow, y, layer.act, layer.grid))


class GenericDepthwise(Strategy):
    """Any depthwise window on a padded copy (conv.depthwise)."""
    name = "dw-generic"

    def suits(self, g):
        return g.depthwise

    def build(self, g, layer):
        wd, pad, regrid = _dw_weights(g, layer), _padder(g), _regrid(g, layer)

        def run(inputs, outputs):
            x, y = inputs[0], outputs[0]
            for i in range(g.n):
                depthwise(pad(x[i]), wd, layer.bias, g.sh, g.sw, g.dh, g.dw, y[i], layer.act)
            regrid(y)
        return writes(run)


def _dw_weights(g: Geometry, layer: Layer) -> np.ndarray:
    return np.ascontiguousarray(layer.weight.reshape(g.cout, g.kh, g.kw))


# ------------------------------------------------------------------------------- dense and grouped
class Winograd3x3(Strategy):
    """Stride-1 3x3 group-1 layers by Winograd F(4x4, 3x3) or F(2x2, 3x3) (winograd.Winograd)."""
    name, avx512 = "winograd", True

    def suits(self, g):
        return (g.k3 and g.sh == 1 and g.group == 1 and g.cin >= WINOGRAD_MIN_CHANNELS
                and g.cout >= WINOGRAD_MIN_CHANNELS)

    def build(self, g, layer):
        from .winograd import Winograd
        wino = Winograd(layer.weight, layer.bias, g.cin, g.h, g.w, g.oh, g.ow, g.t, g.l, layer.act, layer.grid,
                        layer.threads)
        return _per_image(g, wino)


class MatVecRows(Strategy):
    """Batch 1 of a fully connected layer: weights streamed from memory 16 rows at once (gemv.MatVec)."""
    name, avx512 = "matvec", True

    def suits(self, g):
        return g.fully_connected and g.n == 1

    def build(self, g, layer):
        from .gemv import MatVec
        mv, regrid = MatVec(layer.weight.reshape(g.cout, g.cin), layer.bias, layer.act, layer.threads), _regrid(g, layer)

        def run(inputs, outputs):
            y = outputs[0].reshape(g.cout)
            mv(inputs[0].reshape(g.cin), y)
            regrid(y)
        return writes(run)


class PackedRows(Strategy):
    """Many rows of a fully connected layer (a transformer's tokens) on packed weights (linear.RowGemm)."""
    name, avx512 = "row-gemm", True

    def suits(self, g):
        from .linear import SMALL_GEMM
        return g.fully_connected and g.n * g.cin * g.cout >= SMALL_GEMM

    def build(self, g, layer):
        from .linear import RowGemm
        rows = RowGemm(layer.weight.reshape(g.cout, g.cin).T, layer.bias, layer.act, layer.grid, g.n, layer.threads)

        def run(inputs, outputs):
            rows(inputs[0].reshape(g.n, g.cin), outputs[0].reshape(g.n, g.cout))
        return writes(run)


class BlasRows(Strategy):
    """A fully connected layer as one BLAS matmul."""
    name = "blas-rows"

    def suits(self, g):
        return g.fully_connected

    def build(self, g, layer):
        wt, regrid = np.ascontiguousarray(layer.weight.T), _regrid(g, layer)

        def run(inputs, outputs):
            y = outputs[0].reshape(g.n, g.cout)
            np.matmul(inputs[0].reshape(g.n, g.cin), wt, out=y)
            y += layer.bias
            apply_act(y, layer.act)
            regrid(y)
        return writes(run)


class Pointwise(Strategy):
    """1x1 (strided: on every sh-th row and sw-th column) as one GEMM, channels-in-lanes (ocgemm) where
    its pixel count suits, else fgemm's packed tiles."""
    name, avx512 = "pointwise", True

    def suits(self, g):
        return g.one_by_one

    def build(self, g, layer):
        from .fgemm import PackedGemm
        from .ocgemm import OcGemm, suits
        pixels, subsample = g.oh * g.ow, g.sh > 1 or g.sw > 1
        packed = (OcGemm if suits(pixels, g.weight_bytes) else PackedGemm)(layer.weight, layer.bias, layer.act,
                                                                            layer.grid, pixels, layer.threads)
        picked = np.empty((g.cin, g.oh, g.ow), np.float32) if subsample else None

        def one(x, y):
            if subsample:
                np.copyto(picked, x[:, :(g.oh - 1) * g.sh + 1:g.sh, :(g.ow - 1) * g.sw + 1:g.sw])
            packed((picked if subsample else x).reshape(-1), pixels, y.reshape(-1), pixels)
        return _per_image(g, one)


class Im2colChannelsInLanes(Strategy):
    """Few output pixels (a 7x7 map): a small im2col matrix and the channels-in-lanes GEMM."""
    name, avx512 = "im2col-oc", True

    def suits(self, g):
        from .ocgemm import suits
        return g.group == 1 and suits(g.oh * g.ow, g.weight_bytes)

    def build(self, g, layer):
        from .ocgemm import OcGemm
        cols = np.empty((g.cin * g.kh * g.kw, g.oh * g.ow), np.float32)
        unfold = sized(im2col, cols.size, layer.threads)
        gemm = OcGemm(layer.weight, layer.bias, layer.act, layer.grid, g.oh * g.ow, layer.threads)
        pad = _padder(g)

        def one(x, y):
            unfold(pad(x), g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, g.oh, g.ow, cols)
            gemm(cols.reshape(-1), g.oh * g.ow, y.reshape(-1), g.oh * g.ow)
        return _per_image(g, one)


def _phases(g: Geometry, layer: Layer):
    """The packed weights and the input's phase planes (big enough for every tap of every output
    pixel; their zero border is the padding) that implicit im2col reads."""
    from .fgemm import PackedGemm, phase_split
    packed = PackedGemm(layer.weight, layer.bias, layer.act, layer.grid, g.oh * g.ow, layer.threads)
    hq = max(-(-(g.h + g.t + g.b) // g.sh), g.oh + (g.kh - 1) * g.dh // g.sh)
    wq = max(-(-(g.w + g.l + g.r) // g.sw), g.ow + (g.kw - 1) * g.dw // g.sw)
    phases = np.zeros((g.cin * g.sh * g.sw, hq, wq), np.float32)
    split = sized(phase_split, g.cin * g.h * g.w, layer.threads)
    return packed, phases, hq, wq, lambda x: split(x, g.t, g.l, g.sh, g.sw, phases)


class TapsInPlace(Strategy):
    """Implicit im2col whose tiles read the taps in place through an offset table (fgemm.conv_rows)."""
    name, avx512 = "im2col-in-place", True

    def suits(self, g):
        from .fgemm import OCB
        packed_bytes = -(-g.cout // OCB) * OCB * g.cin * g.kh * g.kw * 4
        return g.group == 1 and g.ow >= TAPS_IN_PLACE_MIN_WIDTH and packed_bytes <= L2_BYTES

    def build(self, g, layer):
        from .fgemm import conv_rows, tap_offsets
        packed, phases, hq, wq, split = _phases(g, layer)
        koff = tap_offsets(g.cin, g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, hq, wq)
        rows = sized(conv_rows, packed.rows() * g.oh * g.ow * g.cin * g.kh * g.kw // 16, layer.threads)

        def one(x, y):
            split(x)
            rows(phases, koff, g.oh, g.ow, wq, packed.wp, g.cin * g.kh * g.kw, g.cout, packed.bias, packed.epf,
                 packed.grid, y.reshape(-1))
        return _per_image(g, one)


class ImplicitIm2col(Strategy):
    """Group 1: tiles of fgemm.conv_im2col over the input's phase planes, no im2col matrix."""
    name, avx512 = "im2col-implicit", True

    def suits(self, g):
        return g.group == 1

    def build(self, g, layer):
        from .fgemm import conv_im2col
        packed, phases, hq, wq, split_phases = _phases(g, layer)
        # output-channel blocks split across threads when the pixel tiles alone leave threads idle
        split = min(packed.nob, -(-2 * layer.threads // packed.tiles)) if layer.threads > 1 else 1
        implicit = sized(conv_im2col, packed.rows() * g.oh * g.ow * g.cin * g.kh * g.kw // 16, layer.threads)

        def one(x, y):
            split_phases(x)
            implicit(phases, g.cin, g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, g.oh, g.ow, packed.wp, packed.kc, g.cout,
                     split, packed.bias, packed.epf, packed.grid, y.reshape(-1))
        return _per_image(g, one)


class BlasIm2col(Strategy):
    """Anything: an im2col matrix (none for 1x1) and BLAS's sgemm per group, then bias and activation."""
    name = "blas-im2col"

    def suits(self, g):
        return True

    def build(self, g, layer):
        cg, og = g.cin // g.group, g.cout // g.group
        pointwise = g.one_by_one and g.sh == g.sw == 1
        weight = layer.weight
        epilogue = sized(bias_act, g.out_size, layer.threads)
        wg = [np.ascontiguousarray(weight[k * og:(k + 1) * og]) for k in range(g.group)]
        cols = None if pointwise else np.empty((cg * g.kh * g.kw * g.group, g.oh * g.ow), np.float32)
        unfold = None if pointwise else sized(im2col, cols.size, layer.threads)
        pad = _padder(g)

        def one(x, y):
            yi = y.reshape(g.cout, g.oh * g.ow)
            if pointwise:
                np.matmul(weight, x.reshape(g.cin, g.h * g.w), out=yi)
            else:
                unfold(pad(x), g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, g.oh, g.ow, cols)
                if g.group == 1:
                    np.matmul(weight, cols, out=yi)
                else:
                    rows = cg * g.kh * g.kw
                    for k in range(g.group):
                        np.matmul(wg[k], cols[k * rows:(k + 1) * rows], out=yi[k * og:(k + 1) * og])
            epilogue(yi, layer.bias, layer.act, layer.grid)
        return _per_image(g, one)


# In order of preference: the first that suits a layer runs it.
STRATEGIES: list[Strategy] = [
    FlatDepthwise3x3(), RowDepthwise3x3(), StripDepthwise3x3(), PlaneDepthwise3x3(), ChannelsLastDepthwise(),
    BorderDepthwise3x3(), GenericDepthwise(),
    Winograd3x3(), MatVecRows(), PackedRows(), BlasRows(), Pointwise(), Im2colChannelsInLanes(), TapsInPlace(),
    ImplicitIm2col(), BlasIm2col(),
]


def pick(g: Geometry, avx512: bool = HAS_AVX512) -> Strategy:
    return next(s for s in STRATEGIES if (avx512 or not s.avx512) and s.suits(g))
