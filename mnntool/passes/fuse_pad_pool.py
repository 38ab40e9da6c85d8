"""A zero Padding of H and W followed by an average pooling -> the pooling's own pads, equal on both sides,
counting the padding (INCLUDE_PADDING), as MNN's converter writes it.

The ONNX frontend makes an average's counted padding an explicit Padding op because MNN's INCLUDE_PADDING
is wrong for end padding that differs from the start's and for ceil windows (frontends/onnx/nn.py
_explicit_pads). Where the same windows come from equal pads on both sides and no ceil window, every
window lies inside the padded map and MNN divides by the full window, which is the ONNX meaning. In MNN
the explicit form costs a Padding op and two layout conversions of the map (Inception-v3: 9 such
poolings, 18 of our 22 ConvertTensor against MNN's file's 4).
"""
from __future__ import annotations

import numpy as np

from ..ir.graph import Graph
from .util import sole_user


class FusePadIntoAvgPoolPass:
    name = "fuse_pad_into_avg_pool"

    def __call__(self, g: Graph) -> bool:
        changed = False
        for pad in [n for n in g.nodes if n.op == "Padding"]:
            pool = sole_user(g, pad)
            pads = g.constants.get(pad.inputs[1]) if len(pad.inputs) > 1 else None
            if pool is None or pool.op != "Pooling" or pads is None or pads.size != 8 or len(pad.inputs) > 2 or \
                    pad.param.get("mode", "CONSTANT") != "CONSTANT" or pool.inputs[0] != pad.outputs[0]:
                continue
            p = pool.param
            if p.get("type") != "AVEPOOL" or p.get("isGlobal") or p.get("ceilModel") or \
                    p.get("padType", "CAFFE") != "CAFFE" or any(int(v) for v in (p.get("pads") or [])) or \
                    p.get("padX", 0) or p.get("padY", 0) or \
                    p.get("countType", "DEFAULT") not in ("DEFAULT", "EXCLUDE_PADDING"):
                continue
            q = np.asarray(pads).reshape(4, 2)      # (begin, end) per NCHW axis
            shape = g.info(pad.inputs[0]).shape
            if q[:2].any() or (q < 0).any() or shape is None or len(shape) != 4 or \
                    not all(isinstance(d, int) for d in shape[2:]):
                continue
            axes = ((shape[2], int(p.get("kernelY", 1)), int(p.get("strideY", 1)), *q[2]),
                    (shape[3], int(p.get("kernelX", 1)), int(p.get("strideX", 1)), *q[3]))
            # the frontend pads the end only as far as the last window reaches: the same windows as equal
            # pads on both sides when that gives the same output size (each window then ends inside)
            if any(p1 > p0 or p0 >= k or (n + 2 * p0 - k) // st != (n + p0 + p1 - k) // st
                   for n, k, st, p0, p1 in axes):
                continue
            t, l = int(q[2, 0]), int(q[3, 0])
            p.update(pads=[t, l, t, l], padY=t, padX=l, countType="INCLUDE_PADDING")
            pool.inputs[0] = pad.inputs[0]
            g.nodes.remove(pad)
            changed = True
        return changed
