"""Zero Padding of the spatial axes followed by a convolution -> the convolution's own pads (Keras and
TensorFlow models pad explicitly before stride-2 convolutions; PyTorch exports do it for asymmetric pads)."""
from __future__ import annotations

import numpy as np

from ..ir.graph import Graph
from ..ir.ops import is_convolution
from .util import sole_user


class FusePadIntoConvPass:
    name = "fuse_pad_into_conv"

    def __call__(self, g: Graph) -> bool:
        changed = False
        for pad in [n for n in g.nodes if n.op == "Padding"]:
            conv = sole_user(g, pad)
            pads = g.constants.get(pad.inputs[1]) if len(pad.inputs) > 1 else None
            if conv is None or not is_convolution(conv.op) or pads is None or pads.size != 8 or \
                    pad.param.get("mode", "CONSTANT") != "CONSTANT" or len(pad.inputs) > 2 or \
                    conv.inputs[0] != pad.outputs[0] or len(conv.inputs) > 1:
                continue
            p = np.asarray(pads).reshape(4, 2)      # (begin, end) per NCHW axis
            c = conv.param["common"]
            if p[:2].any() or (p < 0).any() or c.get("padMode", "CAFFE") != "CAFFE":
                continue
            old = c.get("pads")
            t, l, b, r = (int(v) for v in old) if old is not None and len(old) == 4 else \
                (c.get("padY", 0), c.get("padX", 0), c.get("padY", 0), c.get("padX", 0))
            t, l, b, r = t + int(p[2, 0]), l + int(p[3, 0]), b + int(p[2, 1]), r + int(p[3, 1])
            c.update(pads=[t, l, b, r], padY=t, padX=l)
            conv.inputs[0] = pad.inputs[0]
            g.nodes.remove(pad)
            changed = True
        return changed
