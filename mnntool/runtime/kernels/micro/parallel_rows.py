"""Parallel twins of the data-movement and memory-bound steps that ran NumPy on one core at any thread count
(issue 46 item 3: on a 16-core Xeon at 4 threads Permute, StridedSlice, Concat, broadcast BinaryOps,
LeakyReLU, a sum over a middle axis and PoolFormer's one-row LayerNorm ran x0.7-1.0 their one-thread
time, the data they read sitting in the other cores' caches after a parallel convolution).

Each kernel splits its output into `chunks` contiguous pieces, one a thread: runs of elements with edges
on 16-element boundaries (no cache line written by two threads), or runs of whole rows where there are
many (a row's bookkeeping stays out of the inner loop; a line may be shared at the one edge between two
threads). The copy and the binary op walk their operands through at most four merged axes (`geometry`:
offset and element strides of each operand over a common shape), so one kernel serves every
permutation, slice, concat piece and broadcast that merges to four axes. The ops' one-thread code
(NumPy) stays what one thread and small work run: these kernels compute the same IEEE operations in the
same order (a copy, one add/sub/mul/div an element, a sum in order over the middle axis), so their
output is bit-identical to it. The long-row LayerNorm is the exception: it is the kernel at every thread
count (its serial twin at one), its sums in fixed blocks whatever the thread count.
"""
from __future__ import annotations

import numpy as np

from ..compile.jit import njit, prange

ALIGN = 16          # chunk edges, in elements: a 64-byte line of float32 written by one thread only
COPY_TYPES = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}   # a copy moves bits: one kernel per size


def merge_axes(shape, strides_list):
    """(shape, [strides]) with size-1 axes dropped and neighbours merged where every operand allows it
    (stride[a] == stride[a + 1] * shape[a + 1]), padded in front to four axes; None past four."""
    keep = [a for a in range(len(shape)) if shape[a] != 1]
    dims, st = [], [[] for _ in strides_list]
    for a in keep:
        if dims and all(s[-1] == ss[a] * shape[a] for s, ss in zip(st, strides_list)):
            dims[-1] *= shape[a]
            for s, ss in zip(st, strides_list):
                s[-1] = ss[a]
        else:
            dims.append(int(shape[a]))
            for s, ss in zip(st, strides_list):
                s.append(int(ss[a]))
    if len(dims) > 4:
        return None
    pad = 4 - len(dims)
    return [1] * pad + dims, [[0] * pad + s for s in st]


def c_strides(shape) -> list[int]:
    """Element strides of a C-contiguous array of `shape`."""
    out, step = [], 1
    for d in reversed(shape):
        out.append(step)
        step *= int(d)
    return out[::-1]


def row_span(x: np.ndarray, rows: int, run: int):
    """(flat, step) for float32 `x` of `rows` x `run` elements laid out as rows of `run` contiguous elements
    `step` apart (a contiguous array: step == run; a split's or slice's view of the last axis: step > run):
    `flat` the 1-D contiguous view from x's first element over the span its rows lie in, which compiled
    loops index as r * step + j with no per-row view (a row slice a row cost ~12 ns: EfficientViT's
    division of (8, 196, 16) rows by their normaliser 20 us, 4 this way). None for any other layout."""
    if x.dtype != np.float32 or x.size != rows * run or not x.size:
        return None
    if x.flags.c_contiguous:
        return x.reshape(-1), run
    if any(st < 0 or st % 4 for st in x.strides):
        return None
    merged = merge_axes(list(x.shape), [[st // 4 for st in x.strides]])
    if merged is None:
        return None
    dims, (st,) = merged
    if dims[0] != 1 or dims[1] != 1 or dims[3] != run or st[3] != 1 or (dims[2] > 1 and st[2] < run):
        return None
    step = st[2] if dims[2] > 1 else run
    return np.lib.stride_tricks.as_strided(x, ((rows - 1) * step + run,), (4,)), step


class RowSpan:
    """row_span for one step's input, kept while the planner hands the same array (a split's views are bound
    once at prepare: the layout check and the view cost ~3 us, a call now ~0.1)."""

    def __init__(self, rows: int, run: int):
        self.rows, self.run, self.kept = rows, run, (None, None)

    def __call__(self, x: np.ndarray):
        src, got = self.kept        # one read: another thread may replace the pair meanwhile
        if src is not x:
            got = row_span(x, self.rows, self.run)
            self.kept = (x, got)
        return got


def geometry(offset: int, strides) -> np.ndarray:
    """An operand's [offset, four element strides] as the kernels read it."""
    return np.array([offset] + [int(s) for s in strides], np.int64)


@njit(cache=True, inline="always")
def _chunk(total, chunks, c):
    per = (total + chunks - 1) // chunks
    per = (per + ALIGN - 1) // ALIGN * ALIGN
    lo = min(total, c * per)
    return lo, min(total, lo + per)


@njit(cache=True, inline="always")
def _unravel(e, d1, d2, d3):
    """Flat index e over (d0, d1, d2, d3) -> (i0, i1, i2, j): its row's three indices and its column."""
    r = e // d3
    j = e - r * d3
    i2 = r % d2
    r //= d2
    return r // d1, r % d1, i2, j


@njit(cache=True, inline="always")
def _next_row(i0, i1, i2, d1, d2):
    """The row after (i0, i1, i2): the odometer of the three outer axes."""
    i2 += 1
    if i2 == d2:
        i2 = 0
        i1 += 1
        if i1 == d1:
            i1 = 0
            i0 += 1
    return i0, i1, i2


@njit(cache=True, inline="always")
def _copy_rows(src, dst, s0, s1, s2, s3, t0, t1, t2, t3, d1, d2, n, r, rows):
    """`rows` whole rows of n unit-stride elements from row r on, the offsets stepped along."""
    i0, i1, i2, _ = _unravel(r, d1, d2, 1)
    sb = s0 + i0 * s1 + i1 * s2 + i2 * s3
    db = t0 + i0 * t1 + i1 * t2 + i2 * t3
    un = np.uint64(n)
    for _ in range(rows):
        # unsigned flat indices: no negative-index wrap to test (slices of a row cost ~40% more on rows
        # of 8 floats)
        us, ud = np.uint64(sb), np.uint64(db)
        for j in range(un):
            dst[ud + j] = src[us + j]
        i0, i1, i2 = _next_row(i0, i1, i2, d1, d2)
        if i2 == 0:         # a new block of the third axis: its offsets anew
            sb = s0 + i0 * s1 + i1 * s2
            db = t0 + i0 * t1 + i1 * t2
        else:
            sb += s3
            db += t3


@njit(parallel=True, cache=True)
def copy_strided(src, sg, dst, dg, shape, chunks):
    """dst[dg] = src[sg] over `shape` (four axes; 1-D buffers of one element type, operands at
    offset + index . strides), split into `chunks` contiguous pieces of the output: whole rows where there
    are rows enough (rows of unit stride as fixed-length loops, the offsets stepped along: no division or
    product per row), else runs of elements (a few long rows)."""
    d1, d2, d3 = shape[1], shape[2], shape[3]
    rows = shape[0] * d1 * d2
    total = rows * d3
    s0, s1, s2, s3 = sg[0], sg[1], sg[2], sg[3]
    t0, t1, t2, t3 = dg[0], dg[1], dg[2], dg[3]
    u, v = sg[4], dg[4]
    if u == 1 and v == 1 and rows >= 4 * chunks:
        per = (rows + chunks - 1) // chunks
        for c in prange(chunks):
            lo = min(rows, c * per)
            _copy_rows(src, dst, s0, s1, s2, s3, t0, t1, t2, t3, d1, d2, d3, lo, min(rows, lo + per) - lo)
        return
    for c in prange(chunks):
        lo, hi = _chunk(total, chunks, c)
        if lo >= hi:
            continue
        i0, i1, i2, j0 = _unravel(lo, d1, d2, d3)
        e = lo
        while e < hi:
            j1 = min(d3, j0 + hi - e)
            sb = s0 + i0 * s1 + i1 * s2 + i2 * s3
            db = t0 + i0 * t1 + i1 * t2 + i2 * t3
            if u == 1 and v == 1:
                sr, dr = src[sb + j0:sb + j1], dst[db + j0:db + j1]
                for j in range(dr.shape[0]):
                    dr[j] = sr[j]
            else:
                for j in range(j0, j1):
                    dst[db + j * v] = src[sb + j * u]
            e += j1 - j0
            j0 = 0
            i0, i1, i2 = _next_row(i0, i1, i2, d1, d2)


BINARY_KINDS = {"ADD": 0, "SUB": 1, "MUL": 2, "REALDIV": 3, "DIV": 3}


@njit(inline="always")
def _op(x, y, kind):
    if kind == 0:
        return x + y
    if kind == 1:
        return x - y
    if kind == 2:
        return x * y
    return x / y


@njit(parallel=True, cache=True, error_model="numpy")
def binary_strided(a, ag, b, bg, out, og, shape, kind, chunks):
    """out = a (+ - * /) b over `shape` (float32 1-D buffers, operands at offset + index . strides; a
    broadcast axis has stride 0): NumPy's broadcast ufunc, one IEEE operation an element (no fastmath,
    x / 0 is inf or nan), in contiguous output chunks."""
    d1, d2, d3 = shape[1], shape[2], shape[3]
    total = shape[0] * d1 * d2 * d3
    a3, b3, o3 = ag[4], bg[4], og[4]
    for c in prange(chunks):
        lo, hi = _chunk(total, chunks, c)
        if lo >= hi:
            continue
        i0, i1, i2, j0 = _unravel(lo, d1, d2, d3)
        e = lo
        while e < hi:
            j1 = min(d3, j0 + hi - e)
            ab = ag[0] + i0 * ag[1] + i1 * ag[2] + i2 * ag[3]
            bb = bg[0] + i0 * bg[1] + i1 * bg[2] + i2 * bg[3]
            ob = og[0] + i0 * og[1] + i1 * og[2] + i2 * og[3]
            n = j1 - j0
            if a3 == 1 and o3 == 1 and b3 == 1:
                x, y, z = a[ab + j0:ab + j1], b[bb + j0:bb + j1], out[ob + j0:ob + j1]
                for j in range(n):
                    z[j] = _op(x[j], y[j], kind)
            elif a3 == 1 and o3 == 1 and b3 == 0:
                x, z, v = a[ab + j0:ab + j1], out[ob + j0:ob + j1], b[bb]
                for j in range(n):
                    z[j] = _op(x[j], v, kind)
            elif a3 == 0 and o3 == 1 and b3 == 1:
                y, z, v = b[bb + j0:bb + j1], out[ob + j0:ob + j1], a[ab]
                for j in range(n):
                    z[j] = _op(v, y[j], kind)
            else:
                for j in range(j0, j1):
                    out[ob + j * o3] = _op(a[ab + j * a3], b[bb + j * b3], kind)
            e += n
            j0 = 0
            i0, i1, i2 = _next_row(i0, i1, i2, d1, d2)


@njit(parallel=True, cache=True)
def leaky_flat(x, out, slope, chunks):
    """out = max(x, x * slope) for 0 < slope < 1 (NumPy's multiply then maximum, in one pass: NaN stays
    NaN, -0 stays -0) over flat float32 arrays, in contiguous chunks."""
    total = x.shape[0]
    for c in prange(chunks):
        lo, hi = _chunk(total, chunks, c)
        s, d = x[lo:hi], out[lo:hi]
        for j in range(s.shape[0]):
            v = s[j]
            y = v * slope
            d[j] = v if v > y else y


@njit(parallel=True, cache=True)
def sum_middle(x, out, chunks):
    """out[o, i] = x[o, 0, i] + x[o, 1, i] + ... in order (NumPy's sum over a middle axis of a contiguous
    array adds the slices one after another) over (O, K, I) into (O, I), in contiguous output chunks."""
    n_o, k, n_i = x.shape
    total = n_o * n_i
    for c in prange(chunks):
        lo, hi = _chunk(total, chunks, c)
        e = lo
        while e < hi:
            o = e // n_i
            i0 = e - o * n_i
            i1 = min(n_i, i0 + hi - e)
            d = out[o, i0:i1]
            s0 = x[o, 0, i0:i1]
            for j in range(d.shape[0]):
                d[j] = s0[j]
            for q in range(1, k):
                s = x[o, q, i0:i1]
                for j in range(d.shape[0]):
                    d[j] += s[j]
            e += i1 - i0


LONG_BLOCK = 4096       # elements a partial sum of the long-row LayerNorm covers, whatever the thread count


@njit(parallel=True, cache=True, fastmath=True)
def layer_norm_long(x, gamma, beta, eps, rms, out):
    """LayerNorm of each row of x (R, N) with N long and R small (PoolFormer's GroupNorm(1): one row of
    C*H*W): the mean's and the variance's sums in float64 over blocks of LONG_BLOCK elements in parallel,
    folded in block order, then the write in parallel."""
    rows, n = x.shape
    nb = (n + LONG_BLOCK - 1) // LONG_BLOCK
    part = np.empty(rows * nb, np.float64)
    for r in range(rows):
        src, dst = x[r], out[r]
        mean = 0.0
        if not rms:
            for b in prange(nb):
                s = src[b * LONG_BLOCK:min(n, (b + 1) * LONG_BLOCK)]
                t = 0.0
                for j in range(s.shape[0]):
                    t += s[j]
                part[r * nb + b] = t
            for b in range(nb):
                mean += part[r * nb + b]
            mean /= n
        for b in prange(nb):
            s = src[b * LONG_BLOCK:min(n, (b + 1) * LONG_BLOCK)]
            t = 0.0
            for j in range(s.shape[0]):
                d = s[j] - mean
                t += d * d
            part[r * nb + b] = t
        var = 0.0
        for b in range(nb):
            var += part[r * nb + b]
        inv = 1.0 / np.sqrt(var / n + eps)
        m32, i32 = np.float32(mean), np.float32(inv)
        for b in prange(nb):
            lo, hi = b * LONG_BLOCK, min(n, (b + 1) * LONG_BLOCK)
            s, d, g, bt = src[lo:hi], dst[lo:hi], gamma[lo:hi], beta[lo:hi]
            for j in range(s.shape[0]):
                d[j] = (s[j] - m32) * i32 * g[j] + bt[j]


@njit(parallel=True, cache=True)
def pad_rows(x, step, h, w, t, l, value, out, chunks):
    """out (B, OH, OW) = x's B planes of h rows of w floats (row r at x[r * step:]: ops/tensor.py pad_planes's
    input) placed at row t, column l, the rest `value` (pad_planes's output), split into `chunks` runs of
    whole output rows rather than planes: a map of few planes (an image's 3 channels; pad_planes's parallel
    loop is over B) keeps every thread busy. Flat unsigned indices (row views cost ~50 ns a row; Numba's
    negative-index wrap stops the vectorizer)."""
    nb, oh, ow = out.shape
    of = out.reshape(-1)
    ustep, uw, uow, ul, uh = np.uint64(step), np.uint64(w), np.uint64(ow), np.uint64(l), np.uint64(h)
    rows = nb * oh
    per = (rows + chunks - 1) // chunks
    for c in prange(chunks):
        for q in range(min(rows, c * per), min(rows, (c + 1) * per)):
            b = q // oh
            y = q - b * oh
            o = np.uint64(q) * uow
            iy = y - t
            if 0 <= iy < h:
                src = (np.uint64(b) * uh + np.uint64(iy)) * ustep
                for j in range(ul):
                    of[o + j] = value
                d = o + ul
                for j in range(uw):
                    of[d + j] = x[src + j]
                for j in range(ul + uw, uow):
                    of[o + j] = value
            else:
                for j in range(uow):
                    of[o + j] = value
