"""The parallel form of steps whose one-thread code is NumPy (Permute, StridedSlice, Concat, broadcast
BinaryOps, LeakyReLU, a SUM over one middle axis): micro.parallel_rows's kernels, chosen at prepare where
the session has threads and the step has the work to pay for waking them (host_tuning.parallel_min_work);
otherwise None and the op keeps its NumPy code, which one thread and small work run as before (StridedSlice:
copy_strided's serial twin instead, faster than NumPy's strided copy; near the threshold a Permute times the
parallel copy against that twin too). The
kernels' output is bit-identical to that code's (the same IEEE operations in the same order), so a model
gives the same numbers at any thread count. Each run function takes C-contiguous operands as they come
from the planner's buffers and falls back to the NumPy code for any other (a strided view, an output
placed in a concat's slice)."""
from __future__ import annotations

import numpy as np

from ... import host_tuning
from .. import direct, serial
from ..step_timing import Timed, timed
from ..micro import parallel_rows as pr

# work units (kernels.sized: the host's threshold is measured on a logistic function of 4 units an element,
# ~0.35 ns an element on the 2-core EPYC VM, ~0.09 ns a unit) an element counts. One thread's cost there:
# a copy of unit-stride rows ~0.1 ns an element plus ~2 ns a row (CoaT's qkv permute, rows of 8 floats:
# 200 us for 602K elements; Swin's window permute, rows of 672: 35 us for 301K), LeakyReLU and the middle
# sum ~0.1 ns an element, a broadcast binary op 0.11-0.14
COPY_WORK = 1
STRIDED_COPY_WORK = 2
ROW_WORK = 24
BINARY_WORK = 2
LEAKY_WORK = 1


def copy_work(dims, unit: bool) -> int:
    """Work units of a copy over merged `dims` (four axes), its rows unit-stride or not."""
    size = int(np.prod(dims))
    return size * (COPY_WORK if unit else STRIDED_COPY_WORK) + ROW_WORK * (size // max(1, dims[-1]))


def pays(work: int, threads: int) -> bool:
    """Whether `work` runs in parallel at `threads` (below: the op's one-thread code), or may: near the
    threshold the step times both forms on its first calls and keeps the faster (`_chosen`)."""
    if threads <= 1:
        return False
    threshold = host_tuning.parallel_min_work(threads)
    return work >= threshold or timed(work, threshold)


def _chosen(run, numpy_run, work: int, threads: int):
    """`run` (the parallel kernel's), or, for work near the host's threshold, a step_timing.Timed of it and
    the NumPy code: the step keeps whichever its first calls found faster (no step slower at more
    threads than at one)."""
    threshold = host_tuning.parallel_min_work(threads)
    return Timed(run, numpy_run, 0 if work >= threshold else 1) if timed(work, threshold) else run


def _dtype(d):
    """NumPy's dtype for a tensor's dtype, or None (unknown, or a type NumPy does not name: MNN's strings)."""
    if d is None:
        return None
    try:
        return np.dtype(d)
    except TypeError:
        return None


def _known(*shapes) -> bool:
    return all(s is not None and all(isinstance(d, int) and d >= 0 for d in s) for s in shapes)


class _Flat:
    """The flat view (as `dtype`) of the array of the run before, kept while the planner hands the same
    buffer: a reshape and a view cost ~0.5 us a call."""

    def __init__(self, dtype):
        self.dtype, self.pair = np.dtype(dtype), (None, None)

    def __call__(self, x):
        src, flat = self.pair       # one read: another thread may replace the pair meanwhile
        if src is not x:
            flat = x.reshape(-1).view(self.dtype)
            self.pair = (x, flat)
        return flat


def _copy_kernel(shape, src_strides, dst_strides, itemsize: int, threads: int, one_thread: bool = False):
    """copy_strided bound for one geometry: (parallel call or None, serial twin's call, merged shape, source and
    output strides, work), or None: no parallel call unless the work pays for threads, and then None unless
    `one_thread` (a copy that runs the serial twin: rows as fixed-length loops, 2.5x NumPy's strided copy on
    rows of 16 floats, EfficientViT's slice of (8, 196, 17) to 16: 10.1 -> 3.9 us, never slower in the shapes
    tried up to rows of 1024)."""
    merged = pr.merge_axes(list(shape), [list(src_strides), list(dst_strides)])
    kind = pr.COPY_TYPES.get(itemsize)
    if merged is None or kind is None:
        return None
    dims, (ss, ds) = merged
    work = copy_work(dims, ss[-1] == 1 and ds[-1] == 1)
    par = threads > 1 and pays(work, threads)
    if not par and not one_thread:
        return None
    shape4 = np.array(dims, np.int64)
    example = np.empty(1, kind)
    sg, dg = pr.geometry(0, ss), pr.geometry(0, ds)
    one = direct(serial(pr.copy_strided), example, sg, example, dg, shape4, 1)
    fn = direct(pr.copy_strided, example, sg, example, dg, shape4, threads) if par else None
    return fn, one, shape4, ss, ds, work


def permute(shape, perm, dtype, threads: int, serial=None):
    """A run(i, o) for a Permute of a C-contiguous input, or None. `serial`: the op's own one-thread run,
    which a step near the threshold times against the parallel copy (default: copy_strided's serial twin)."""
    if threads <= 1 or not _known(shape) or dtype is None:
        return None
    dtype = _dtype(dtype)
    if dtype is None:
        return None
    st = pr.c_strides(shape)
    out_shape = [shape[a] for a in perm]
    k = _copy_kernel(out_shape, [st[a] for a in perm], pr.c_strides(out_shape), dtype.itemsize, threads)
    if k is None:
        return None
    run, serial_run = _copy_runs(k, 0, dtype, threads, lambda i, o: np.copyto(o[0], i[0].transpose(perm)))
    return _chosen(run, serial or serial_run, k[-1], threads)


def _copy_runs(k, offset: int, dtype, threads: int, numpy_run):
    """(parallel run or None, serial run) for a `_copy_kernel` result k whose source starts `offset` bytes into
    x: each run(i, o) copies with copy_strided where x and y are C-contiguous of `dtype`, else numpy_run."""
    fn, one, shape4, ss, ds, _ = k
    sg, dg = pr.geometry(offset, ss), pr.geometry(0, ds)
    kind = pr.COPY_TYPES[dtype.itemsize]
    src, dst = _Flat(kind), _Flat(kind)

    def usable(x, y):
        return x.dtype == dtype and y.dtype == dtype and x.flags.c_contiguous and y.flags.c_contiguous

    def copying(code, count):
        def run(i, o):
            x, y = i[0], o[0]
            if not usable(x, y):
                numpy_run(i, o)
                return
            code(src(x), sg, dst(y), dg, shape4, count)
        return run
    return (copying(fn, threads) if fn is not None else None), copying(one, 1)


def strided_slice(shape, index, out_shape, dtype, threads: int):
    """A run(i, o) for x[index] of a C-contiguous x into the output, or None: at one thread (and below the
    threshold) copy_strided's serial twin, above it the parallel copy, near it the faster of the two."""
    if not _known(shape, out_shape) or dtype is None:
        return None
    dtype = _dtype(dtype)
    if dtype is None:
        return None
    st = pr.c_strides(shape)
    probe = np.lib.stride_tricks.as_strided(np.zeros(1, np.int8), shape=tuple(shape), strides=tuple(st))
    view = probe[index]
    if tuple(view.shape) != tuple(out_shape) or view.size == 0:
        return None
    offset = view.__array_interface__["data"][0] - probe.__array_interface__["data"][0]
    k = _copy_kernel(view.shape, view.strides, pr.c_strides(out_shape), dtype.itemsize, threads, one_thread=True)
    if k is None:
        return None
    run, serial_run = _copy_runs(k, offset, dtype, threads, lambda i, o: np.copyto(o[0], i[0][index]))
    return serial_run if run is None else _chosen(run, serial_run, k[-1], threads)


def concat(in_shapes, axis: int, out_shape, dtype, threads: int):
    """A run(i, o) for a Concat of C-contiguous inputs of one dtype into a C-contiguous output, or None."""
    if threads <= 1 or not _known(out_shape, *in_shapes) or dtype is None or not in_shapes:
        return None
    dtype = _dtype(dtype)
    if dtype is None:
        return None
    ost = pr.c_strides(out_shape)
    pieces, at = [], 0
    for s in in_shapes:
        if len(s) != len(out_shape):
            return None
        if int(np.prod(s)):
            merged = pr.merge_axes(list(s), [pr.c_strides(s), ost])
            if merged is None or pr.COPY_TYPES.get(dtype.itemsize) is None:
                return None
            dims, (ss, ds) = merged
            pieces.append((np.array(dims, np.int64), pr.geometry(0, ss), pr.geometry(at * ost[axis], ds)))
        else:
            pieces.append(None)
        at += s[axis]
    work = sum(copy_work(p[0], True) for p in pieces if p is not None)
    if at != out_shape[axis] or not pays(work, threads):
        return None
    kind = pr.COPY_TYPES[dtype.itemsize]
    example = np.empty(1, kind)
    live = [p for p in pieces if p is not None]
    if not live:
        return None
    fn = direct(pr.copy_strided, example, live[0][1], example, live[0][2], live[0][0], threads)
    flats = [_Flat(kind) for _ in pieces]
    dst = _Flat(kind)

    def numpy_run(i, o):
        np.concatenate([np.asarray(a).astype(o[0].dtype, copy=False) for a in i], axis=axis, out=o[0])

    def run(i, o):
        y = o[0]
        if y.dtype != dtype or not y.flags.c_contiguous or \
                any(a.dtype != dtype or not a.flags.c_contiguous for a in i):
            numpy_run(i, o)
            return
        yf = dst(y)
        for a, p, f in zip(i, pieces, flats):
            if p is not None:
                fn(f(a), p[1], yf, p[2], p[0], threads)
    return _chosen(run, numpy_run, work, threads)


def shuffle(in_shape, k: int, dtype, threads: int, numpy_run):
    """A run(i, o) for a ChannelShuffle of k C-contiguous (n, c, ...) inputs into (n, c * k, ...) (input a's
    channel j to output channel j * k + a: k copies of rows of a plane, k planes apart), or None; near the
    threshold timed against `numpy_run`, the op's one-thread code (FastViT's shuffles ran x0.67 at 4 threads
    on the Xeon, NumPy on one core with the data in the others' caches)."""
    if threads <= 1 or k < 1 or not _known(in_shape) or len(in_shape) < 2 or dtype is None:
        return None
    dtype = _dtype(dtype)
    if dtype is None or pr.COPY_TYPES.get(dtype.itemsize) is None:
        return None
    n, c = in_shape[:2]
    plane = int(np.prod(in_shape[2:]))
    if not n * c * plane:
        return None
    merged = pr.merge_axes([n, c, plane], [[c * plane, plane, 1], [c * k * plane, k * plane, 1]])
    if merged is None:
        return None
    dims, (ss, ds) = merged
    work = k * copy_work(dims, True)
    if not pays(work, threads):
        return None
    kind = pr.COPY_TYPES[dtype.itemsize]
    shape4, sg = np.array(dims, np.int64), pr.geometry(0, ss)
    dgs = [pr.geometry(a * plane, ds) for a in range(k)]
    example = np.empty(1, kind)
    fn = direct(pr.copy_strided, example, sg, example, dgs[0], shape4, threads)
    flats, dst = [_Flat(kind) for _ in range(k)], _Flat(kind)

    def run(i, o):
        y = o[0]
        if y.dtype != dtype or not y.flags.c_contiguous or \
                any(a.dtype != dtype or not a.flags.c_contiguous for a in i):
            numpy_run(i, o)
            return
        yf = dst(y)
        for a in range(k):
            fn(flats[a](i[a]), sg, yf, dgs[a], shape4, threads)
    return _chosen(run, numpy_run, work, threads)


def binary(op: str, ins, outs, threads: int):
    """A run(i, o) for a float32 ADD/SUB/MUL/DIV with NumPy broadcasting (no fused activation), or None."""
    if threads <= 1 or op not in pr.BINARY_KINDS or len(ins) != 2 or \
            any(_dtype(v.dtype) != np.float32 for v in list(ins) + list(outs)):
        return None
    shapes = [tuple(v.shape) if v.shape is not None else None for v in ins]
    out_shape = tuple(outs[0].shape) if outs[0].shape is not None else None
    if not _known(out_shape, *shapes) or any(len(s) > len(out_shape) for s in shapes):
        return None
    try:
        if np.broadcast_shapes(*shapes) != out_shape:
            return None
    except ValueError:
        return None
    size = int(np.prod(out_shape))
    if not size or not pays(size * BINARY_WORK, threads):
        return None
    strides = []
    for s in shapes:
        full = (1,) * (len(out_shape) - len(s)) + s
        st = pr.c_strides(full)
        strides.append([0 if d == 1 and od != 1 else x for d, od, x in zip(full, out_shape, st)])
    merged = pr.merge_axes(list(out_shape), strides + [pr.c_strides(out_shape)])
    if merged is None:
        return None
    dims, (sa, sb, so) = merged
    shape4, ag, bg, og = np.array(dims, np.int64), pr.geometry(0, sa), pr.geometry(0, sb), pr.geometry(0, so)
    kind = pr.BINARY_KINDS[op]
    example = np.empty(1, np.float32)
    fn = direct(pr.binary_strided, example, ag, example, bg, example, og, shape4, kind, threads)
    fa, fb, fo = _Flat(np.float32), _Flat(np.float32), _Flat(np.float32)
    ufunc = {0: np.add, 1: np.subtract, 2: np.multiply, 3: np.true_divide}[kind]

    def numpy_run(i, o):
        ufunc(i[0], i[1], out=o[0])

    def run(i, o):
        a, b, y = i[0], i[1], o[0]
        if a.dtype != np.float32 or b.dtype != np.float32 or not (a.flags.c_contiguous and b.flags.c_contiguous
                                                                   and y.flags.c_contiguous):
            ufunc(a, b, out=y)
            return
        fn(fa(a), ag, fb(b), bg, fo(y), og, shape4, kind, threads)
    return _chosen(run, numpy_run, size * BINARY_WORK, threads)


def leaky(shape, slope: float, dtype, threads: int):
    """A run(i, o) for LeakyReLU (0 < slope < 1) of a float32 tensor, or None."""
    if threads <= 1 or not _known(shape) or _dtype(dtype) != np.float32 or not 0 < slope < 1:
        return None
    size = int(np.prod(shape))
    if not pays(size * LEAKY_WORK, threads):
        return None
    s32 = np.float32(slope)
    example = np.empty(size, np.float32)
    fn = direct(pr.leaky_flat, example, example, s32, threads)
    fx, fy = _Flat(np.float32), _Flat(np.float32)

    def numpy_run(i, o):
        np.multiply(i[0], slope, out=o[0])
        np.maximum(i[0], o[0], out=o[0])

    def run(i, o):
        x, y = i[0], o[0]
        if x.dtype != np.float32 or not x.flags.c_contiguous or not y.flags.c_contiguous:
            numpy_run(i, o)
            return
        fn(fx(x), fy(y), s32, threads)
    return _chosen(run, numpy_run, size * LEAKY_WORK, threads)


def sum_middle(shape, axes, op: str, out_shape, dtype, threads: int):
    """A run(i, o) for a float32 SUM over one axis that is neither first-only nor last, or None."""
    if threads <= 1 or op != "SUM" or len(axes) != 1 or not _known(shape, out_shape) or \
            _dtype(dtype) != np.float32:
        return None
    ax = axes[0]
    outer, k, inner = int(np.prod(shape[:ax])), shape[ax], int(np.prod(shape[ax + 1:]))
    if inner < 16 or k < 2 or int(np.prod(out_shape)) != outer * inner or not pays(outer * k * inner, threads):
        return None
    fn = direct(pr.sum_middle, np.empty((outer, k, inner), np.float32), np.empty((outer, inner), np.float32),
                threads)

    def numpy_run(i, o):
        o[0][...] = np.sum(i[0], axis=ax).reshape(o[0].shape)

    def run(i, o):
        x, y = i[0], o[0]
        if x.dtype != np.float32 or not x.flags.c_contiguous or not y.flags.c_contiguous:
            numpy_run(i, o)
            return
        fn(x.reshape(outer, k, inner), y.reshape(outer, inner), threads)
    return _chosen(run, numpy_run, outer * k * inner, threads)


def pad(b: int, h: int, w: int, oh: int, ow: int, threads: int):
    """A call(x, step, h, w, t, l, value, out (B, OH, OW)) (pad_planes's) for a constant pad of the last two axes
    of a map of fewer planes than 2 a thread, split by output rows (pad_rows), or None (pad_planes splits
    planes)."""
    if threads <= 1 or not b * oh * ow or b >= 2 * threads or \
            b * oh * ow * COPY_WORK < host_tuning.parallel_min_work(threads):    # (untimed: a bare call)
        return None
    fn = direct(pr.pad_rows, np.empty(1, np.float32), 0, 0, 0, 0, 0, np.float32(0), np.empty((b, oh, ow), np.float32),
                threads)
    return lambda x, step, h_, w_, t, l, value, out: fn(x, step, h_, w_, t, l, value, out, threads)
