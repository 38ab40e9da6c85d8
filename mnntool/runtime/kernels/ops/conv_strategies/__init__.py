"""How a float convolution runs: one unit per strategy, each saying which layers it suits and how it
builds the kernel; the first in `STRATEGIES` that suits a layer's `Geometry` runs it (as MNN's
ConvolutionFloatFactory picks among its executions).

Every threshold (depthwise.py, dense.py) carries the measurement that set it (1 thread unless said otherwise; the
commit that introduced the strategy has the model-level numbers).
"""
from __future__ import annotations

from ...micro.llvm_ir import host_has
from .base import Geometry, Layer, Strategy, trimmed, with_post
from .dense import (BlasIm2col, BlasRows, GroupedTapsInPlace, Im2colChannelsInLanes, ImplicitIm2col, MatVecRows,
                    PackedRows, Patchify, Pointwise, SparseTaps, TapsInPlace, WideTapsInPlace, Winograd3x3)
from .depthwise import (BorderDepthwise3x3, ChannelsLastDepthwise, FlatDepthwise, GenericDepthwise, LanesDepthwise,
                        PairedRowsDepthwise, PlaneDepthwise3x3, RowDepthwise3x3, StripDepthwise)
from .matvec import LanesMatVec

_DEPTHWISE = LanesDepthwise.__module__

__all__ = ["Geometry", "Layer", "Strategy", "trimmed", "with_post", "build", "STRATEGIES", "pick", "HAS_AVX512"]

HAS_AVX512 = host_has("avx512f")

# In order of preference: the first that suits a layer runs it.
STRATEGIES: list[Strategy] = [
    LanesDepthwise(), FlatDepthwise(), RowDepthwise3x3(), PairedRowsDepthwise(), StripDepthwise(), PlaneDepthwise3x3(),
    ChannelsLastDepthwise(), BorderDepthwise3x3(), GenericDepthwise(),
    SparseTaps(), Winograd3x3(), LanesMatVec(), MatVecRows(), PackedRows(), BlasRows(), Pointwise(), Patchify(),
    Im2colChannelsInLanes(), TapsInPlace(), WideTapsInPlace(), ImplicitIm2col(), GroupedTapsInPlace(), BlasIm2col(),
]


# The strategies of depthwise.py suit depthwise layers only (each one's suits tests g.depthwise): a dense layer's
# pick skips them (~7 us a layer, ~0.3 ms at every new input shape of EfficientNet-B0: 47 dense convolutions).
_FOR_DENSE: list = [None, 0, None]  # [the STRATEGIES list it was made from, its length, those not of depthwise.py]


def _for_dense() -> list[Strategy]:
    if _FOR_DENSE[0] is not STRATEGIES or _FOR_DENSE[1] != len(STRATEGIES):
        _FOR_DENSE[:] = [STRATEGIES, len(STRATEGIES), [s for s in STRATEGIES if type(s).__module__ != _DEPTHWISE]]
    return _FOR_DENSE[2]


def pick(g: Geometry, avx512: bool = HAS_AVX512, post: bool = False) -> Strategy:
    """The first strategy that suits the layer; with `post` (a fused activation past the ReLU bounds), not
    the ones that run it poorly (Strategy.no_post), without one not those that pay only with one
    (Strategy.post_only)."""
    return next(s for s in (STRATEGIES if g.depthwise else _for_dense()) if (avx512 or not s.avx512) and
                not (post and s.no_post) and not (s.post_only and not post) and s.suits(g))


def build(g: Geometry, layer: Layer, avx512: bool = HAS_AVX512):
    """The kernel of the strategy `pick` chooses, with the layer's fused activation after it where the
    strategy's own epilogue does not apply it."""
    s = pick(g, avx512, bool(layer.post[0]))
    k = s.build(g, layer)
    return k if s.fuses_post else with_post(k, layer.post, g.n * g.out_size, layer.threads)
