"""Normalizations and softmax: LayerNorm, Softmax, Reduction (Scale: scale.py)."""
from __future__ import annotations

import math

import numpy as np
from ..compile.jit import njit, prange

from ....ir.ops import as_table, params
from .. import PLAN_ONLY, direct, kernel, returns, sized, writes
from ..micro.exp_erf import EXP_FLOOR, exp_poly, exp_split


@njit(cache=True, fastmath=True, inline="always")
def _norm_row(src, gamma, beta, eps, rms, dst):
    n = src.shape[0]
    mean = 0.0
    if not rms:
        for j in range(n):
            mean += src[j]
        mean /= n
    var = 0.0
    for j in range(n):
        d = src[j] - mean
        var += d * d
    inv = 1.0 / np.sqrt(var / n + eps)
    m32, i32 = np.float32(mean), np.float32(inv)
    for j in range(n):
        dst[j] = (src[j] - m32) * i32 * gamma[j] + beta[j]


@njit(parallel=True, cache=True, fastmath=True)
def layer_norm_rows(x, gamma, beta, eps, rms, out):
    """out[r] = (x[r] - mean) / sqrt(var + eps) * gamma + beta (rms: no mean, mean square for var) over
    rows of (R, N): a pass for the mean, one for the variance about it, one to write; the sums in float64,
    which a sequential loop needs to match NumPy's pairwise float32 sums (NumPy's five passes with
    temporaries took 69 us on BERT's (128, 256) rows, this 13)."""
    for r in prange(x.shape[0]):
        _norm_row(x[r], gamma, beta, eps, rms, out[r])


@njit(parallel=True, cache=True, fastmath=True)
def add_layer_norm_rows(a, b, gamma, beta, eps, rms, total, out):
    """total = a + b, out = layer_norm_rows(total): a transformer's residual add and the LayerNorm that
    reads it (runtime.fusion.fuse_add_layer_norm) in one pass over the rows."""
    for r in prange(a.shape[0]):
        x, y, t = a[r], b[r], total[r]
        for j in range(t.shape[0]):
            t[j] = x[j] + y[j]
        _norm_row(t, gamma, beta, eps, rms, out[r])


def _norm_params(node, shape):
    """(axes, eps, gamma, beta, rms) of a LayerNorm node over a tensor of `shape`."""
    rank = len(shape)
    axes = tuple(sorted(int(a) % rank for a in node.param.get("axis", [-1])))
    gamma, beta = node.param.get("gamma"), node.param.get("beta")
    tail = tuple(shape[a] for a in axes)
    g = np.asarray(gamma, np.float32).reshape(tail) if gamma is not None and len(gamma) else None
    bt = np.asarray(beta, np.float32).reshape(tail) if beta is not None and len(beta) else None
    p = as_table(node.param, "LayerNorm")     # AddLayerNorm (the planner's) carries LayerNorm's table
    return axes, float(p["epsilon"]), g, bt, bool(p["useRMSNorm"])


class _Rows:
    """(R, n) views of the arrays of the run before, kept while the planner hands the same buffers
    (linear.RowGemm.step): the reshapes cost ~0.2 us each."""

    def __init__(self, n: int):
        self.n, self.src, self.view = n, None, None

    def __call__(self, x):
        if x is not self.src:
            self.src = x
            self.view = x.reshape(-1, self.n) if x.dtype == np.float32 and x.flags.c_contiguous else None
        return self.view if self.view is not None else np.ascontiguousarray(x, np.float32).reshape(-1, self.n)


@kernel("LayerNorm")
def layer_norm(node, ins, outs, settings):
    axes, eps, g, bt, rms = _norm_params(node, ins[0].shape)
    rank = len(ins[0].shape)
    if axes == (rank - 1,) and ins[0].shape[-1] > 0:
        n = ins[0].shape[-1]
        gv = g if g is not None else np.ones(n, np.float32)
        bv = bt if bt is not None else np.zeros(n, np.float32)
        r = int(np.prod(ins[0].shape)) // n
        example = np.empty((r, n), np.float32)
        from ..micro.parallel_rows import LONG_BLOCK, layer_norm_long     # a few long rows: blocks in parallel
        kern = layer_norm_long if r <= 4 and n >= 4 * LONG_BLOCK else layer_norm_rows
        rows = direct(sized(kern, r * n * 4, settings.threads), example, gv, bv, np.float32(eps), rms,
                      example)
        eps32 = np.float32(eps)
        src, dst = _Rows(n), _Rows(n)

        def run_rows(i, o):     # the last axis: one kernel, rows in parallel
            rows(src(i[0]), gv, bv, eps32, rms, dst(o[0]))
        return writes(run_rows)

    def run(i, o):
        x = i[0]
        if rms:
            var = np.mean(np.square(x), axis=axes, keepdims=True)
            np.multiply(x, 1.0 / np.sqrt(var + eps), out=o[0])
        else:
            mean = np.mean(x, axis=axes, keepdims=True)
            np.subtract(x, mean, out=o[0])
            var = np.mean(np.square(o[0]), axis=axes, keepdims=True)
            o[0] *= 1.0 / np.sqrt(var + eps)
        if g is not None:
            o[0] *= g
        if bt is not None:
            o[0] += bt
    return writes(run)


def add_layer_norm(node, ins, outs, settings):
    """runtime.fusion.fuse_add_layer_norm's step: outputs (a + b, LayerNorm of it over the last axis)."""
    _, eps, g, bt, rms = _norm_params(node, ins[0].shape)
    n = ins[0].shape[-1]
    gv = g if g is not None else np.ones(n, np.float32)
    bv = bt if bt is not None else np.zeros(n, np.float32)
    example = np.empty((int(np.prod(ins[0].shape)) // n, n), np.float32)
    rows = direct(sized(add_layer_norm_rows, example.size * 5, settings.threads), example, example, gv, bv,
                  np.float32(eps), rms, example, example)
    eps32 = np.float32(eps)
    views = [_Rows(n) for _ in range(4)]

    def run(i, o):
        rows(views[0](i[0]), views[1](i[1]), gv, bv, eps32, rms, views[2](o[0]), views[3](o[1]))
    return writes(run)


PLAN_ONLY["AddLayerNorm"] = add_layer_norm


@njit(parallel=True, cache=True, fastmath=True)
def softmax_rows(x, out, scale):
    """out[r] = softmax(scale * x[r]) (scale > 0, float32) over rows of (R, N), four loops a row and no
    temporaries: exp(t) for t = (x - max) * scale <= 0 is 2^k * e^f with k = round(t / ln 2),
    |f| <= ln2 / 2 (degree-6 Taylor, relative error 1.2e-7); 2^k is written as its bits into out first, so
    both loops vectorize (NumPy's five passes took 142 us on BERT's (4, 128, 128) scores)."""
    for r in prange(x.shape[0]):
        src, dst = x[r], out[r]
        bits = dst.view(np.int32)
        m = src[0]
        for j in range(src.shape[0]):
            m = max(m, src[j])
        for j in range(src.shape[0]):
            k, _ = exp_split(max((src[j] - m) * scale, EXP_FLOOR))
            bits[j] = (np.int32(k) + 127) << 23
        total = np.float32(0)
        for j in range(src.shape[0]):
            _, f = exp_split(max((src[j] - m) * scale, EXP_FLOOR))
            e = dst[j] * exp_poly(f)
            dst[j] = e
            total += e
        if total > 0:
            inv = np.float32(1) / total
            for j in range(src.shape[0]):
                dst[j] *= inv
        else:       # every element -inf (a fully masked row): NaN, as exp(x - max) / sum gives
            for j in range(src.shape[0]):
                dst[j] = np.nan


@njit(parallel=True, cache=True, fastmath={"nsz", "arcp", "contract", "afn", "reassoc"})
def softmax_columns(x, out, tile):
    """out[o, :, c] = softmax(x[o, :, c]) over the middle axis of (O, N, I) C-contiguous arrays (CoaT's
    factorized attention: softmax over 3136 tokens of 8-wide heads, which NumPy's five passes with
    temporaries ran at ~9 ns an element). Each (N, I) block is walked flat in chunks of `tile` floats
    (column_tile: a multiple of I and of 16, >= 256: column j % I of lane j), so every pass is a
    unit-stride loop over chunk views that vectorizes (16-float chunks or indices b + j ran scalar:
    5 ns an element); per-lane maxima and sums are folded to the I columns in between. exp as
    softmax_rows's (2^k bits, then e^f). No nnan/ninf: a column of -inf gives NaN, as exp(x - max) /
    sum does."""
    n, ci = x.shape[1], x.shape[2]
    size = n * ci
    for o in prange(x.shape[0]):
        src, dst = x[o].reshape(size), out[o].reshape(size)
        lane = np.full(tile, -np.inf, np.float32)
        for b in range(0, size, tile):
            s = src[b:b + tile]
            for j in range(s.shape[0]):
                v = s[j]
                if v > lane[j]:
                    lane[j] = v
        col = np.full(ci, -np.inf, np.float32)
        for j in range(tile):
            if lane[j] > col[j % ci]:
                col[j % ci] = lane[j]
        for j in range(tile):
            lane[j] = col[j % ci]
        total = np.zeros(tile, np.float32)
        for b in range(0, size, tile):
            s, d = src[b:b + tile], dst[b:b + tile]
            bits = d.view(np.int32)
            for j in range(s.shape[0]):
                k, _ = exp_split(max(s[j] - lane[j], EXP_FLOOR))
                bits[j] = (np.int32(k) + 127) << 23
            for j in range(s.shape[0]):
                _, f = exp_split(max(s[j] - lane[j], EXP_FLOOR))
                e = d[j] * exp_poly(f)
                d[j] = e
                total[j] += e
        sums = np.zeros(ci, np.float32)
        for j in range(tile):
            sums[j % ci] += total[j]
        for j in range(tile):
            t = sums[j % ci]
            lane[j] = np.float32(1) / t if t > 0 and col[j % ci] > -np.inf else np.float32(np.nan)
        for b in range(0, size, tile):
            d = dst[b:b + tile]
            for j in range(d.shape[0]):
                d[j] *= lane[j]


COLUMNS_MAX = 256     # inner widths softmax_columns takes (its per-lane scratch is up to 16x this)


def column_tile(inner: int) -> int:
    """The flat chunk softmax_columns walks: a multiple of lcm(inner, 16) floats, at least 256."""
    unit = inner * 16 // int(np.gcd(inner, 16))
    return unit * max(1, -(-256 // unit))


def row_softmax():
    """The row softmax for this host: the IR kernel with AVX-512 (softmax_ir), else the Numba loops."""
    from ..micro.llvm_ir import host_has
    if host_has("avx512f"):
        from ..micro.softmax_ir import softmax_rows_ir
        return softmax_rows_ir
    return softmax_rows


@kernel("Softmax")
def softmax(node, ins, outs, settings):
    shape = ins[0].shape
    axis = int(params(node)["axis"])
    if shape is not None and len(shape) and axis % len(shape) == len(shape) - 1 and shape[-1] > 0:
        example, one = np.empty((int(np.prod(shape)) // shape[-1], shape[-1]), np.float32), np.float32(1)
        rows = direct(sized(row_softmax(), example.size * 8, settings.threads), example, example, one)

        def run_rows(i, o):     # the last axis: rows in place
            n = shape[-1]
            rows(np.ascontiguousarray(i[0], np.float32).reshape(-1, n), o[0].reshape(-1, n), one)
        return writes(run_rows)

    if shape is not None and len(shape) and all(isinstance(d, int) and d > 0 for d in shape):
        ax = axis % len(shape)
        dims = (int(np.prod(shape[:ax])), shape[ax], int(np.prod(shape[ax + 1:])))
        if dims[1] > 1 and dims[2] <= COLUMNS_MAX:    # another axis: columns of (outer, n, inner) blocks
            tile = column_tile(dims[2])
            cols = direct(sized(softmax_columns, int(np.prod(dims)) * 8, settings.threads),
                          np.empty(dims, np.float32), np.empty(dims, np.float32), tile)

            def run_columns(i, o):
                cols(np.ascontiguousarray(i[0], np.float32).reshape(dims), o[0].reshape(dims), tile)
            return writes(run_columns)

    def run(i, o):
        np.subtract(i[0], np.max(i[0], axis=axis, keepdims=True), out=o[0])
        np.exp(o[0], out=o[0])
        o[0] /= np.sum(o[0], axis=axis, keepdims=True)
    return writes(run)


REDUCE = {"SUM": np.sum, "MEAN": np.mean, "MAXIMUM": np.max, "MINIMUM": np.min, "PROD": np.prod,
          "ANY": np.any, "ALL": np.all}


@njit(parallel=True, cache=True, fastmath=True)
def row_sums(x, scale, out):
    """out[r] = scale * sum(x[r, :]): a mean over trailing axes (squeeze-excite's global pool) in one
    pass at memory speed; NumPy's pairwise mean over axes (2, 3) took 50 us for 64x56x56 floats."""
    for r in prange(x.shape[0]):
        t = np.float32(0)
        for j in range(x.shape[1]):
            t += x[r, j]
        out[r] = t * scale


def _trailing_sum(shape: tuple, axes: tuple, op: str, outs, settings):
    """SUM/MEAN of float32 over the last axes as row sums, or None."""
    rank = len(shape)
    if op not in ("SUM", "MEAN") or not axes or axes != tuple(range(rank - len(axes), rank)) or \
            np.dtype(outs[0].dtype) != np.float32:
        return None
    cols = math.prod(int(shape[a]) for a in axes)      # (math.prod: np.prod cost ~4 us, planned at every new shape)
    rows = math.prod(int(d) for d in shape[:rank - len(axes)])
    if cols == 0 or rows == 0:
        return None
    scale = np.float32(1.0 / cols if op == "MEAN" else 1.0)
    fn = sized(row_sums, rows * cols, settings.threads)

    def run(i, o):
        x = np.ascontiguousarray(i[0], np.float32).reshape(rows, cols)
        fn(x, scale, o[0].reshape(rows))
    return writes(run)


@kernel("Reduction")
def reduction(node, ins, outs, settings):
    p = node.param
    op = p.get("operation", "SUM")
    keep = bool(p.get("keepDims", False))
    rank = len(ins[0].shape)
    dims = p.get("dim")
    if (dims is None or len(dims) == 0) and len(ins) > 1:
        dims = np.asarray(ins[1].value).reshape(-1)
    axes = tuple(sorted(int(d) % rank for d in dims)) if dims is not None and len(dims) else tuple(range(rank))
    dtype = np.dtype(outs[0].dtype)
    if ins[0].shape is not None and all(isinstance(d, int) for d in ins[0].shape) and ins[0].dtype == "float32" \
            and (k := _trailing_sum(tuple(ins[0].shape), axes, op, outs, settings)) is not None:
        return k
    if op == "ASUM":
        return returns(lambda i: [np.sum(np.abs(i[0]), axis=axes, keepdims=keep).astype(dtype)])
    if op == "SUMSQ":
        return returns(lambda i: [np.sum(np.square(i[0]), axis=axes, keepdims=keep).astype(dtype)])
    from .parallel_steps import sum_middle      # over a middle axis: threads, with the work for them
    if ins[0].dtype == "float32" and outs[0].shape is not None and \
            (par := sum_middle(ins[0].shape, axes, op, outs[0].shape, dtype, settings.threads)) is not None:
        return writes(par)
    fn = REDUCE[op]
    return returns(lambda i: [np.asarray(fn(i[0], axis=axes, keepdims=keep)).astype(dtype, copy=False)])
