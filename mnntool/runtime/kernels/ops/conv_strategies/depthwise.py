"""Depthwise strategies: the AVX-512 3x3 kernels of micro/depthwise3x3.py (flat, rows, strips), then the Numba loops
(padded plane, channels innermost, border-checking rows, any window)."""
from __future__ import annotations

import numpy as np

from ... import Scratch, SharedZeros, sized, writes
from ...micro import depthwise3x3 as dw3x3, depthwise_lanes, depthwise_pairs, depthwise_strips
from ...micro.conv_loops import depthwise, depthwise3x3, depthwise3x3_s1, depthwise_hwc
from ...micro.float_gemm import epilogue_of
from ...weight_cache import packed_once, shape_free
from .base import Geometry, Layer, Strategy, padder, per_image, regrid_of

# Maps up to this wide run the depthwise as one flat pass per channel: a 7-wide row strip leaves
# 9 of the 16 lanes idle.
FLAT_DW_MAX_WIDTH = 8
# Channels-innermost depthwise up to this output width: rows of 14 and 7 are too short to vectorize,
# 16 channels are not (14x14 and 7x7 layers 2-4x faster; MobileNetV2 17.5 -> 15.1 ms).
CHANNELS_LAST_MAX_WIDTH = 16
# The padded-plane 3x3 depthwise (MobileNetV2's depthwise 6.0 -> 3.2 ms) was measured on 3x3 layers
# padded by 1 and maps from 7 wide; narrower maps and wider pads were left to the other kernels
# without a measurement of their own.
PLANE_DW_MAX_PAD, PLANE_DW_MIN_WIDTH = 2, 7
# Stride-2 depthwise layers to maps at most 8 wide run in row pairs (PairedRowsDepthwise), which replaced the
# phase-plane kernel (dw-phased, 5x5/7x7 under a fused activation): kernels alone in turns, 1 thread, AMD EPYC,
# with SiLU 672 channels 5x5 14->7 63 us against 79 phased and 83 strips, 256 of 7x7 48 / 82 / 57; without
# 45 / 59 / 53.
# Channels in the lanes (LanesDepthwise) to output rows this wide, from this many channels: kernels alone in
# turns, 1 thread, AMD EPYC (Zen 4), us, lanes / the kernel it replaced: 768 channels 3x3 on 14x14 62-70 / 84
# (strips), with SiLU 113 / 156; 672 5x5 on 14x14 92 / 136 (strips); 1248 3x3 on 7x7 34 / 40 (flat); 1152 5x5
# on 7x7 43 / 86 (flat); 576 3x3 14->7 25 / 39 (pairs); 672 5x5 14->7 46 / 75 (pairs); 256 7x7 14->7 21 / 62
# (pairs); 1280 3x3 on 4x4 16 / 39 (flat); on 28x28 (strips): 240 5x5 127 / 167, 128 7x7 114 / 153, 72 3x3
# 28 / 35, 32 3x3 13 / 18; 144 5x5 56->28 123 / 162, 144 3x3 56->28 96 / 100. At 56 wide strips win (72 3x3
# 97 / 88, 48 3x3 112->56 141 / 115). In the model 3x3 layers on 28x28 lost what they won alone (ese_vovnet19b_dw's
# 160 channels 3x3 on 28x28 after its 1x1 reduction: 72-74 -> 92-97 us, min of 20 runs), so 3x3 stays to 14.
# With 8 channels (half the lanes idle) flat and pairs stay ahead by ~0.3 us.
LANES_MAX_WIDTH, LANES_MAX_WIDTH_3X3, LANES_MIN_CHANNELS = 28, 14, 16
# Strips go down blocks of this many output rows (their input rows stay in L1 across the strips).
STRIP_ROWS = 8


class LanesDepthwise(Strategy):
    """Small maps with 16 channels in the vector lanes (depthwise_lanes): each block of 16 channels
    transposed into an L1 scratch, whole-vector FMAs, transposed back; 3x3/5x5/7x7, stride 1 or 2, output
    rows at most LANES_MAX_WIDTH wide (3x3: LANES_MAX_WIDTH_3X3)."""
    name, avx512, fuses_post = "dw-lanes", True, True

    def suits(self, g):
        if not g.depthwise:
            return False
        return (g.depthwise and g.kh == g.kw and g.kh in depthwise_lanes.SIZES and g.sh == g.sw
                and g.sh in depthwise_lanes.STRIDES and g.dh == g.dw == 1
                and g.ow <= (LANES_MAX_WIDTH_3X3 if g.kh == 3 else LANES_MAX_WIDTH)
                and g.cin >= LANES_MIN_CHANNELS)

    def build(self, g, layer):
        L = depthwise_lanes
        k, s = g.kh, g.sh
        # packed once per weights, the bias in lanes and the epilogue kept per layer (not again for each new
        # input shape's plan: weight_cache.shape_free)
        wl, bt, epf, on_grid = shape_free(
            "dw-lanes", layer.weight, (layer.bias, layer.grid, layer.post), (layer.act, k, g.cout),
            lambda: (packed_once(L.lanes_weights, dw_weights(g, layer).reshape(g.cout, k * k), k),
                     L.lanes_bias(layer.bias)) + epilogue_of(layer.act, layer.grid, layer.post))
        inpos, pw, nin, nout = L.tables(g.h, g.w, k, s, g.t, g.l, g.oh, g.ow)
        chunks = L.chunks_of(g.cin, g.oh, layer.threads)
        # the scratch of the thread, not the layer's: one per layer was cold at every run (ese_vovnet19b_dw's
        # 192 channels 3x3 on 14x14: 18 us warm, 38 in the run); the input's keeps its zero border per geometry
        xt_of = SharedZeros(("dw-lanes", g.h, g.w, k, s, g.t, g.l, g.oh, g.ow), (chunks, nin * 16))
        yt_of = Scratch("dw_lanes_out", (chunks, nout * 16))
        fn = sized(L.depthwise_lanes, g.out_size * k * k, layer.threads)
        return per_image(g, lambda x, y: fn(x, wl, bt, k, s, inpos, pw, epf, on_grid, xt_of(), yt_of(), y))


class FlatDepthwise(Strategy):
    """Tiny stride-1 maps as one flat run per channel (depthwise3x3.depthwise_flat), 3x3, 5x5 or 7x7: a 7-wide row
    leaves 9 of a strip's 16 lanes idle, a flat 7x7 map 15 of 64 (EfficientNet-B0's 1152 channels of
    5x5 on 7x7 with SiLU, alone: strips 124-150 us, flat 83; in the model 0.18 -> 0.12 ms)."""
    name, avx512, fuses_post = "dw-flat", True, True

    def suits(self, g):
        if not g.depthwise:
            return False
        return (g.depthwise and g.kh == g.kw and g.kh in dw3x3.FLAT_SIZES and g.sh == g.sw == 1
                and g.dh == g.dw == 1 and (g.oh, g.ow) == (g.h, g.w) and g.ow <= FLAT_DW_MAX_WIDTH)

    def build(self, g, layer):
        wk, (epf, on_grid) = dw_weights(g, layer).reshape(-1), _epilogue(layer)
        masks, offs = dw3x3.flat_masks(g.h, g.w, g.t, g.l, g.kh)
        flat = sized(dw3x3.depthwise_flat, g.out_size * g.kh * g.kw, layer.threads)
        return per_image(g, lambda x, y: flat(x, wk, layer.bias, g.kh, masks, offs, epf, on_grid, y))


class PairedRowsDepthwise(Strategy):
    """Stride 2 to maps at most 8 wide, 3x3/5x5/7x7, two output rows a vector (depthwise_pairs): kernels
    alone in turns, 1 thread, AMD EPYC: 576 channels 3x3 14->7 34.5 us against 43.3 in strips, 672 of 5x5
    72 / 95 (with SiLU 106 / 139), 240 of 5x5 16->8 28.5 / 39; at stride 1 flat stays ahead (7x7: 82 / 106)."""
    name, avx512, fuses_post = "dw-pairs", True, True

    def suits(self, g):
        if not g.depthwise:
            return False
        return (g.depthwise and g.kh == g.kw and g.kh in depthwise_pairs.SIZES and g.sh == g.sw == 2
                and g.dh == g.dw == 1 and g.ow <= depthwise_pairs.MAX_WIDTH)

    def build(self, g, layer):
        wk, (epf, on_grid) = dw_weights(g, layer).reshape(-1), _epilogue(layer)
        pairs = sized(depthwise_pairs.depthwise_pairs, g.out_size * g.kh * g.kw, layer.threads)
        zrow = np.zeros(g.w, np.float32)
        idx = depthwise_pairs.pick_index(g.ow, 2)
        return per_image(g, lambda x, y: pairs(x, wk, layer.bias, g.kh, 2, g.t, g.l, idx, epf, on_grid, zrow, y))


class RowDepthwise3x3(Strategy):
    """Wide maps (from depthwise3x3.ROWS_FROM_WIDTH) row by row, stride 1 or 2 (depthwise3x3.depthwise3x3). Not with a fused
    SiLU or the like: its epilogue runs row by row, its spills around the activation's branch cost more
    than the walk saves (EfficientNet-B0's 32 channels on 112x112 with SiLU, in the model: 0.40 ms
    against 0.32 in strips, which finish four rows under one branch; with ReLU6, MobileNetV2's
    depthwise layers 1.44 ms in rows against 1.48-1.55 in strips)."""
    name, avx512, fuses_post, no_post = "dw3-rows", True, True, True

    def suits(self, g):
        if not g.depthwise:
            return False
        return g.depthwise and g.k3 and g.sh in (1, 2) and g.w >= dw3x3.ROWS_FROM_WIDTH

    def build(self, g, layer):
        w9, (epf, on_grid) = dw_weights(g, layer).reshape(-1), _epilogue(layer)
        rows = sized(dw3x3.depthwise3x3, g.out_size * 9, layer.threads)
        return per_image(g, lambda x, y: rows(x, w9, layer.bias, g.sh, g.t, g.l, epf, on_grid, y))


class StripDepthwise(Strategy):
    """3x3, 5x5 and 7x7 in strips of 16 columns down STRIP_ROWS rows, stride 1 (dilated or not)
    or 2, and the bands 1 x k, k x 1 at stride 1 (depthwise_strips.depthwise_strips). Bands on maps to 16
    wide too (channels-last ran GhostNetV2's 1x5 and 5x1 on 14x14 and 7x7 at 3-4 GFLOP/s)."""
    name, avx512, fuses_post = "dw-strips", True, True

    def suits(self, g):
        if not g.depthwise:
            return False
        if g.depthwise and (g.kh, g.kw) in depthwise_strips.BANDS:
            return g.sh == g.sw == 1 and g.dh == g.dw == 1
        return (g.depthwise and g.kh == g.kw and g.kh in depthwise_strips.SIZES and g.sh == g.sw and g.dh == g.dw
                and (g.sh == 1 or (g.sh == 2 and g.dh == 1)))

    def build(self, g, layer):
        wk, (epf, on_grid) = dw_weights(g, layer).reshape(-1), _epilogue(layer)
        strips, zrow = sized(depthwise_strips.depthwise_strips, g.out_size * g.kh * g.kw, layer.threads), np.zeros(g.w, np.float32)
        return per_image(g, lambda x, y: strips(x, wk, layer.bias, g.kh, g.kw, g.sh, g.dh, g.t, g.l, epf, on_grid, zrow,
                                                 STRIP_ROWS, y))


class PlaneDepthwise3x3(Strategy):
    """Stride 1 on a zero-bordered copy of each channel (conv.depthwise3x3_s1): branch-free rows."""
    name = "dw3-plane"

    def suits(self, g):
        return (g.depthwise and g.k3 and g.sh == 1 and max(g.t, g.l, g.b, g.r) <= PLANE_DW_MAX_PAD
                and g.ow >= PLANE_DW_MIN_WIDTH)

    def build(self, g, layer):
        xp = np.zeros((g.cin, max(g.h + g.t + g.b, g.oh + 2), max(g.w + g.l + g.r, g.ow + 2)), np.float32)
        wd = dw_weights(g, layer)
        fn = sized(depthwise3x3_s1, g.out_size * 9, layer.threads)
        return per_image(g, lambda x, y: fn(x, wd, layer.bias, g.t, g.l, xp, y, layer.act, layer.grid))


class ChannelsLastDepthwise(Strategy):
    """Small maps with the channels innermost (conv.depthwise_hwc), any kernel size."""
    name = "dw-channels-last"

    def suits(self, g):
        return g.depthwise and g.ow <= CHANNELS_LAST_MAX_WIDTH and g.sh == g.sw and g.dh == g.dw == 1

    def build(self, g, layer):
        xp = np.zeros((max(g.h + g.t + g.b, (g.oh - 1) * g.sh + g.kh), max(g.w + g.l + g.r, (g.ow - 1) * g.sw + g.kw),
                       g.cin), np.float32)
        yp = np.empty((g.oh, g.ow, g.cout), np.float32)
        wt = np.ascontiguousarray(dw_weights(g, layer).reshape(g.cout, g.kh * g.kw).T)
        hwc = sized(depthwise_hwc, g.out_size * g.kh * g.kw, layer.threads)
        return per_image(g, lambda x, y: hwc(x, wt, layer.bias, g.kh, g.kw, g.sh, g.t, g.l, xp, yp, y, layer.act,
                                              layer.grid))


class BorderDepthwise3x3(Strategy):
    """3x3, stride 1 or 2, padding read as zeros by checking the border taps (conv.depthwise3x3)."""
    name = "dw3-border"

    def suits(self, g):
        return g.depthwise and g.k3 and g.sh in (1, 2) and max(g.t, g.l, g.b, g.r) <= PLANE_DW_MAX_PAD

    def build(self, g, layer):
        zrow, wd = np.zeros(g.w, np.float32), dw_weights(g, layer)
        fn = sized(depthwise3x3, g.out_size * 9, layer.threads)
        return per_image(g, lambda x, y: fn(x, wd, layer.bias, g.sh, g.t, g.l, zrow, y, layer.act, layer.grid))


class GenericDepthwise(Strategy):
    """Any depthwise window on a padded copy (conv.depthwise)."""
    name = "dw-generic"

    def suits(self, g):
        return g.depthwise

    def build(self, g, layer):
        wd, pad, regrid = dw_weights(g, layer), padder(g), regrid_of(g, layer)

        def run(inputs, outputs):
            x, y = inputs[0], outputs[0]
            for i in range(g.n):
                depthwise(pad(x[i]), wd, layer.bias, g.sh, g.sw, g.dh, g.dw, y[i], layer.act)
            regrid(y)
        return writes(run)


def _epilogue(layer: Layer) -> tuple:
    """float_gemm.epilogue_of for the layer, kept per layer while the session plans (weight_cache.shape_free)."""
    return shape_free("epilogue", layer.weight, (layer.grid, layer.post), (layer.act,),
                      lambda: epilogue_of(layer.act, layer.grid, layer.post))


def dw_weights(g: Geometry, layer: Layer) -> np.ndarray:
    return np.ascontiguousarray(layer.weight.reshape(g.cout, g.kh, g.kw))
