"""Sum-of-branches convolutions become one (structural re-parameterisation, as RepVGG and MobileOne do
for deployment): Add(conv_a(x), conv_b(x)) with the same input, groups, stride and dilation, and centred
odd kernels, is one convolution whose kernel is the sum of both (the smaller zero-padded to the larger)
and whose bias is the sum; an identity branch (x itself, or a per-channel Scale of x: a BatchNorm on the
shortcut) adds its scale at the kernel's centre. Exports of models built for training keep every branch:
timm's MobileOne-S0 has 183 Adds over 192 convolutions, 2x onnxruntime's time (1 thread, Xeon); merged,
each block is the one convolution its authors deploy. The sums are exact in real arithmetic; in float32
they round in another order (differences ~1e-7 relative)."""
from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Node
from ..ir.ops import is_convolution


def _form(g: Graph, n: Node | None):
    """(input, the geometry that must match, kernel (ky, kx), centre offsets) of a convolution a branch
    merge can take, else None."""
    if n is None or not is_convolution(n.op) or len(n.inputs) != 1 or n.param.get("quanParameter") is not None:
        return None
    c = n.param.get("common") or {}
    if c.get("relu") or c.get("relu6") or c.get("hasOutputShape") or c.get("padMode", "CAFFE") != "CAFFE":
        return None
    kx, ky, dx, dy = (int(c.get(k, 1)) for k in ("kernelX", "kernelY", "dilateX", "dilateY"))
    px, py = int(c.get("padX", 0)), int(c.get("padY", 0))
    pads = c.get("pads")
    if pads is not None and len(pads) == 4 and [int(p) for p in pads] != [py, px, py, px]:
        return None
    if kx % 2 == 0 or ky % 2 == 0 or n.param.get("weight") is None:
        return None
    geometry = (int(c.get("group", 1)), int(c.get("strideX", 1)), int(c.get("strideY", 1)), dx, dy,
                int(c["outputCount"]), int(c["inputCount"]))
    return n.inputs[0], geometry, (ky, kx), (py - (ky - 1) // 2 * dy, px - (kx - 1) // 2 * dx)


def _kernel(n: Node, ky: int, kx: int) -> np.ndarray:
    c = n.param["common"]
    o = int(c["outputCount"])
    return np.asarray(n.param["weight"], np.float32).reshape(o, -1, int(c["kernelY"]), int(c["kernelX"]))


def _bias(n: Node, o: int) -> np.ndarray:
    b = n.param.get("bias")
    return np.zeros(o, np.float32) if b is None or np.asarray(b).size == 0 else np.asarray(b, np.float32).reshape(o)


def _merged(a: Node, fa, b: Node, fb, out: str) -> Node:
    group, sx, sy, dx, dy, o, i = fa[1]
    ky, kx = max(fa[2][0], fb[2][0]), max(fa[2][1], fb[2][1])
    w = np.zeros((o, i // group, ky, kx), np.float32)
    for n, f in ((a, fa), (b, fb)):
        h, wd = f[2]
        y0, x0 = (ky - h) // 2, (kx - wd) // 2
        w[:, :, y0:y0 + h, x0:x0 + wd] += _kernel(n, h, wd)
    py, px = (ky - 1) // 2 * dy + fa[3][0], (kx - 1) // 2 * dx + fa[3][1]
    common = dict(a.param["common"], kernelX=kx, kernelY=ky, padX=px, padY=py,
                  pads=np.array([py, px, py, px], np.int32))
    param = dict(a.param, common=common, weight=w.reshape(-1), bias=_bias(a, o) + _bias(b, o))
    op = "ConvolutionDepthwise" if group == o == i and group > 1 else a.op
    return Node(op, list(a.inputs), [out], a.name, param)


def _identity(g: Graph, branch: str, x: str, producers: dict):
    """(scale, bias) per channel when `branch` is x or a per-channel Scale of x, else None."""
    if branch == x:
        return 1.0, 0.0
    s = producers.get(branch)
    if s is None or s.op != "Scale" or s.inputs != [x] or s.param.get("scaleData") is None:
        return None
    return np.asarray(s.param["scaleData"], np.float32), np.asarray(s.param.get("biasData", 0.0), np.float32)


def _with_identity(n: Node, f, scale, bias, out: str) -> Node | None:
    group, sx, sy, dx, dy, o, i = f[1]
    if o != i or (sx, sy) != (1, 1) or f[3] != (0, 0):
        return None
    w = _kernel(n, *f[2]).copy()
    cy, cx = f[2][0] // 2, f[2][1] // 2
    per = i // group
    scale = np.broadcast_to(np.asarray(scale, np.float32), (o,))
    w[np.arange(o), np.arange(o) % per, cy, cx] += scale
    param = dict(n.param, weight=w.reshape(-1), bias=_bias(n, o) + np.broadcast_to(bias, (o,)))
    return Node(n.op, list(n.inputs), [out], n.name, param)


class MergeParallelConvsPass:
    name = "merge_parallel_convs"

    def __call__(self, g: Graph) -> bool:
        """One walk in graph order: a merged convolution takes its Add's output, so a later Add reading it
        (a third branch) sees a convolution again; the walk never rescans (it was quadratic in Adds)."""
        producers, readers = g.producers(), g.consumers()
        outputs = set(g.outputs)
        replaced: dict[int, Node] = {}
        removed: set[int] = set()

        def private(t: str, add: Node) -> bool:
            return t not in outputs and [r is add for r in readers.get(t, [])] == [True]

        for add in g.nodes:
            if id(add) in removed or add.op != "BinaryOp" or add.param.get("opType") != "ADD" or \
                    len(add.inputs) != 2 or add.param.get("activationType") or add.inputs[0] == add.inputs[1]:
                continue
            a, b = (producers.get(t) for t in add.inputs)
            fa, fb = _form(g, a), _form(g, b)
            new, gone = None, []
            if fa and fb and fa[0] == fb[0] and fa[1] == fb[1] and fa[3] == fb[3] and \
                    all(private(t, add) for t in add.inputs):
                new, gone = _merged(a, fa, b, fb, add.outputs[0]), [a, b]
            else:
                for conv, f, other in ((a, fa, add.inputs[1]), (b, fb, add.inputs[0])):
                    ident = _identity(g, other, f[0], producers) if f else None
                    if ident is None or not private(conv.outputs[0], add) or \
                            (other != f[0] and not private(other, add)):
                        continue
                    new = _with_identity(conv, f, *ident, add.outputs[0])
                    if new is not None:
                        gone = [conv] + ([producers[other]] if other != f[0] else [])
                        break
            if new is None:
                continue
            # `gone` may hold an earlier merge's node (standing in for its Add): drop that Add instead.
            for n in gone:
                removed.add(next((k for k, v in replaced.items() if v is n), id(n)))
            replaced[id(add)] = new
            producers[add.outputs[0]] = new
        if not replaced:
            return False
        g.nodes[:] = [replaced.get(id(n), n) for n in g.nodes if id(n) not in removed]
        return True
