"""Max and average pooling (Numba, row-wise over a pre-padded canvas) and global pooling (Numba rows)."""
from __future__ import annotations

import numpy as np
from ..compile.jit import Bound, njit, prange

from .. import Kernel, kernel, sized, writes
from ..micro.epilogue import mnn_round


@njit(parallel=True, cache=True, fastmath=True)
def pool_rows(xp, kh, kw, sh, sw, is_max, inv_count, out):
    """Pooling over a pre-padded input (-inf for max, 0 for average), one output row at a time so that
    the inner loop reads a contiguous (stride 1) or evenly strided input row."""
    n, c = out.shape[0], out.shape[1]
    oh, ow = out.shape[2], out.shape[3]
    for nc in prange(n * c):
        b, ch = nc // c, nc % c
        for y in range(oh):
            row = out[b, ch, y]
            if is_max and kh == 2 and kw == 2 and sw == 1:
                # one pass (HGNetV2's 2x2/1 stem pool: five passes over the row took 3x onnxruntime's time)
                r0, r1 = xp[b, ch, y * sh], xp[b, ch, y * sh + 1]
                for x in range(ow):
                    row[x] = _mx(_mx(r0[x], r0[x + 1]), _mx(r1[x], r1[x + 1]))
                continue
            for x in range(ow):
                row[x] = -np.inf if is_max else 0.0
            for i in range(kh):
                src = xp[b, ch, y * sh + i]
                for j in range(kw):
                    if sw == 1:
                        if is_max:
                            for x in range(ow):
                                row[x] = _mx(row[x], src[x + j])
                        else:
                            for x in range(ow):
                                row[x] += src[x + j]
                    elif sw == 2:
                        if is_max:
                            for x in range(ow):
                                row[x] = _mx(row[x], src[2 * x + j])
                        else:
                            for x in range(ow):
                                row[x] += src[2 * x + j]
                    else:
                        for x in range(ow):
                            v = src[x * sw + j]
                            row[x] = _mx(row[x], v) if is_max else row[x] + v
            if not is_max:
                for x in range(ow):
                    row[x] *= inv_count[y, x]


@njit(parallel=True, cache=True, fastmath=True)
def pool2x2_s2(x, is_max, out):
    """2x2 stride-2 pooling with every window inside x (no padding, none past the end), one pass a row: the
    average is the four's sum times 1/4. pool_rows made six passes of strided reads and writes
    (NF-ResNet-26's 2x2/2 average pool of 256 x 56 x 56, in the model, 0.66 ms on the EPYC; alone, one thread:
    0.449 -> 0.137 ms, 64 x 112 x 112 0.380 -> 0.079 ms)."""
    n, c, oh, ow = out.shape
    for r in prange(n * c * oh):
        nc, y = r // oh, r % oh
        b, ch = nc // c, nc % c
        r0, r1, row = x[b, ch, 2 * y], x[b, ch, 2 * y + 1], out[b, ch, y]
        if is_max:
            for j in range(ow):
                row[j] = _mx(_mx(r0[2 * j], r0[2 * j + 1]), _mx(r1[2 * j], r1[2 * j + 1]))
        else:
            for j in range(ow):
                row[j] = (r0[2 * j] + r0[2 * j + 1] + r1[2 * j] + r1[2 * j + 1]) * np.float32(0.25)


@njit(cache=True, fastmath=True, inline="always")
def _mx(a, b):
    """max without the builtin's NaN handling, which keeps LLVM from vectorizing."""
    return a if a > b else b


@njit(parallel=True, cache=True, fastmath=True)
def max_pool3_s2(x, pt, pl, out):
    """3x3 stride-2 max pooling, padding read as -inf, on the input as it is (a padded copy of ResNet's
    3.2 MB stem output cost more than the pooling): each input row, copied into a -inf-bordered row in
    L1, gives its three-tap maxima once (into hm), then up to three rows of those per output row; both
    passes fuse their taps into one vector loop."""
    n, c, H, W = x.shape
    oh, ow = out.shape[2], out.shape[3]
    for nc in prange(n * c):
        b, ch = nc // c, nc % c
        hm = np.empty((H, ow), np.float32)
        line = np.full(max(2 * ow + 1, pl + W), -np.inf, np.float32)
        body = line[pl:pl + W]
        for yy in range(H):
            src, dst = x[b, ch, yy], hm[yy]
            for k in range(W):
                body[k] = src[k]
            for k in range(ow):
                dst[k] = _mx(_mx(line[2 * k], line[2 * k + 1]), line[2 * k + 2])
        for y in range(oh):
            row = out[b, ch, y]
            r = 2 * y - pt
            if 0 <= r and r + 2 < H:
                r0, r1, r2 = hm[r], hm[r + 1], hm[r + 2]
                for k in range(ow):
                    row[k] = _mx(_mx(r0[k], r1[k]), r2[k])
            else:
                for k in range(ow):
                    row[k] = -np.inf
                for i in range(3):
                    if 0 <= r + i < H:
                        ri = hm[r + i]
                        for k in range(ow):
                            row[k] = _mx(row[k], ri[k])


def pool_pads(p: dict, h, w, oh, ow, kh, kw, sh, sw):
    pads = p.get("pads")
    if p.get("padType") == "SAME":
        ph, pw = max((oh - 1) * sh + kh - h, 0), max((ow - 1) * sw + kw - w, 0)
        return ph // 2, pw // 2, ph - ph // 2, pw - pw // 2
    if p.get("padType") == "VALID":
        return 0, 0, 0, 0
    if pads is not None and len(pads) == 4:
        return tuple(int(v) for v in pads)
    return p.get("padY", 0), p.get("padX", 0), p.get("padY", 0), p.get("padX", 0)


@njit(cache=True, fastmath=True)
def global_pool(x, is_max, out):
    """out[r] = max or mean of row r: one vector reduction per row (numpy's mean over two axes took
    10x longer on MobileNetV2's 1280x7x7 head)."""
    for r in range(x.shape[0]):
        row = x[r]
        if is_max:
            m = row[0]
            for i in range(row.shape[0]):
                m = _mx(m, row[i])
            out[r] = m
        else:
            t = np.float32(0.0)
            for i in range(row.shape[0]):
                t += row[i]
            out[r] = t / row.shape[0]


@njit(parallel=True, cache=True)
def int8_average(x, grid, offset, kh, kw, sh, sw, pt, pl, out):
    """Average pooling as MNN's int8 kernel computes it: each value rounded to the output's grid and
    stored as a byte k + offset (offset = zero point + 128, x86's unsigned bytes), the bytes summed
    over the window clipped to the input, times 2^24 // count, shifted right by 24 (a floor), and
    the offset taken back off. The count never includes padding."""
    n, c, H, W = x.shape
    oh, ow = out.shape[2], out.shape[3]
    for nc in prange(n * c):
        b, ch = nc // c, nc % c
        for y in range(oh):
            y0 = y * sh - pt
            ya, yb = max(y0, 0), min(y0 + kh, H)
            for xo in range(ow):
                x0 = xo * sw - pl
                xa, xb = max(x0, 0), min(x0 + kw, W)
                total = np.int64(0)
                for i in range(ya, yb):
                    row = x[b, ch, i]
                    for j in range(xa, xb):
                        total += np.int64(min(max(mnn_round(row[j] * grid[0]), grid[2]), grid[3])) + offset
                count = max((yb - ya) * (xb - xa), 1)
                avg = (total * ((1 << 24) // count)) >> 24
                out[b, ch, y, xo] = np.float32(avg - offset) * grid[1]


def _int8_average(ins, outs) -> bool:
    """Whether MNN runs this average pooling on int8 bytes: its output has an int8 grid and its input
    either none (MNN quantizes it on the output's grid) or the same one. An input on another grid is
    dequantized and pooled in float (then the float path rounds like MNN)."""
    return outs[0].grid is not None and ins[0].grid in (None, outs[0].grid) and len(ins[0].shape) == 4


@kernel("Pooling")
def pooling(node, ins, outs, settings):
    p = node.param
    is_max = p.get("type", "MAXPOOL") == "MAXPOOL"
    if not is_max and _int8_average(ins, outs):
        h, w = ins[0].shape[2:]
        oh, ow = outs[0].shape[2:]
        if p.get("isGlobal"):
            kh, kw, sh, sw, pt, pl = h, w, h, w, 0, 0
        else:
            kh, kw, sh, sw = p["kernelY"], p["kernelX"], p["strideY"], p["strideX"]
            pt, pl = pool_pads(p, h, w, oh, ow, kh, kw, sh, sw)[:2]
        grid, offset = outs[0].grid, int(outs[0].zero) + 128
        from .int8_pool import covers, int8_average_2x2, int8_average_2x2_grid
        if covers(kh, kw, sh, sw, pt, pl, ins[0].shape, outs[0].shape):     # DenseNet's transitions
            if ins[0].grid == grid:     # its input on its grid: rint of the window's float sum (int8_pool)
                return Kernel(lambda i, o: int8_average_2x2_grid(np.ascontiguousarray(i[0], np.float32), grid, o[0]),
                              True, grid)
            return Kernel(lambda i, o: int8_average_2x2(np.ascontiguousarray(i[0], np.float32), grid, offset, o[0]),
                          True, grid)
        return Kernel(lambda i, o: int8_average(np.ascontiguousarray(i[0], np.float32), grid, offset,
                                                kh, kw, sh, sw, pt, pl, o[0]), True, grid)
    if p.get("isGlobal"):
        rows, gp = int(np.prod(ins[0].shape[:2])), Bound(global_pool)
        return writes(lambda i, o: gp(np.ascontiguousarray(i[0]).reshape(rows, -1), is_max, o[0].reshape(rows)))
    n, c, h, w = ins[0].shape
    oh, ow = outs[0].shape[2:]
    kh, kw, sh, sw = p["kernelY"], p["kernelX"], p["strideY"], p["strideX"]
    if min(kh, kw, sh, sw) < 1 or min(oh, ow) < 0:
        from ....errors import InvalidModel
        raise InvalidModel(f"Pooling '{node.name}': kernel {kh}x{kw}, stride {sh}x{sw} give a {oh}x{ow} output")
    pt, pl, pb, pr = pool_pads(p, h, w, oh, ow, kh, kw, sh, sw)
    count = p.get("countType", "DEFAULT")
    include = count == "INCLUDE_PADDING" or (count == "DEFAULT" and p.get("padType", "CAFFE") == "CAFFE")
    # the canvas covers every window, including ceil-mode windows that run past the padding
    ch, cw = max((oh - 1) * sh + kh, pt + h), max((ow - 1) * sw + kw, pl + w)
    # windows inside the input (no padding, none past the end: 2x2/2 pools, HGNetV2's 2x2/1): read in place,
    # no canvas copy (HGNetV2-B0's stem pool, 16 x 113 x 113: the copy cost more than the pooling)
    in_place = (pt, pl, ch, cw) == (0, 0, h, w)
    canvas = None if in_place else np.full((n, c, ch, cw), -np.inf if is_max else 0.0, np.float32)
    inv = np.ones((oh, ow), np.float32)
    if not is_max:
        ys, xs = np.arange(oh) * sh - pt, np.arange(ow) * sw - pl
        if include:   # Caffe / count_include_pad: the window clipped to the padded extent
            hy, wx = np.minimum(ys + kh, h + pb) - ys, np.minimum(xs + kw, w + pr) - xs
        else:
            hy = np.minimum(ys + kh, h) - np.maximum(ys, 0)
            wx = np.minimum(xs + kw, w) - np.maximum(xs, 0)
        inv = (1.0 / np.maximum(np.outer(hy, wx), 1)).astype(np.float32)

    if is_max and kh == kw == 3 and sh == sw == 2:
        from ..micro import depthwise3x3, depthwise_pairs
        from ..micro.float_gemm import IDENTITY
        if depthwise3x3.HAS_AVX512 and ow <= depthwise_pairs.ROW_MAX_WIDTH:     # a channel a call
            pairs, idx = sized(depthwise_pairs.max_pool3x3_s2_pairs, c * oh * ow * 9, settings.threads), \
                depthwise_pairs.pick_index(ow, 2)
            fill = np.full(w, -np.inf, np.float32)

            def run_pairs(i, o):
                x = np.ascontiguousarray(i[0])
                for b in range(n):
                    pairs(x[b], pt, pl, idx, IDENTITY, fill, o[0][b])
            return writes(run_pairs)
        if depthwise3x3.HAS_AVX512:      # the IR row kernel with max for FMA
            rows = sized(depthwise3x3.max_pool3x3_s2, c * oh * ow * 9, settings.threads)

            def run_ir(i, o):
                x = np.ascontiguousarray(i[0])
                for b in range(n):
                    rows(x[b], pt, pl, IDENTITY, o[0][b])
            return writes(run_ir)
        return writes(lambda i, o: max_pool3_s2(np.ascontiguousarray(i[0]), pt, pl, o[0]))

    if in_place and kh == kw == 2 and sh == sw == 2 and (is_max or np.all(inv == np.float32(0.25))):
        twos = sized(pool2x2_s2, n * c * oh * ow * 4, settings.threads)
        return writes(lambda i, o: twos(np.ascontiguousarray(i[0]), is_max, o[0]))
    windows = sized(pool_rows, n * c * oh * ow * kh * kw, settings.threads)

    def run(i, o):
        if in_place:
            windows(np.ascontiguousarray(i[0]), kh, kw, sh, sw, is_max, inv, o[0])
            return
        canvas[:, :, pt:pt + h, pl:pl + w] = i[0]
        windows(canvas, kh, kw, sh, sw, is_max, inv, o[0])
    return writes(run)


@kernel("Pooling3D")
def pooling3d(node, ins, outs, settings):
    if not node.param.get("isGlobal"):
        from ....errors import MnnToolError
        raise MnnToolError(f"Pooling3D '{node.name}': only global pooling is supported by the runtime")
    axes = tuple(range(2, len(ins[0].shape)))
    fn = np.max if node.param.get("type") == "MAXPOOL" else np.mean
    return writes(lambda i, o: fn(i[0], axis=axes, keepdims=True, out=o[0]))
