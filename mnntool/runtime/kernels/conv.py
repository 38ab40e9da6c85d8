"""Convolutions: picks the kernel for each layer at prepare (with AVX-512: `fgemm`/`ocgemm` for 1x1 and
im2col-free convolutions, `winograd` for 3x3 stride 1, `dw3` for 3x3 depthwise; elsewhere BLAS sgemm
and the Numba loops here), and the Numba depthwise, im2col and col2im kernels."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit, prange

from . import Kernel, kernel, sized, writes
from .grid import NO_GRID, activation, apply_act, finish, grid_of, to_grid

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


def _geometry(c: dict, in_hw, out_hw):
    kh, kw = c.get("kernelY", 1), c.get("kernelX", 1)
    sh, sw = c.get("strideY", 1), c.get("strideX", 1)
    dh, dw = c.get("dilateY", 1), c.get("dilateX", 1)
    pads = c.get("pads")
    if c.get("padMode") == "SAME":
        ph = max((out_hw[0] - 1) * sh + dh * (kh - 1) + 1 - in_hw[0], 0)
        pw = max((out_hw[1] - 1) * sw + dw * (kw - 1) + 1 - in_hw[1], 0)
        t, l, b, r = ph // 2, pw // 2, ph - ph // 2, pw - pw // 2
    elif c.get("padMode") == "VALID":
        t = l = b = r = 0
    elif pads is not None and len(pads) == 4:
        t, l, b, r = (int(p) for p in pads)
    else:
        t = b = c.get("padY", 0)
        l = r = c.get("padX", 0)
    return kh, kw, sh, sw, dh, dw, t, l, b, r


@njit(parallel=True, cache=True, fastmath=True)
def bias_act(y, bias, act, grid):
    """y[c, :] += bias[c], the activation and the output grid: one pass over the sgemm's output."""
    for c in prange(y.shape[0]):
        row, bc = y[c], bias[c]
        for i in range(row.shape[0]):
            row[i] = finish(row[i] + bc, act, grid)


@kernel("Convolution", "ConvolutionDepthwise")
def convolution(node, ins, outs):
    cout = node.param["common"]["outputCount"]
    weight = np.ascontiguousarray(conv_weight(node.param, cout))
    bias = np.asarray(node.param.get("bias", np.zeros(cout)), np.float32).reshape(-1)
    if bias.size != cout:
        bias = np.zeros(cout, np.float32)
    int8 = int8_scales(node)
    if int8 is not None:     # an int8 convolution: same arithmetic as MNN on the quantized grid
        grid_in, grid_out = grid_of(*int8.input), grid_of(*int8.output)
        fn = _integer(node, ins, outs, bias, int8)
        if fn is None:
            k = convolution_float(node, ins, outs, weight, bias, grid_out)
            # an input that an int8 kernel already rounded to this grid is used as it is
            fn = k.fn if ins[0].grid == grid_in else _grid_input(k.fn, ins[0].shape, grid_in)
        return Kernel(fn, True, grid_out)
    return convolution_float(node, ins, outs, weight, bias)


def _integer(node, ins, outs, bias, grids):
    """The integer kernel for a group-1 int8 convolution with 8-bit per-channel weights on a VNNI CPU,
    else None (elsewhere BLAS's sgemm on the int8 grid beats integer loops)."""
    from ...format.idst import int8_values
    from .int8conv import int8_convolution
    from .vnni import HAS_VNNI
    if not HAS_VNNI:
        return None
    c = node.param["common"]
    cout = c["outputCount"]
    values = int8_values(node.param["quanParameter"], cout)
    if values is None or (c.get("group", 1) or 1) != 1 or len(ins[0].shape) != 4:
        return None
    geometry = _geometry(c, ins[0].shape[2:], outs[0].shape[2:])
    return int8_convolution(geometry, *values, bias, activation(c), grids, ins[0].shape, outs[0].shape)


def conv_weight(param: dict, rows: int) -> np.ndarray:
    """Float weights (rows, -1), dequantized when the file stores them quantized or as fp16."""
    if param.get("weight") is not None and len(param["weight"]):
        return np.asarray(param["weight"], np.float32).reshape(rows, -1)
    if param.get("quanParameter") is not None:
        from ...format.idst import dequantize
        return dequantize(param["quanParameter"], rows)
    raise ValueError("convolution without weights")


class Int8Grids(NamedTuple):
    """An int8 convolution's input and output grids as (scale, min, max) in steps of the scale from
    zero (real = scale * (q - zero), q in [clampMin, clampMax], so the steps run from clampMin - zero),
    and the input's zero point."""
    input: tuple
    output: tuple
    zero_in: int


def int8_scales(node) -> Int8Grids | None:
    qp, sq = node.param.get("quanParameter"), node.param.get("symmetricQuan")
    if qp is None or sq is None or not qp.get("scaleIn") or not qp.get("scaleOut"):
        return None
    lo, hi = int(sq.get("clampMin", -128)), int(sq.get("clampMax", 127))
    z_in, z_out = int(sq.get("zeroPoint", 0)), int(sq.get("outputZeroPoint", 0))
    return Int8Grids((float(qp["scaleIn"]), lo - z_in, hi - z_in), (float(qp["scaleOut"]), lo - z_out, hi - z_out), z_in)


def _grid_input(fn, shape, grid):
    """Round the input to its int8 grid before a float kernel that rounds its own output (the layers
    the integer kernel does not cover: depthwise and grouped convolutions, 4-bit weights, no VNNI)."""
    xq = np.empty(shape, np.float32)
    rows = xq.reshape(-1, shape[-1])
    rounding = sized(to_grid, xq.size)

    def run(inputs, outputs):
        x = np.ascontiguousarray(inputs[0], np.float32)
        rounding(x.reshape(rows.shape), grid, rows)
        fn([xq] + list(inputs[1:]), outputs)
    return run


def convolution_float(node, ins, outs, weight, bias, grid=NO_GRID):
    """Float convolution; `grid` rounds its output to an int8 grid (see `grid.finish`)."""
    c = node.param["common"]
    n, cin, h, w = ins[0].shape
    _, cout, oh, ow = outs[0].shape
    kh, kw, sh, sw, dh, dw, t, l, b, r = _geometry(c, (h, w), (oh, ow))
    group = c.get("group", 1) or 1
    act = activation(c)
    padded = np.zeros((cin, h + t + b, w + l + r), np.float32) if (t or l or b or r) else None
    out_size = cout * oh * ow

    def pad(x):
        if padded is None:
            return x
        padded[:, t:t + h, l:l + w] = x
        return padded

    rounding = sized(to_grid, n * out_size)

    def regrid(y):     # for the paths whose own epilogue does not round to the grid
        if grid[1] > 0:
            flat = y.reshape(-1, y.shape[-1])
            rounding(flat, grid, flat)

    if group == cin == cout and group > 1:
        wd = np.ascontiguousarray(weight.reshape(cout, kh, kw))
        from . import dw3
        from .fgemm import epilogue_of
        if kh == kw == 3 and sh == sw and sh in (1, 2) and dh == dw == 1 and dw3.HAS_AVX512:
            w9, (epf, on_grid) = wd.reshape(-1), epilogue_of(act, grid)
            if sh == 1 and (oh, ow) == (h, w) and ow <= 8:
                # tiny maps as one flat run per channel (a 7-wide strip would leave 9 of 16 lanes idle)
                masks, offs = dw3.flat_masks(h, w, t, l)
                flat = sized(dw3.depthwise3x3_flat, out_size * 9)

                def run_dw3_flat(inputs, outputs):
                    for i in range(n):
                        flat(inputs[0][i], w9, bias, masks, offs, epf, on_grid, outputs[0][i])
                return writes(run_dw3_flat)
            if w >= dw3.ROWS_FROM_WIDTH:
                rows = sized(dw3.depthwise3x3, out_size * 9)

                def run_dw3_rows(inputs, outputs):
                    for i in range(n):
                        rows(inputs[0][i], w9, bias, sh, t, l, epf, on_grid, outputs[0][i])
                return writes(run_dw3_rows)
            strips, zrow = sized(dw3.depthwise3x3_strips, out_size * 9), np.zeros(w, np.float32)

            def run_dw3_strips(inputs, outputs):
                for i in range(n):
                    strips(inputs[0][i], w9, bias, sh, t, l, epf, on_grid, zrow, dw3.STRIP_ROWS, outputs[0][i])
            return writes(run_dw3_strips)
        if kh == kw == 3 and sh == sw == 1 and dh == dw == 1 and max(t, l, b, r) <= 2 and ow > 6:
            xp = np.zeros((cin, max(h + t + b, oh + 2), max(w + l + r, ow + 2)), np.float32)
            dw3 = sized(depthwise3x3_s1, out_size * 9)

            def run_dw3_s1(inputs, outputs):
                for i in range(n):
                    dw3(inputs[0][i], wd, bias, t, l, xp, outputs[0][i], act, grid)
            return writes(run_dw3_s1)
        if ow <= 16 and sh == sw and dh == dw == 1:        # small maps: vectorize over channels
            xp = np.zeros((max(h + t + b, (oh - 1) * sh + kh), max(w + l + r, (ow - 1) * sw + kw), cin), np.float32)
            yp = np.empty((oh, ow, cout), np.float32)
            wt = np.ascontiguousarray(wd.reshape(cout, kh * kw).T)
            hwc = sized(depthwise_hwc, out_size * kh * kw)

            def run_hwc(inputs, outputs):
                for i in range(n):
                    hwc(inputs[0][i], wt, bias, kh, kw, sh, t, l, xp, yp, outputs[0][i], act, grid)
            return writes(run_hwc)
        if kh == kw == 3 and sh == sw and sh in (1, 2) and dh == dw == 1 and max(t, l, b, r) <= 2:
            zrow = np.zeros(w, np.float32)
            rows3 = sized(depthwise3x3, out_size * 9)

            def run_dw3(inputs, outputs):
                for i in range(n):
                    rows3(inputs[0][i], wd, bias, sh, t, l, zrow, outputs[0][i], act, grid)
            return writes(run_dw3)

        def run_dw(inputs, outputs):
            x, y = inputs[0], outputs[0]
            for i in range(n):
                depthwise(pad(x[i]), wd, bias, sh, sw, dh, dw, y[i], act)
            regrid(y)
        return writes(run_dw)

    from .fgemm import HAS_AVX512, PackedGemm
    if kh == kw == 3 and sh == sw == 1 and dh == dw == 1 and group == 1 and cin >= 8 and cout >= 8 and HAS_AVX512:
        from .winograd import Winograd
        wino = Winograd(weight, bias, cin, h, w, oh, ow, t, l, act, grid)

        def run_wino(inputs, outputs):
            for i in range(n):
                wino(inputs[0][i], outputs[0][i])
        return writes(run_wino)

    fully_connected = kh == kw == 1 and h == w == oh == ow == 1 and group == 1     # a matmul's rows as a 1x1 conv
    if fully_connected and n == 1 and HAS_AVX512:
        from .gemv import MatVec      # batch 1: weights streamed from memory
        mv = MatVec(weight.reshape(cout, cin), bias, act)

        def run_matvec(inputs, outputs):
            y = outputs[0].reshape(cout)
            mv(inputs[0].reshape(cin), y)
            regrid(y)
        return writes(run_matvec)
    from .linear import SMALL_GEMM
    if fully_connected and HAS_AVX512 and n * cin * cout >= SMALL_GEMM:
        from .linear import RowGemm     # many rows (a transformer's tokens)
        rows = RowGemm(weight.reshape(cout, cin).T, bias, act, grid, n)

        def run_row_gemm(inputs, outputs):
            rows(inputs[0].reshape(n, cin), outputs[0].reshape(n, cout))
        return writes(run_row_gemm)
    if fully_connected:
        wt = np.ascontiguousarray(weight.T)

        def run_rows(inputs, outputs):
            y = outputs[0].reshape(n, cout)
            np.matmul(inputs[0].reshape(n, cin), wt, out=y)
            y += bias
            apply_act(y, act)
            regrid(y)
        return writes(run_rows)

    from .ocgemm import OcGemm, suits
    pointwise = kh == kw == 1 and sh == sw == 1 and padded is None and group == 1
    cg, og = cin // group, cout // group
    subsample = kh == kw == 1 and padded is None and group == 1 and (sh > 1 or sw > 1)
    if group == 1 and HAS_AVX512 and (pointwise or subsample):
        # a strided 1x1 convolution is a pointwise one on every sh-th row and sw-th column
        pixels = oh * ow
        packed = (OcGemm if suits(pixels, weight.nbytes) else PackedGemm)(weight, bias, act, grid, pixels)
        picked = np.empty((cin, oh, ow), np.float32) if subsample else None

        def run_pointwise(inputs, outputs):
            x, y = inputs[0], outputs[0]
            for i in range(n):
                if subsample:
                    np.copyto(picked, x[i, :, :(oh - 1) * sh + 1:sh, :(ow - 1) * sw + 1:sw])
                src = picked if subsample else x[i]
                packed(src.reshape(-1), pixels, y[i].reshape(-1), pixels)
        return writes(run_pointwise)
    if group == 1 and suits(oh * ow, weight.nbytes):
        # few output pixels (a 7x7 map): an im2col matrix (small here) and the channels-in-lanes GEMM
        cols_oc = np.empty((cin * kh * kw, oh * ow), np.float32)
        unfold_oc = sized(im2col, cols_oc.size)
        gemm_oc = OcGemm(weight, bias, act, grid, oh * ow)

        def run_im2col_oc(inputs, outputs):
            x, y = inputs[0], outputs[0]
            for i in range(n):
                unfold_oc(pad(x[i]), kh, kw, sh, sw, dh, dw, oh, ow, cols_oc)
                gemm_oc(cols_oc.reshape(-1), oh * ow, y[i].reshape(-1), oh * ow)
        return writes(run_im2col_oc)
    if group == 1 and HAS_AVX512:
        return _implicit_im2col(weight, bias, act, grid, (n, cin, h, w), (cout, oh, ow), (kh, kw, sh, sw, dh, dw, t, l, b, r))
    epilogue = sized(bias_act, out_size)
    wg = [np.ascontiguousarray(weight[k * og:(k + 1) * og]) for k in range(group)]
    cols = None if pointwise else np.empty((cg * kh * kw * group, oh * ow), np.float32)
    unfold = None if pointwise else sized(im2col, cols.size)

    def run(inputs, outputs):
        x, y = inputs[0], outputs[0]
        for i in range(n):
            yi = y[i].reshape(cout, oh * ow)
            if pointwise:
                np.matmul(weight, x[i].reshape(cin, h * w), out=yi)
            else:
                unfold(pad(x[i]), kh, kw, sh, sw, dh, dw, oh, ow, cols)
                if group == 1:
                    np.matmul(weight, cols, out=yi)
                else:
                    rows = cg * kh * kw
                    for k in range(group):
                        np.matmul(wg[k], cols[k * rows:(k + 1) * rows], out=yi[k * og:(k + 1) * og])
            epilogue(yi, bias, act, grid)
    return writes(run)


def _implicit_im2col(weight, bias, act, grid, in_shape, out_shape, geometry):
    """A group-1 convolution as tiles of `fgemm.conv_im2col` over the input's phase planes."""
    import numba

    from .fgemm import PackedGemm, conv_im2col, phase_split
    n, cin, h, w = in_shape
    cout, oh, ow = out_shape
    kh, kw, sh, sw, dh, dw, t, l, b, r = geometry
    pixels = oh * ow
    packed = PackedGemm(weight, bias, act, grid, pixels)
    threads = numba.get_num_threads()
    split = min(packed.nob, -(-2 * threads // packed.tiles)) if threads > 1 else 1
    implicit = sized(conv_im2col, packed.rows() * pixels * cin * kh * kw // 16)
    # phase planes big enough for every tap of every output pixel; their zero border is the padding
    hq = max(-(-(h + t + b) // sh), oh + (kh - 1) * dh // sh)
    wq = max(-(-(w + l + r) // sw), ow + (kw - 1) * dw // sw)
    phases = np.zeros((cin * sh * sw, hq, wq), np.float32)
    split_phases = sized(phase_split, cin * h * w)
    if ow >= 32 and packed.wp.size * 4 <= 256 * 1024:
        # wide output rows and weights that fit L2: tiles read the taps in place (no panel copy)
        from .fgemm import conv_rows, tap_offsets
        koff = tap_offsets(cin, kh, kw, sh, sw, dh, dw, hq, wq)
        rows = sized(conv_rows, packed.rows() * pixels * cin * kh * kw // 16)

        def run_rows(inputs, outputs):
            x, y = inputs[0], outputs[0]
            for i in range(n):
                split_phases(x[i], t, l, sh, sw, phases)
                rows(phases, koff, oh, ow, wq, packed.wp, cin * kh * kw, cout, packed.bias, packed.epf, packed.grid,
                     y[i].reshape(-1))
        return writes(run_rows)

    def run(inputs, outputs):
        x, y = inputs[0], outputs[0]
        for i in range(n):
            split_phases(x[i], t, l, sh, sw, phases)
            implicit(phases, cin, kh, kw, sh, sw, dh, dw, oh, ow, packed.wp, packed.kc, cout, split, packed.bias,
                     packed.epf, packed.grid, y[i].reshape(-1))
    return writes(run)


@kernel("Deconvolution", "DeconvolutionDepthwise")
def deconvolution(node, ins, outs):
    c = node.param["common"]
    n, cin, h, w = ins[0].shape
    _, cout, oh, ow = outs[0].shape
    kh, kw, sh, sw, dh, dw, t, l, b, r = _geometry(c, (h, w), (oh, ow))
    if c.get("padMode") == "SAME":
        total_h = (h - 1) * sh + dh * (kh - 1) + 1 - oh
        total_w = (w - 1) * sw + dw * (kw - 1) + 1 - ow
        t, l = max(total_h, 0) // 2, max(total_w, 0) // 2
    group = c.get("group", 1) or 1
    act = activation(c)
    cg, og = cin // group, cout // group
    weight = conv_weight(node.param, cin).reshape(cin, og * kh * kw)
    wt = [np.ascontiguousarray(weight[k * cg:(k + 1) * cg].T) for k in range(group)]   # (og*kh*kw, cg)
    bias = np.asarray(node.param.get("bias", np.zeros(cout)), np.float32).reshape(cout, 1, 1)
    ch = max((h - 1) * sh + dh * (kh - 1) + 1, t + oh)
    cw = max((w - 1) * sw + dw * (kw - 1) + 1, l + ow)
    canvas = np.zeros((cout, ch, cw), np.float32)
    cols = np.empty((cout * kh * kw, h * w), np.float32)

    def run(inputs, outputs):
        x, y = inputs[0], outputs[0]
        rows = og * kh * kw
        for i in range(n):
            xi = x[i].reshape(cin, h * w)
            for k in range(group):
                np.matmul(wt[k], xi[k * cg:(k + 1) * cg], out=cols[k * rows:(k + 1) * rows])
            canvas[:] = 0
            col2im(cols, kh, kw, sh, sw, dh, dw, h, w, canvas)
            y[i] = canvas[:, t:t + oh, l:l + ow]
            y[i] += bias
            apply_act(y[i], act)
    return writes(run)


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
