"""Interp (resize): nearest, bilinear, with MNN's coordinate-transformation modes."""
from __future__ import annotations

import numpy as np
from ..compile.jit import njit, prange

from ....ir.ops.resize import src_coords as _src_coords
from ....ir.ops import params
from .. import kernel, sized, writes


@njit(parallel=True, cache=True, fastmath=True)
def _bilinear(x, y0, y1, wy, x0, x1, wx, rows, out):
    """Separable: each input row interpolated along x once into `rows` (n*c, h, ow), then each output row
    from two of those, contiguous (it vectorizes). The same products in the same order as interpolating
    every output pixel from its four inputs, which gathered 4 values a pixel: DeepLabV3's 21x64x64 ->
    256x256 upsampling took 1.8 ms."""
    n, c, h = x.shape[0], x.shape[1], x.shape[2]
    ow = out.shape[3]
    for nc in prange(n * c):
        b, ch = nc // c, nc % c
        src, tmp, dst = x[b, ch], rows[nc], out[b, ch]
        for r in range(h):
            s, t = src[r], tmp[r]
            for j in range(ow):
                t[j] = s[x0[j]] * (1 - wx[j]) + s[x1[j]] * wx[j]
        for i in range(out.shape[2]):
            top, bot, o = tmp[y0[i]], tmp[y1[i]], dst[i]
            a, bb = 1 - wy[i], wy[i]
            for j in range(ow):
                o[j] = top[j] * a + bot[j] * bb


@njit(parallel=True, cache=True, error_model="numpy")
def _nearest(x, iy, ix, pairs, out):
    """out[b, c, i, j] = x[b, c, iy[i], ix[j]]: one gather along each source row, and an output row whose
    source row is the previous one's (2x upsampling: every other row) copied from it. numpy's two fancy
    indexings (with a temporary between them) took 2.5 ms of GhostNetV2-1.0's 12.8 (its 14 upsamplings).
    Flat unsigned indices (Numba's negative-index wrap on 2-D row views stopped the vectorizer); with
    `pairs` (ix[j] == j // 2, even output rows) each source float is written as one 64-bit pair:
    (1, 72, 28, 28) -> 56 x 56, 95 -> ~40 us."""
    n, c, h, w = x.shape[0], x.shape[1], x.shape[2], x.shape[3]
    oh, ow = out.shape[2], out.shape[3]
    xf, of = x.reshape(-1), out.reshape(-1)
    bits, wide = xf.view(np.uint32), of[:of.size // 2 * 2].view(np.uint64)   # an odd-sized output: pairs is off
    uw, uow, one, half = np.uint64(w), np.uint64(ow), np.uint64(1), np.uint64(32)
    for nc in prange(n * c):
        sb, db = np.uint64(nc * h * w), np.uint64(nc * oh * ow)
        for i in range(oh):
            d = db + np.uint64(i) * uow
            if i > 0 and iy[i] == iy[i - 1]:
                p = d - uow
                for j in range(uow):
                    of[d + j] = of[p + j]
                continue
            s = sb + np.uint64(iy[i]) * uw
            if pairs:
                d2 = d >> one
                for j in range(uw):
                    u = np.uint64(bits[s + j])
                    wide[d2 + j] = u | (u << half)
            else:
                for j in range(uow):
                    of[d + j] = xf[s + np.uint64(ix[j])]


@kernel("Interp")
def interp(node, ins, outs, settings):
    p = params(node)
    _, _, h, w = ins[0].shape
    oh, ow = outs[0].shape[2:]
    rtype = p["resizeType"]
    ctm, align, half = p["ctm"], bool(p["alignCorners"]), bool(p["halfPixelCenters"])
    sy, sx = oh / h, ow / w
    if p.get("heightScale"):
        sy, sx = float(p["heightScale"]), float(p["widthScale"])
    if len(ins) > 1 and ins[1].value is not None and ins[1].dtype.startswith("float"):
        v = np.asarray(ins[1].value).reshape(-1)
        sy, sx = float(v[-2]), float(v[-1])
    fy = _src_coords(oh, h, sy, ctm, align, half)
    fx = _src_coords(ow, w, sx, ctm, align, half)
    if rtype in (1, 4):   # 1: floor (asymmetric), 4: round half down as ONNX round_prefer_floor
        iy = np.floor(fy) if rtype == 1 else np.ceil(fy - 0.5)
        ix = np.floor(fx) if rtype == 1 else np.ceil(fx - 0.5)
        iy = np.clip(iy, 0, h - 1).astype(np.int64)
        ix = np.clip(ix, 0, w - 1).astype(np.int64)
        n, c = ins[0].shape[:2]
        pairs = ow == 2 * w and np.array_equal(ix, np.arange(ow) // 2)
        nearest = sized(_nearest, n * c * oh * ow, settings.threads)

        def run(i, o):
            x = np.ascontiguousarray(i[0], np.float32)
            if o[0].flags.c_contiguous:
                nearest(x, iy, ix, pairs, o[0])
            else:
                tmp = np.empty(o[0].shape, np.float32)
                nearest(x, iy, ix, pairs, tmp)
                o[0][...] = tmp
        return writes(run)
    if rtype != 2:
        from ....errors import MnnToolError
        raise MnnToolError(f"Interp '{node.name}': resizeType {rtype} (cubic) is not supported by the runtime")
    fy, fx = np.clip(fy, 0, h - 1), np.clip(fx, 0, w - 1)
    y0 = np.floor(fy).astype(np.int64)
    x0 = np.floor(fx).astype(np.int64)
    y1, x1 = np.minimum(y0 + 1, h - 1), np.minimum(x0 + 1, w - 1)
    wy, wx = (fy - y0).astype(np.float32), (fx - x0).astype(np.float32)
    n, c = ins[0].shape[:2]
    rows = np.empty((n * c, h, ow), np.float32)
    bilinear = sized(_bilinear, n * c * (h + oh) * ow * 3, settings.threads)     # the two passes
    return writes(lambda i, o: bilinear(i[0], y0, y1, wy, x0, x1, wx, rows, o[0]))
