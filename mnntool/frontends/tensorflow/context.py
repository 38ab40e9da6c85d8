"""TensorFlow graphs are NHWC; MNN's convolutions are NCHW. The layout is converted once, here: every 4-D
tensor a layout-sensitive op (conv, pool, batch norm, resize) makes stays NCHW in the IR and is marked so;
elementwise ops keep the mark (their constants are permuted to match), axis ops remap their axes, and
anything else gets the tensor back in NHWC through one Permute. So a Keras CNN has a Permute at its input
and none inside."""
from __future__ import annotations

import numpy as np

from ...errors import MnnToolError
from ..shape_tracking import ShapedCtx, T, rename_tensor
from ..fold_unroll import LoopBudget

TO_NCHW, TO_NHWC = [0, 3, 1, 2], [0, 2, 3, 1]
NHWC_AXIS_IN_NCHW = {0: 0, 1: 2, 2: 3, 3: 1}


class TfCtx(ShapedCtx):
    def __init__(self, graph, path):
        super().__init__(graph, path)
        self.nchw: set[str] = set()          # IR tensors holding a TF NHWC tensor in NCHW order
        self._views: dict[tuple, T] = {}     # (tensor, "nchw"/"nhwc") -> the permuted copy
        self.functions: dict = {}            # the function library control-flow bodies come from
        self.loops = LoopBudget()

    def is_nchw(self, x) -> bool:
        return isinstance(x, T) and x in self.nchw

    def rank(self, x) -> int | None:
        """A tensor's rank (the ONNX converters this context also serves ask by name), a value's ndim."""
        return super().rank(x) if isinstance(x, str) else np.ndim(x)

    def tf_shape(self, x) -> tuple:
        """The shape as TensorFlow sees it."""
        if not isinstance(x, T):
            return tuple(np.shape(x))
        s = self.shape_of(x)
        return tuple(s[p] for p in TO_NHWC) if x in self.nchw else s

    def as_nchw(self, x) -> T:
        x = self.tensor(x)
        if x in self.nchw:
            return x
        key = (x, "nchw")
        if key not in self._views:
            out = self.emit("Permute", [x], [self.tmp(x + "_nchw")], {"dims": TO_NCHW})[0]
            self.nchw.add(out)
            self._views[key] = out
            self._views[(out, "nhwc")] = x
        return self._views[key]

    def as_nhwc(self, x):
        if not self.is_nchw(x):
            return x
        key = (x, "nhwc")
        if key not in self._views:
            out = self.emit("Permute", [x], [self.tmp(x + "_nhwc")], {"dims": TO_NHWC})[0]
            self._views[key] = out
            self._views[(out, "nchw")] = x
        return self._views[key]

    def mark(self, outs, nchw: bool):
        for o in outs:
            if nchw:
                self.nchw.add(o)
        return outs

    def const_for_nchw(self, c: np.ndarray) -> np.ndarray:
        """A constant broadcast against an NHWC tensor, rearranged to broadcast against its NCHW copy."""
        c = np.asarray(c)
        if c.ndim == 0:
            return c
        c = c.reshape((1,) * (4 - c.ndim) + c.shape)
        return np.ascontiguousarray(c.transpose(TO_NCHW))

    def reduction_layout(self, x, axes: list[int], keep: bool) -> tuple:
        """(input, axes, output marked NCHW) for reducing TensorFlow axes of x: on its NCHW copy when the
        result keeps its dims or dropping them leaves the same axis order in both layouts (no permute
        either way), else on the NHWC tensor."""
        if self.is_nchw(x):
            kept = [a for a in range(4) if a not in axes]
            if keep or kept == [a for a in TO_NCHW if a not in axes]:
                return x, sorted(NHWC_AXIS_IN_NCHW[a] for a in axes), keep
        return self.as_nhwc(x), list(axes), False

    def publish(self, v: T, public: str) -> None:
        """Make `v` a graph output under the source model's name (an inner tensor holding that name,
        such as the NCHW copy of an NHWC output, is renamed first)."""
        g = self.g
        if v in g.inputs:
            raise MnnToolError(f"{self.path}: output '{public}' is the input itself")
        if v != public and (public in g.tensors or public in g.constants or public in g.producers()):
            rename_tensor(g, public, g.fresh_name(public + "_inner"))
        g.outputs.append(str(v))
        rename_tensor(g, str(v), public)

    def out(self, node, k: int = 0) -> str:
        return self.tmp(node.name if k == 0 else f"{node.name}:{k}")
