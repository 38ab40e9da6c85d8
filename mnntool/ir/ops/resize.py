"""Resize as one weight matrix per axis (out x in): nearest, linear and cubic differ only in the rows'
taps, so one `out = Wy x Wx^T` serves all of them."""
from __future__ import annotations

import numpy as np


def src_coords(out_size, in_size, scale, ctm, align=False, half=False):
    """Source coordinate of every output index (float), following ONNX/MNN transformation modes."""
    d = np.arange(out_size, dtype=np.float64)
    if ctm == "AlignCorners" or (ctm == "NotSet" and align):
        return d * (in_size - 1) / max(out_size - 1, 1)
    if ctm == "HalfPixels" or (ctm == "NotSet" and half):
        return (d + 0.5) / scale - 0.5
    if ctm == "PytorchHalfPixels":
        return (d + 0.5) / scale - 0.5 if out_size > 1 else np.zeros_like(d)
    if ctm == "TensorflowHalfPixels":
        return (d + 0.5) / scale
    return d / scale


def _cubic(t, a):
    t = np.abs(t)
    return np.where(t <= 1, ((a + 2) * t - (a + 3)) * t * t + 1,
                    np.where(t < 2, ((a * t - 5 * a) * t + 8 * a) * t - 4 * a, 0.0))


def axis_weights(out_size, in_size, scale, rtype, ctm, align=False, half=False, cubic_a=-0.75):
    """The (out_size, in_size) matrix mapping an input axis to the resized one."""
    f = src_coords(out_size, in_size, scale, ctm, align, half)
    w = np.zeros((out_size, in_size), np.float64)
    rows = np.arange(out_size)
    if rtype in (1, 4):       # 1: floor (asymmetric), 4: round half down as ONNX round_prefer_floor
        idx = np.floor(f) if rtype == 1 else np.ceil(f - 0.5)
        w[rows, np.clip(idx, 0, in_size - 1).astype(np.int64)] = 1.0
    elif rtype == 2:
        f = np.clip(f, 0, in_size - 1)
        i0 = np.floor(f).astype(np.int64)
        i1 = np.minimum(i0 + 1, in_size - 1)
        frac = f - i0
        np.add.at(w, (rows, i0), 1 - frac)
        np.add.at(w, (rows, i1), frac)
    elif rtype == 3:
        base = np.floor(f).astype(np.int64)
        for k in range(-1, 3):
            idx = base + k
            np.add.at(w, (rows, np.clip(idx, 0, in_size - 1)), _cubic(f - idx, cubic_a))
    else:
        raise ValueError(f"resizeType {rtype}")
    return w


def interp(p, x: np.ndarray, oh: int, ow: int) -> np.ndarray:
    """MNN's Interp on NCHW x; `p` its Interp table (ops.params: a field left out reads as MNN reads it)."""
    h, w = x.shape[2], x.shape[3]
    sy, sx = oh / h if h else 1.0, ow / w if w else 1.0
    if p["heightScale"] and not (p["outputHeight"] and p["outputWidth"]):
        sy, sx = float(p["heightScale"]), float(p["widthScale"])
    args = dict(ctm=p["ctm"], align=bool(p["alignCorners"]), half=bool(p["halfPixelCenters"]),
                cubic_a=float(p["cubicCoeffA"]))
    rtype = p["resizeType"]
    wy = axis_weights(oh, h, sy, rtype, **args)
    wx = axis_weights(ow, w, sx, rtype, **args)
    out = np.einsum("yh,nchw,xw->ncyx", wy, x.astype(np.float64), wx, optimize=True)
    return out.astype(x.dtype)
