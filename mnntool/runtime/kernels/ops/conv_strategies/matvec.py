"""Batch-1 fully connected layers (1x1 convolutions on 1x1 maps) with 16 outputs in the vector lanes
(micro/matvec_lanes.py)."""
from __future__ import annotations

from ... import sized, writes
from .base import Strategy

# Weights from this many floats (4 MB: classifier heads, read from L3 or memory at either kernel's bandwidth)
# stay on MatVecRows unless its 16 row streams alias in L1 (rows a multiple of 1024 floats: 4 KB apart).
STREAMED_FROM = 1 << 20


class LanesMatVec(Strategy):
    """Batch 1 of a fully connected layer on weights packed 16 outputs to a line, the fused activation in
    its epilogue (MatVecRows: float_gemv.MatVec, 16 rows side by side, a sigmoid or SiLU a pass of its
    own). Kernels alone in turns, 1 thread, AMD EPYC, us warm (after 64 MB touched), lanes / MatVecRows:
    SE blocks 48 -> 1152 + sigmoid 6.2 / 14.0 (79 / 93), 28 -> 672 + sigmoid 4.6 / 8.4, 240 -> 960 18.4 /
    25.7, 1152 -> 48 6.0 / 6.1, 96 -> 4 2.6 / 2.4; heads 1024 -> 2048 177-194 / 308-311 (515-560 /
    537-606), 1024 -> 1000 66 / 139, 2048 -> 1000 221 / 304; but 1280 -> 1000 80-85 / 76-79 and 960 -> 1280
    78 / 70-75 (STREAMED_FROM)."""
    name, avx512, fuses_post = "matvec-lanes", True, True

    def suits(self, g):
        return g.fully_connected and g.n == 1 and (g.cin * g.cout < STREAMED_FROM or g.cin % 1024 == 0)

    def build(self, g, layer):
        from ...micro import matvec_lanes
        from ...micro.float_gemm import epilogue_of
        from ...weight_cache import packed_once
        wp = packed_once(matvec_lanes.pack, layer.weight.reshape(g.cout, g.cin))   # once, not per input shape
        epf, on_grid = epilogue_of(layer.act, layer.grid, layer.post)
        chunks = max(1, min(wp.shape[0], layer.threads))
        fn = sized(matvec_lanes.matvec_lanes, g.cout * g.cin, layer.threads)

        def run(inputs, outputs):
            fn(wp, inputs[0].reshape(g.cin), layer.bias, epf, on_grid, chunks, outputs[0].reshape(g.cout))
        return writes(run)
