"""Dense and grouped strategies: Winograd, the fully connected forms (matvec, packed rows, BLAS), 1x1
GEMMs, im2col on the channels-in-lanes GEMM, implicit im2col (taps in place or tiled), and BLAS im2col
for anything else."""
from __future__ import annotations

import numpy as np

from ... import Scratch, direct, sized, writes
from ...micro import float_gemm, few_pixel_gemm
from ...micro.conv_loops import bias_act, im2col, patches
from ...micro.epilogue import apply_act
from ...micro.float_gemm import (OCB, PackedGemm, conv_grouped, conv_im2col, conv_rows, epilogue_of, fitted,
                                 tail_pixels, tap_offsets)
from ...micro.few_pixel_gemm import OcGemm
from ...weight_cache import packed_once, shape_free
from .base import (COLS, Geometry, Layer, Strategy, on_wide_rows, padder, per_image, phase_splitter,
                   regrid_of)

# Winograd F(4x4, 3x3) from 8 input and output channels: below that its transforms cost more than
# the multiplications they save.
WINOGRAD_MIN_CHANNELS = 8
# Implicit im2col reads its taps in place (no panel copy) for output rows from 32 wide whose packed
# weights fit L2 (256 KB): MobileNetV2's stem 0.43 -> 0.28 ms, ResNet-18's 2.9 -> 2.5 ms; narrower rows
# too up to WIDE_TAPS_MAX_K taps (WideTapsInPlace).
TAPS_IN_PLACE_MIN_WIDTH, L2_BYTES, WIDE_TAPS_MAX_K = 32, 256 * 1024, 1152
# conv_im2col's panel copy costs about this many channel blocks' (8 output channels) share of the multiply
# per tile (fitted on five layers, WideTapsInPlace): the in-place taps win when the thrown-away columns,
# (wq - ow) / ow of the work, cost less than WIDE_COPY_BLOCKS / (channel blocks)
WIDE_COPY_BLOCKS = 1.5



# A dilated layer whose (tap, output pixel) pairs read the input at most this often (else padding) runs
# tap by tap on the pixels each tap reaches (SparseTaps): DeepLabV3's ASPP 3x3 at rate 12 on a 16x16 map
# reads the input in 25% of them, and implicit im2col multiplied the other 75% zeros: 7.2 ms of 27.
SPARSE_TAPS_MAX_DENSITY = 0.5


def tap_regions(g: Geometry) -> list:
    """Per tap (i, j) that reads the input: (i, j, output rows y0:y1, columns x0:x1, the input row and
    column of (y0, x0)); stride 1."""
    out = []
    for i in range(g.kh):
        y0, y1 = max(0, g.t - i * g.dh), min(g.oh, g.h + g.t - i * g.dh)
        for j in range(g.kw):
            x0, x1 = max(0, g.l - j * g.dw), min(g.ow, g.w + g.l - j * g.dw)
            if y1 > y0 and x1 > x0:
                out.append((i, j, y0, y1, x0, x1, y0 - g.t + i * g.dh, x0 - g.l + j * g.dw))
    return out


class SparseTaps(Strategy):
    """A dilated group-1 layer on a map not much larger than its dilation: each tap that reads the input
    is one (Cout x Cin) @ (Cin x pixels it reaches) product added into its output rectangle, so no
    product with the padding is made."""
    name = "sparse-taps"

    def suits(self, g):
        if g.group != 1 or g.sh != 1 or g.sw != 1 or (g.dh == 1 and g.dw == 1):
            return False
        reached = sum((y1 - y0) * (x1 - x0) for *_, y0, y1, x0, x1, _, _ in tap_regions(g))
        return reached <= SPARSE_TAPS_MAX_DENSITY * g.kh * g.kw * g.oh * g.ow

    def build(self, g, layer):
        w = layer.weight.reshape(g.cout, g.cin, g.kh, g.kw)
        taps = [(np.ascontiguousarray(w[:, :, i, j]), y0, y1, x0, x1, iy, ix)
                for i, j, y0, y1, x0, x1, iy, ix in tap_regions(g)]
        bias, regrid = layer.bias.reshape(-1, 1, 1), regrid_of(g, layer)

        def one(x, y):
            y[...] = bias
            for wt, y0, y1, x0, x1, iy, ix in taps:
                src = x[:, iy:iy + y1 - y0, ix:ix + x1 - x0].reshape(g.cin, -1)
                y[:, y0:y1, x0:x1] += (wt @ src).reshape(g.cout, y1 - y0, x1 - x0)
            apply_act(y, layer.act)
            regrid(y)
        return per_image(g, one)


class Winograd3x3(Strategy):
    """Stride-1 3x3 group-1 layers by Winograd F(4x4, 3x3) or F(2x2, 3x3) (winograd.Winograd)."""
    name, avx512, fuses_post = "winograd", True, True

    def suits(self, g):
        return (g.k3 and g.sh == 1 and g.group == 1 and g.cin >= WINOGRAD_MIN_CHANNELS
                and g.cout >= WINOGRAD_MIN_CHANNELS)

    def build(self, g, layer):
        from ...micro.winograd import Winograd
        wino = Winograd(layer.weight, layer.bias, g.cin, g.h, g.w, g.oh, g.ow, g.t, g.l, layer.act, layer.grid,
                        layer.threads, layer.post)
        return per_image(g, wino)


class MatVecRows(Strategy):
    """Batch 1 of a fully connected layer: weights streamed from memory 16 rows at once (float_gemv.MatVec)."""
    name, avx512 = "matvec", True

    def suits(self, g):
        return g.fully_connected and g.n == 1

    def build(self, g, layer):
        from ...micro.float_gemv import MatVec
        mv, regrid = MatVec(layer.weight.reshape(g.cout, g.cin), layer.bias, layer.act, layer.threads), regrid_of(g, layer)

        def run(inputs, outputs):
            y = outputs[0].reshape(g.cout)
            mv(inputs[0].reshape(g.cin), y)
            regrid(y)
        return writes(run)


class PackedRows(Strategy):
    """Many rows of a fully connected layer (a transformer's tokens) on packed weights (linear.RowGemm),
    a fused activation (GELU after fc1) in its epilogue."""
    name, avx512, fuses_post = "row-gemm", True, True

    def suits(self, g):
        """Every size of more than one row: called without Numba's dispatch (kernels.direct) a pack and a
        GEMM cost less than BLAS's matmul and the bias pass at every measured size (1 thread, us: 4x32x32
        1.26 against 1.33, 16x64x64 2.07/2.37, 17x64x64 2.51/2.47, 16x64x128 2.95/3.41, 50x128x128
        12.8/14.3), before a fused GELU, which BLAS leaves to a pass of its own."""
        return g.fully_connected and g.n > 1

    def build(self, g, layer):
        from ..linear import RowGemm
        rows = RowGemm(layer.weight.reshape(g.cout, g.cin).T, layer.bias, layer.act, layer.grid, g.n, layer.threads,
                       layer.post)
        return writes(rows.step())


class BlasRows(Strategy):
    """A fully connected layer as one BLAS matmul."""
    name = "blas-rows"

    def suits(self, g):
        return g.fully_connected

    def build(self, g, layer):
        wt, regrid = np.ascontiguousarray(layer.weight.T), regrid_of(g, layer)

        def run(inputs, outputs):
            y = outputs[0].reshape(g.n, g.cout)
            np.matmul(inputs[0].reshape(g.n, g.cin), wt, out=y)
            y += layer.bias
            apply_act(y, layer.act)
            regrid(y)
        return writes(run)


# A 3x3/2 (or any im2col) layer to a 7x7 map (49..56 pixels) that the in-place taps do not take (weights past
# L2 and more than 80 output channels) runs conv_im2col, on float_gemm's 48-pixel tile and its tail
# (float_gemm.TAIL_FROM), not an im2col matrix and few_pixel_gemm's channels-in-lanes GEMM. 1 thread, ms
# im2col-oc -> im2col-implicit: whole layer models, Intel Xeon (tmp_dev/xgemm/abs.py AB=tails) 512->512
# 14->7 2.711 -> 2.567, 256->512 1.913 -> 1.613; strategies alone, AMD EPYC (exp2.py) 512->512 2.971 ->
# 2.713, 160->160 0.381 -> 0.280. A 1x1 on a 7x7 map stays on
# few_pixel_gemm: float_gemm's tail tied it there on the Xeon (kernels alone 1.174 / 1.140 ms at 2048->512,
# 1.125 / 1.130 at 512->2048) and lost 10% in the whole-layer models (won 3-16% on the EPYC).
# Overridable (benchmarks flip it).
TAILED_TILES = True


def _tailed(pixels: int) -> bool:
    """float_gemm runs this many pixels as whole 48-pixel tiles and a tail (7x7 maps)."""
    return TAILED_TILES and 48 < pixels <= 64 and tail_pixels.py_func(pixels) > 0


def _one_gemm(g: Geometry, layer: Layer, pixels: int):
    """The layer's weights packed for one GEMM over `pixels` columns: channels-in-lanes (few_pixel_gemm) where the
    pixel count suits it, else float_gemm's packed tiles."""
    gemm = OcGemm if few_pixel_gemm.suits(pixels, g.weight_bytes) else PackedGemm
    return gemm(layer.weight, layer.bias, layer.act, layer.grid, pixels, layer.threads, layer.post)


class Pointwise(Strategy):
    """1x1 (strided: on every sh-th row and sw-th column) as one GEMM, channels-in-lanes (few_pixel_gemm) where
    its pixel count suits, else float_gemm's packed tiles."""
    name, avx512, fuses_post = "pointwise", True, True

    def suits(self, g):
        return g.one_by_one

    def build(self, g, layer):
        pixels, subsample = g.oh * g.ow, g.sh > 1 or g.sw > 1
        packed = _one_gemm(g, layer, pixels)
        picked_of = Scratch(COLS, (g.cin, g.oh, g.ow)) if subsample else None

        def one(x, y):
            if subsample:
                picked = picked_of()
                np.copyto(picked, x[:, :(g.oh - 1) * g.sh + 1:g.sh, :(g.ow - 1) * g.sw + 1:g.sw])
            packed((picked if subsample else x).reshape(-1), pixels, y.reshape(-1), pixels)
        return per_image(g, one)


class Patchify(Strategy):
    """Kernel equal to stride, no padding (a ViT's patch embedding): the patches are the columns of an
    im2col matrix made by one strided copy, then one GEMM as `Pointwise`. The implicit im2col copied a
    panel per 48-pixel tile from phase planes: ViT-tiny's 16x16/16 embedding took 0.49 ms (0.43 ms this
    way with BLAS), a tiny ViT's 8x8/8 on a 32x32 image 15.5 us (7.5)."""
    name, avx512, fuses_post = "patchify", True, True

    def suits(self, g):
        return (g.group == 1 and g.kh == g.sh and g.kw == g.sw and g.kh * g.kw > 1 and g.dh == g.dw == 1 and
                not g.padded)

    def build(self, g, layer):
        pixels = g.oh * g.ow
        packed = _one_gemm(g, layer, pixels)
        cols_of = Scratch(COLS, (g.cin, g.kh, g.kw, g.oh, g.ow))
        copy = direct(patches, np.empty((g.cin, g.h, g.w), np.float32), g.kh, g.kw, g.oh, g.ow, cols_of())

        def one(x, y):
            cols = cols_of()
            copy(np.ascontiguousarray(x), g.kh, g.kw, g.oh, g.ow, cols)
            packed(cols.reshape(-1), pixels, y.reshape(-1), pixels)
        return per_image(g, one)


class Im2colChannelsInLanes(Strategy):
    """Few output pixels (a 7x7 map): a small im2col matrix and the channels-in-lanes GEMM."""
    name, avx512, fuses_post = "im2col-oc", True, True

    def suits(self, g):
        if g.group != 1 or not few_pixel_gemm.suits(g.oh * g.ow, g.weight_bytes):
            return False
        # 7x7 maps go to conv_im2col (TAILED_TILES) unless the in-place taps would take them (not measured
        # against this: they stay)
        return not _tailed(g.oh * g.ow) or WideTapsInPlace().suits(g)

    def build(self, g, layer):
        cols_of = Scratch(COLS, (g.cin * g.kh * g.kw, g.oh * g.ow))
        unfold = sized(im2col, g.cin * g.kh * g.kw * g.oh * g.ow, layer.threads)
        gemm = OcGemm(layer.weight, layer.bias, layer.act, layer.grid, g.oh * g.ow, layer.threads, layer.post)
        pad = padder(g)

        def one(x, y):
            cols = cols_of()
            unfold(pad(x), g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, g.oh, g.ow, cols)
            gemm(cols.reshape(-1), g.oh * g.ow, y.reshape(-1), g.oh * g.ow)
        return per_image(g, one)


def _phases(g: Geometry, layer: Layer):
    """The packed weights and the input's phase planes (base.phase_splitter) that implicit im2col reads."""
    packed = PackedGemm(layer.weight, layer.bias, layer.act, layer.grid, g.oh * g.ow, layer.threads, layer.post)
    hq, wq = g.phase_planes
    return packed, hq, wq, phase_splitter(g, layer.threads)


def _packed_fits_l2(g: Geometry) -> bool:
    return g.group == 1 and -(-g.cout // OCB) * OCB * g.cin * g.kh * g.kw * 4 <= L2_BYTES


class TapsInPlace(Strategy):
    """Implicit im2col whose tiles read the taps in place through an offset table (float_gemm.conv_rows),
    tiles of up to 48 pixels inside one output row: rows from 32 wide whose last 16-lane vector is more
    than half full (a 56-wide row's last tile of 8 lanes walked every tap for half a vector:
    WideTapsInPlace takes those; SqueezeNet's 111-wide stem rows stay here: the model 1.4% faster so)."""
    name, avx512, fuses_post = "im2col-in-place", True, True

    def suits(self, g):
        return _packed_fits_l2(g) and g.ow >= TAPS_IN_PLACE_MIN_WIDTH and (g.ow % 16 == 0 or g.ow % 16 > 8)

    def build(self, g, layer):
        packed, hq, wq, split = _phases(g, layer)
        koff = tap_offsets(g.cin, g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, hq, wq)
        rows = fitted(conv_rows, packed.rows() * g.oh * g.ow * g.cin * g.kh * g.kw // 16, layer.threads)

        def one(x, y):
            phases = split(x)
            rows(phases, koff, g.oh, g.ow, wq, packed.wp, g.cin * g.kh * g.kw, g.cout, packed.bias, packed.epf,
                 packed.grid, y.reshape(-1))
        return per_image(g, one)


class WideTapsInPlace(Strategy):
    """Implicit im2col with the taps read in place on the phase planes' width (float_gemm.conv_grouped, one
    group): tiles of 48 run across output rows, so a row's last pixels are not a part-empty tile of their
    own and narrow rows fill whole tiles; the thrown-away columns (wq - ow a row) are cropped after. For
    rows that end in a vector at most half full, and for rows under 32 wide up to WIDE_TAPS_MAX_K taps, where
    conv_im2col copied a panel per tile. Measured (1 thread, ms): MobileNetV4's 32->32 3x3/2 to 56x56,
    in the model, 0.78 -> 0.73 (conv_rows); against conv_im2col, the two kernels alone in turns: 3x3/2 to
    28x28 128->32 0.96 -> 0.76, 64->64 0.73 -> 0.65, 128->64 1.49 -> 1.31, 128->128 (weights past L2)
    2.64 -> 2.45, to 14x14 96->96 0.42 -> 0.38, 64->32 0.12 -> 0.09, 5x5 on 28x28 32->32 0.52 -> 0.42;
    even at 2304 taps (256->256 to 14x14, 2.59 both), where conv_im2col's k blocks and its channel split
    across threads stay. Not for rows of (nearly) whole vectors: the crop of a 3x3/2 stem's 32 x 112 x 113 output
    cost more than conv_rows' tails (0.51 -> 0.57 ms in the model).
    At any weight size where the thrown-away columns cost less than conv_im2col's panel copies, which every
    channel block of a tile shares (WIDE_COPY_BLOCKS); planes as wide as the output (a kh x 1 window) throw
    nothing away and write the output in place. Kernels alone, 1 thread, ms conv_im2col -> here: 7x1 on
    17x17 192->192 1.67 -> 1.56, 128->128 0.74 -> 0.66, 3x1 on 8x8 384->384 0.60 -> 0.55, 3x3/2 56 -> 28
    128->128 2.68 -> 2.34, 5x5 on 35x35 48->64 2.15 -> 2.03; conv_im2col kept: 3x3/2 to 14x14 256->256 2.70 /
    2.74, 288->384 to 17x17 6.26 / 6.65, 1x7 on 17x17 (6 of 23 columns thrown away) 1.70 / 2.04."""
    name, avx512, fuses_post = "im2col-wide", True, True

    def suits(self, g):
        return self._cheaper_than_copies(g) or self._small(g)

    @staticmethod
    def _cheaper_than_copies(g):
        return g.group == 1 and (g.phase_planes[1] - g.ow) * -(-g.cout // 8) <= WIDE_COPY_BLOCKS * g.ow

    @staticmethod
    def _small(g):
        return _packed_fits_l2(g) and (g.ow >= TAPS_IN_PLACE_MIN_WIDTH or g.cin * g.kh * g.kw <= WIDE_TAPS_MAX_K)

    def build(self, g, layer):
        # conv_grouped splits only the pixel tiles across threads; conv_im2col also splits the channel blocks
        # when the tiles leave threads idle: there, the layers this strategy takes for the copies it saves
        # (measured at one thread) stay with conv_im2col
        tiles = -(-g.oh * g.phase_planes[1] // 48)
        if layer.threads > 1 and tiles < 2 * layer.threads and not self._small(g):
            return ImplicitIm2col().build(g, layer)
        return GroupedTapsInPlace().build(g, layer)


class ImplicitIm2col(Strategy):
    """Group 1: tiles of float_gemm.conv_im2col over the input's phase planes, no im2col matrix."""
    name, avx512, fuses_post = "im2col-implicit", True, True

    def suits(self, g):
        return g.group == 1

    def build(self, g, layer):
        packed, hq, wq, split_phases = _phases(g, layer)
        koff = tap_offsets(g.cin, g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, hq, wq)
        # output-channel blocks split across threads when the pixel tiles alone leave threads idle
        split = min(packed.nob, -(-2 * layer.threads // packed.tiles)) if layer.threads > 1 else 1
        implicit = fitted(conv_im2col, packed.rows() * g.oh * g.ow * g.cin * g.kh * g.kw // 16, layer.threads)

        def one(x, y):
            phases = split_phases(x)
            implicit(phases, koff, koff.size, g.oh, g.ow, packed.wp, packed.kc, g.cout, split, packed.bias,
                     packed.epf, packed.grid, y.reshape(-1))
        return per_image(g, one)


def _pack_groups(weight: np.ndarray, group: int) -> np.ndarray:
    """Each group's rows packed for float_gemm (pack_weights), one group after the other: read-only, shared
    by the plans of every input shape (weight_cache)."""
    og = weight.shape[0] // group
    return np.concatenate([float_gemm.pack_weights(weight[k * og:(k + 1) * og]) for k in range(group)])


def _grouped_parts(group: int, layer: Layer) -> tuple:
    """GroupedTapsInPlace's packed weights, each group's bias padded to whole channel blocks, its epilogue."""
    og = layer.weight.shape[0] // group
    bias = np.zeros((group, -(-og // OCB) * OCB), np.float32)
    bias[:, :og] = layer.bias.reshape(group, og)
    return (packed_once(_pack_groups, layer.weight, group), bias.reshape(-1)) + epilogue_of(layer.act, layer.grid,
                                                                                            layer.post)


class GroupedTapsInPlace(Strategy):
    """Grouped, not depthwise (RegNet, ResNeXt): each group's taps read in place from the phase planes
    on the planes' width (float_gemm.conv_grouped), every group's tiles in one parallel loop, then the
    output cropped to its width."""
    name, avx512, fuses_post = "grouped-in-place", True, True

    def suits(self, g):
        return g.group > 1 and not g.depthwise

    def build(self, g, layer):      # also WideTapsInPlace's, at one group
        cg, og = g.cin // g.group, g.cout // g.group
        # what the input shape does not change, kept per layer while the session plans (weight_cache.shape_free)
        wp, bias, epf, on_grid = shape_free("grouped", layer.weight, (layer.bias, layer.grid, layer.post),
                                            (layer.act, g.group), lambda: _grouped_parts(g.group, layer))
        hq, wq = g.phase_planes
        koff = tap_offsets(cg, g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, hq + 1, wq)     # planes with the spare row
        k = cg * g.kh * g.kw
        fn = fitted(conv_grouped, g.cout * g.oh * wq * k, layer.threads)
        planes = cg * g.sh * g.sw * (hq + 1) * wq
        return on_wide_rows(g, layer.threads, lambda phases, wide: fn(phases, koff, g.group, planes, g.oh * wq, wp, k,
                                                                      og, bias, epf, on_grid, wide.reshape(-1)))


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
        pad = padder(g)

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
        return per_image(g, one)
