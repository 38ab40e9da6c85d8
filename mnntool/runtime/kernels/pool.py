"""Max and average pooling (Numba), global pooling (numpy)."""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from . import kernel, writes


@njit(parallel=True, cache=True, fastmath=True)
def pool2d(x, kh, kw, sh, sw, pt, pl, is_max, include_pad, pb, pr, out):
    n, c, h, w = x.shape
    oh, ow = out.shape[2], out.shape[3]
    for nc in prange(n * c):
        b, ch = nc // c, nc % c
        for y in range(oh):
            y0 = y * sh - pt
            y1 = min(y0 + kh, h + pb)
            span_h = y1 - y0
            ys, ye = max(y0, 0), min(y1, h)
            for xx in range(ow):
                x0 = xx * sw - pl
                x1 = min(x0 + kw, w + pr)
                span_w = x1 - x0
                xs, xe = max(x0, 0), min(x1, w)
                if is_max:
                    m = -np.inf
                    for i in range(ys, ye):
                        for j in range(xs, xe):
                            v = x[b, ch, i, j]
                            if v > m:
                                m = v
                    out[b, ch, y, xx] = m
                else:
                    s = 0.0
                    for i in range(ys, ye):
                        for j in range(xs, xe):
                            s += x[b, ch, i, j]
                    cnt = span_h * span_w if include_pad else (ye - ys) * (xe - xs)
                    out[b, ch, y, xx] = s / max(cnt, 1)


@kernel("Pooling")
def pooling(node, ins, outs):
    p = node.param
    is_max = p.get("type", "MAXPOOL") == "MAXPOOL"
    if p.get("isGlobal"):
        if is_max:
            return writes(lambda i, o: np.max(i[0], axis=(2, 3), keepdims=True, out=o[0]))
        return writes(lambda i, o: np.mean(i[0], axis=(2, 3), keepdims=True, out=o[0]))
    n, c, h, w = ins[0].shape
    oh, ow = outs[0].shape[2:]
    kh, kw, sh, sw = p["kernelY"], p["kernelX"], p["strideY"], p["strideX"]
    pads = p.get("pads")
    if p.get("padType") == "SAME":
        ph, pw = max((oh - 1) * sh + kh - h, 0), max((ow - 1) * sw + kw - w, 0)
        pt, pl, pb, pr = ph // 2, pw // 2, ph - ph // 2, pw - pw // 2
    elif p.get("padType") == "VALID":
        pt = pl = pb = pr = 0
    elif pads is not None and len(pads) == 4:
        pt, pl, pb, pr = (int(v) for v in pads)
    else:
        pt = pb = p.get("padY", 0)
        pl = pr = p.get("padX", 0)
    count = p.get("countType", "DEFAULT")
    include = count == "INCLUDE_PADDING" or (count == "DEFAULT" and p.get("padType", "CAFFE") == "CAFFE")
    return writes(lambda i, o: pool2d(i[0], kh, kw, sh, sw, pt, pl, is_max, include, pb, pr, o[0]))


@kernel("Pooling3D")
def pooling3d(node, ins, outs):
    if not node.param.get("isGlobal"):
        from ...errors import MnnToolError
        raise MnnToolError(f"Pooling3D '{node.name}': only global pooling is supported by the runtime")
    axes = tuple(range(2, len(ins[0].shape)))
    fn = np.max if node.param.get("type") == "MAXPOOL" else np.mean
    return writes(lambda i, o: fn(i[0], axis=axes, keepdims=True, out=o[0]))
