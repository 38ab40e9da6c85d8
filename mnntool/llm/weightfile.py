"""`llm.mnn.weight`: the external weight file the graph's ops point into, written tensor by tensor.

Layout per linear layer (MNN's, as llmexport writes it and MNN's ConvolutionCommon reads it):
    quantized: header (quantize.header), packed values, alpha (fp32, per block), bias (fp32, if any)
    16-bit:    fp16 weights (oc, ic), bias (fp32, if any)
and the op's `external` is [offset, header+values bytes, alpha bytes, bias bytes, 0]. A norm is fp32
gamma then fp32 beta, `external` [offset, gamma bytes, beta bytes]. Nothing is held after it is
written, so peak memory is one tensor and its quantized copy, whatever the model's size.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import quantize as qz


@dataclass
class LinearRecord:
    """What the export report says of one layer."""
    name: str
    shape: tuple[int, int]
    bits: int
    block: int
    symmetric: bool
    bytes: int

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.bytes / (self.shape[0] * self.shape[1])


class WeightFile:
    def __init__(self, f):
        self.f = f
        self.offset = 0
        self.records: list[LinearRecord] = []

    def write(self, data) -> int:
        b = memoryview(np.ascontiguousarray(data)).cast("B") if isinstance(data, np.ndarray) else data
        n = self.f.write(b)
        self.offset += n
        return n

    def linear(self, name: str, w: np.ndarray, bias: np.ndarray | None, bits: int, block: int,
               symmetric: bool, hqq: bool = False) -> tuple[dict, qz.Quantized | None]:
        """Write one linear layer; returns (the Convolution2D's fields, the Quantized values; None at 16 bits)."""
        oc, ic = w.shape
        start = self.offset
        if bits == 16:
            wlen = self.write(np.asarray(w, np.float16))
            alen, quan, q = 0, {"type": 3}, None
            blk, sym = 0, True
        else:
            q = qz.quantize(w, bits, block, symmetric, hqq)
            wlen = self.write(qz.header(oc, ic, bits)) + self.write(q.stored)
            alen = self.write(q.alpha)
            blk, sym = q.block, q.symmetric
            quan = {"type": 1, "useInt32": False, "quantScale": 1.0, "scaleIn": 0.0, "scaleOut": 0.0,
                    "aMaxOrBits": bits, "aMin": 0 if symmetric else 1,
                    "readType": 0 if symmetric else oc * (ic // q.block), "has_scaleInt": False,
                    "shapeInt32": qz.wide_shape(oc, ic), "weightSize": 0}
        blen = self.write(np.asarray(bias, np.float32)) if bias is not None else 0
        self.records.append(LinearRecord(name, (oc, ic), bits, blk, sym, self.offset - start))
        main = {"common": {"kernelX": 1, "kernelY": 1, "strideX": 1, "strideY": 1, "dilateX": 1, "dilateY": 1,
                           "padMode": "CAFFE", "group": 1, "outputCount": oc, "inputCount": ic},
                "quanParameter": quan, "external": [start, wlen, alen, blen, 0]}
        return main, q

    def norm(self, gamma: np.ndarray, beta: np.ndarray | None) -> list[int]:
        start = self.offset
        g = self.write(np.asarray(gamma, np.float32))
        b = self.write(np.asarray(beta if beta is not None else np.zeros_like(gamma), np.float32))
        return [start, g, b]
