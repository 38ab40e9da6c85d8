"""The Numba loops of the convolutions that are not GEMMs: depthwise (general, 3x3 by rows, 3x3 on a
padded plane, channels innermost), im2col and col2im, and the bias/activation pass after BLAS."""
from __future__ import annotations

from ..compile.jit import njit, prange

from .epilogue import finish


@njit(cache=True)
def patches(x, kh, kw, oh, ow, cols):
    """cols[c, i, j, p, q] = x[c, p * kh + i, q * kw + j]: a ViT's patch embedding's im2col (kernel =
    stride, no padding). NumPy's copy of the same 5-D transpose: 3.9 against 2.5 us for a 32x32 image
    in 8x8 patches, 77 against 54 us for 224x224 in 16x16."""
    for c in range(x.shape[0]):
        for i in range(kh):
            for j in range(kw):
                for p in range(oh):
                    src, dst = x[c, p * kh + i], cols[c, i, j, p]
                    for q in range(ow):
                        dst[q] = src[q * kw + j]


@njit(parallel=True, cache=True, fastmath=True)
def im2col(xp, kh, kw, sh, sw, dh, dw, oh, ow, cols):
    for c in prange(xp.shape[0]):
        for i in range(kh):
            for j in range(kw):
                dst = cols[(c * kh + i) * kw + j]
                for y in range(oh):
                    src = xp[c, y * sh + i * dh]
                    base = y * ow
                    if sw == 1 and dw == 1:
                        dst[base:base + ow] = src[j:j + ow]
                    else:
                        for x in range(ow):
                            dst[base + x] = src[x * sw + j * dw]


@njit(parallel=True, cache=True, fastmath=True)
def depthwise(xp, w, b, sh, sw, dh, dw, out, act):
    """Row by row: each output row accumulates kh*kw shifted input rows (contiguous when stride is 1)."""
    kh, kw = w.shape[1], w.shape[2]
    oh, ow = out.shape[1], out.shape[2]
    for c in prange(out.shape[0]):
        for y in range(oh):
            row = out[c, y]
            for x in range(ow):
                row[x] = b[c]
            for i in range(kh):
                src = xp[c, y * sh + i * dh]
                for j in range(kw):
                    wv = w[c, i, j]
                    off = j * dw
                    # indices built only from loop variables let Numba drop its negative-index check and vectorize
                    if sw == 1 and dw == 1:
                        for x in range(ow):
                            row[x] += wv * src[x + j]
                    elif sw == 2 and dw == 1:
                        for x in range(ow):
                            row[x] += wv * src[2 * x + j]
                    else:
                        for x in range(ow):
                            row[x] += wv * src[x * sw + off]
            if act == 1:
                for x in range(ow):
                    row[x] = max(row[x], 0.0)
            elif act == 2:
                for x in range(ow):
                    row[x] = min(max(row[x], 0.0), 6.0)


@njit(cache=True, fastmath=True, inline="always")
def _tap3(r0, r1, r2, k, w00, w01, w02, w10, w11, w12, w20, w21, w22):
    return (w00 * r0[k] + w01 * r0[k + 1] + w02 * r0[k + 2] + w10 * r1[k] + w11 * r1[k + 1] + w12 * r1[k + 2]
            + w20 * r2[k] + w21 * r2[k + 1] + w22 * r2[k + 2])


@njit(cache=True, fastmath=True, inline="always")
def _edge3(r0, r1, r2, k, W, w00, w01, w02, w10, w11, w12, w20, w21, w22):
    """One output at a left/right border: taps outside the row read as zero."""
    v = 0.0
    if 0 <= k < W:
        v += w00 * r0[k] + w10 * r1[k] + w20 * r2[k]
    if 0 <= k + 1 < W:
        v += w01 * r0[k + 1] + w11 * r1[k + 1] + w21 * r2[k + 1]
    if 0 <= k + 2 < W:
        v += w02 * r0[k + 2] + w12 * r1[k + 2] + w22 * r2[k + 2]
    return v


@njit(cache=True, fastmath=True, inline="always")
def _dw3_row(r0, r1, r2, row, bc, s, l, lo, hi, W, act, grid, w00, w01, w02, w10, w11, w12, w20, w21, w22):
    # slices put the first full window at index 0, so every index is a loop variable plus a constant:
    # Numba then drops its negative-index check and LLVM vectorizes the loop
    k0 = lo * s - l
    a0, a1, a2, dst = r0[k0:], r1[k0:], r2[k0:], row[lo:hi]
    if s == 1:
        for j in range(hi - lo):
            dst[j] = finish(bc + _tap3(a0, a1, a2, j, w00, w01, w02, w10, w11, w12, w20, w21, w22), act, grid)
    else:
        for j in range(hi - lo):
            dst[j] = finish(bc + _tap3(a0, a1, a2, 2 * j, w00, w01, w02, w10, w11, w12, w20, w21, w22), act, grid)
    for i in range(0, lo):
        row[i] = finish(bc + _edge3(r0, r1, r2, i * s - l, W, w00, w01, w02, w10, w11, w12, w20, w21, w22), act, grid)
    for i in range(hi, row.shape[0]):
        row[i] = finish(bc + _edge3(r0, r1, r2, i * s - l, W, w00, w01, w02, w10, w11, w12, w20, w21, w22), act, grid)


@njit(parallel=True, cache=True, fastmath=True)
def depthwise3x3(x, w, b, s, t, l, zrow, out, act, grid):
    """3x3 depthwise, stride 1 or 2, padding read as zeros (no padded copy): each output row is one pass
    over three input rows with the nine weights in registers; border rows and columns check their taps."""
    H, W = x.shape[1], x.shape[2]
    oh, ow = out.shape[1], out.shape[2]
    lo = min((l + s - 1) // s, ow)                 # first x whose window starts inside the row
    hi = max(min((W - 3 + l) // s + 1, ow), lo)    # first x whose window runs past its end
    ylo = min((t + s - 1) // s, oh)
    yhi = max(min((H - 3 + t) // s + 1, oh), ylo)
    for c in prange(out.shape[0]):
        w00, w01, w02 = w[c, 0, 0], w[c, 0, 1], w[c, 0, 2]
        w10, w11, w12 = w[c, 1, 0], w[c, 1, 1], w[c, 1, 2]
        w20, w21, w22 = w[c, 2, 0], w[c, 2, 1], w[c, 2, 2]
        bc = b[c]
        for y in range(ylo, yhi):
            iy = y * s - t
            _dw3_row(x[c, iy], x[c, iy + 1], x[c, iy + 2], out[c, y], bc, s, l, lo, hi, W, act, grid,
                     w00, w01, w02, w10, w11, w12, w20, w21, w22)
        for y in range(oh):
            if ylo <= y < yhi:
                continue
            iy = y * s - t      # a border row: rows outside the input are the zero row
            _dw3_row(x[c, iy] if 0 <= iy < H else zrow, x[c, iy + 1] if 0 <= iy + 1 < H else zrow,
                     x[c, iy + 2] if 0 <= iy + 2 < H else zrow, out[c, y], bc, s, l, lo, hi, W, act, grid,
                     w00, w01, w02, w10, w11, w12, w20, w21, w22)


@njit(parallel=True, cache=True, fastmath=True)
def depthwise3x3_s1(x, w, b, t, l, xp, out, act, grid):
    """3x3 depthwise, stride 1: each channel is first copied into its zero-bordered plane xp[c] (hot in
    cache when it is read back), so every output row is one branch-free pass over three padded rows
    that LLVM vectorizes; 2x the border-checking kernel on MobileNetV2's maps."""
    C, H, W = x.shape
    oh, ow = out.shape[1], out.shape[2]
    for c in prange(C):
        pc = xp[c]
        for y in range(H):
            src, row = x[c, y], pc[t + y, l:l + W]
            for k in range(W):
                row[k] = src[k]
        w00, w01, w02 = w[c, 0, 0], w[c, 0, 1], w[c, 0, 2]
        w10, w11, w12 = w[c, 1, 0], w[c, 1, 1], w[c, 1, 2]
        w20, w21, w22 = w[c, 2, 0], w[c, 2, 1], w[c, 2, 2]
        bc = b[c]
        for y in range(oh):
            r0, r1, r2, dst = pc[y], pc[y + 1], pc[y + 2], out[c, y]
            for k in range(ow):
                dst[k] = finish(bc + _tap3(r0, r1, r2, k, w00, w01, w02, w10, w11, w12, w20, w21, w22), act, grid)


@njit(parallel=True, cache=True, fastmath=True)
def col2im(cols, kh, kw, sh, sw, dh, dw, h, w, canvas):
    """Scatter-add columns (C*kh*kw, h*w) of a transposed convolution onto canvas (C, H', W')."""
    for c in prange(canvas.shape[0]):
        for i in range(kh):
            for j in range(kw):
                row = (c * kh + i) * kw + j
                for y in range(h):
                    oy = y * sh + i * dh
                    for x in range(w):
                        canvas[c, oy, x * sw + j * dw] += cols[row, y * w + x]


@njit(parallel=True, cache=True, fastmath=True)
def bias_act(y, bias, act, grid):
    """y[c, :] += bias[c], the activation and the output grid: one pass over the sgemm's output."""
    for c in prange(y.shape[0]):
        row, bc = y[c], bias[c]
        for i in range(row.shape[0]):
            row[i] = finish(row[i] + bc, act, grid)


@njit(parallel=True, cache=True, fastmath=True)
def depthwise_hwc(x, w, b, kh, kw, s, t, l, xp, yp, out, act, grid):
    """Depthwise convolution with channels innermost: for small feature maps (14x14, 7x7) a row is too
    short to vectorize, the channels are not. x (C, H, W) -> xp (H+pads, W+pads, C) zero-bordered,
    then out[c, y, x] = sum_ij w[i*kw+j, c] * xp[y*s+i, x*s+j, c] + b[c] with 16 channels per vector.
    """
    C, H, W = x.shape
    oh, ow = out.shape[1], out.shape[2]
    for y in prange(H):
        for c in range(C):
            src = x[c, y]
            for i in range(W):
                xp[y + t, i + l, c] = src[i]
    for y in prange(oh):
        for xx in range(ow):
            acc = yp[y, xx]
            acc[:] = b
            for i in range(kh):
                for j in range(kw):
                    src = xp[y * s + i, xx * s + j]
                    wk = w[i * kw + j]
                    for c in range(C):
                        acc[c] += wk[c] * src[c]
            for c in range(C):
                acc[c] = finish(acc[c], act, grid)
    for c in prange(C):
        for y in range(oh):
            dst = out[c, y]
            for xx in range(ow):
                dst[xx] = yp[y, xx, c]
