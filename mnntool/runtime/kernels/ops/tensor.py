"""Data-movement kernels that beat the op definitions' numpy: views for reshapes, joins and splits into
planned buffers, slices whose index tuples are built once, permutes by one choice of kernel
(`permute_kernel`), a gather of one block as a view and of rows in one pass, constant padding of the last
two axes row by row. Other gathers, other padding, shape ops and the rest run their definitions
(ir/ops/tensor.py)."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
from ..compile.jit import Bound, njit, prange

from ....ir.ops.tensor import reshape_dims, split_points, strided_index
from ....ir.ops import params
from .. import PLAN_ONLY, by_definition, kernel, returns, views, writes
from . import parallel_steps


def _ints(v) -> list[int]:
    return [int(x) for x in np.asarray(v).reshape(-1)]


@kernel("ConvertTensor", "Identity", "Dropout")
def passthrough(node, ins, outs, settings):
    return views(lambda i: [i[0]])


@kernel("Reshape")
def reshape(node, ins, outs, settings):
    out_shape = tuple(outs[0].shape)
    if all(isinstance(d, int) for d in out_shape):
        return views(lambda i: [i[0].reshape(out_shape)])
    return returns(lambda i: [i[0].reshape(reshape_dims(i[0].shape, _ints(i[1] if len(i) > 1 else node.param["dims"])))])


@kernel("Flatten")
def flatten(node, ins, outs, settings):
    shape = tuple(outs[0].shape)
    return views(lambda i: [i[0].reshape(shape)])


# A permute that keeps the last axis in place, with runs of this many float32s along it, copies each run
# as one wider element: numpy's strided loop pays per element (MobileViT's unfold, (1024, 2, 16, 2) ->
# (1024, 16, 2, 2): 159 -> 22 us; (1024, 16, 2, 2) back: 168 -> 58 us)
WIDE_RUNS = {2: np.float64, 4: np.complex128}


@kernel("Permute")
def permute(node, ins, outs, settings):
    """The kernel `permute_kernel` chooses."""
    return writes(permute_kernel(ins[0].shape, _ints(node.param["dims"]), ins[0].dtype, settings.threads)[1])


def permute_kernel(shape, perm, dtype, threads: int) -> tuple[str, Callable]:
    """The one choice of a Permute's kernel at prepare, (name, run(i, o)): the first that applies of
    - "wide": float32 keeping a last axis of 2 or 4: NumPy's copy with each run as one float64/complex128
      (WIDE_RUNS: its strided loop pays per element, so fewer, wider ones), at any thread count;
    - "blocked": float32 that is a batched 2-D transpose with both sides at least MIN_SIDE: register blocks
      (micro.transpose, 3-20x NumPy's copy), parallel over the batch where `sized` finds the work pays;
    - "parallel_copy": more than one thread and a copy whose work parallel_steps finds pays for waking them,
      any dtype (parallel_steps.permute: micro.parallel_rows.copy_strided in output chunks, four merged axes);
    - "runs": float32 keeping runs of RUN_MIN to RUN_MAX floats last: permute_runs, one loop a run. At one
      thread; at more only where the parallel copy did not apply: work below the threshold (then its serial
      twin), or five merged axes (past the copy's four);
    - "numpy": the rest, NumPy's copy of the transposed view: runs over RUN_MAX floats (memcpy a run beats
      the loop), a moved last axis, other dtypes at one thread, shapes unknown at prepare.
    Every branch gives NumPy's values exactly (copies), so the choice changes speed only."""
    if (run := _wide_runs(shape, perm, dtype)) is not None:
        return "wide", run
    if (run := _blocked_transpose(shape, perm, dtype, threads)) is not None:
        return "blocked", run
    if threads > 1 and (run := parallel_steps.permute(shape, perm, dtype, threads)) is not None:
        return "parallel_copy", run
    if (run := _run_permute(shape, perm, dtype, threads)) is not None:
        return "runs", run
    return "numpy", lambda i, o: np.copyto(o[0], i[0].transpose(perm))


def _wide_runs(shape, perm, dtype):
    """A float32 Permute that keeps a last axis of 2 or 4 floats as a copy of wider elements; None otherwise."""
    if shape is None or len(shape) < 2 or perm[-1] != len(shape) - 1 or str(dtype) != "float32" or \
            not isinstance(shape[-1], int) or shape[-1] not in WIDE_RUNS:
        return None
    wide = WIDE_RUNS[shape[-1]]

    def run_wide(i, o):
        x = i[0]
        if x.dtype == np.float32 and x.strides[-1] == 4 and o[0].flags.c_contiguous:
            np.copyto(o[0].view(wide), x.view(wide).transpose(perm))
        else:
            np.copyto(o[0], x.transpose(perm))
    return run_wide


@njit(parallel=True, cache=True)
def permute_runs(x, out, shape, steps, run):
    """out = x permuted where the permute keeps a contiguous run of `run` floats last: the output's
    runs in order, the k-th of them read at sum(i_a * steps[a]) over the four outer output axes
    (`shape`, padded with 1s). NumPy's strided copy pays per element: attention's qkv split
    (1, 3137, 3, 8, 8) -> (3, 1, 8, 3137, 8), 456 -> 238 us."""
    xf, of = x.reshape(-1), out.reshape(-1)
    n0, n1, n2, n3 = shape[0], shape[1], shape[2], shape[3]
    inner = n1 * n2 * n3 * run
    for i0 in prange(n0):
        o = i0 * inner
        for i1 in range(n1):
            for i2 in range(n2):
                s = i0 * steps[0] + i1 * steps[1] + i2 * steps[2]
                for _ in range(n3):
                    src, dst = xf[s:s + run], of[o:o + run]
                    for j in range(run):
                        dst[j] = src[j]
                    s += steps[3]
                    o += run


def permute_groups(shape: tuple, perm: tuple) -> tuple | None:
    """(outer sizes, their steps in elements, run) for permute_runs: size-1 axes dropped, axes that stay
    neighbours merged; None unless the last merged group ends with the last input axis and at most four
    groups come before it."""
    keep = [a for a in range(len(shape)) if shape[a] != 1]
    if not keep:
        return None
    groups = []
    for a in (a for a in perm if shape[a] != 1):
        if groups and groups[-1][-1] + 1 == a:
            groups[-1].append(a)
        else:
            groups.append([a])
    if groups[-1][-1] != keep[-1] or len(groups) > 5:
        return None
    stride = {}
    step = 1
    for a in range(len(shape) - 1, -1, -1):
        stride[a] = step
        step *= shape[a]
    size = lambda g: int(np.prod([shape[a] for a in g]))    # noqa: E731
    outer = groups[:-1]
    sizes = [1] * (4 - len(outer)) + [size(g) for g in outer]
    steps = [0] * (4 - len(outer)) + [stride[g[-1]] for g in outer]
    return np.array(sizes, np.int64), np.array(steps, np.int64), size(groups[-1])


def _run_permute(shape, perm, dtype, threads: int):
    """A float32 Permute that keeps runs of the last axis (RUN_MIN to RUN_MAX floats) as permute_runs; None
    otherwise."""
    from .. import sized
    if shape is None or str(dtype) != "float32" or not all(isinstance(d, int) for d in shape) or \
            int(np.prod(shape)) == 0:
        return None
    g = permute_groups(tuple(shape), tuple(perm))
    if g is None or not RUN_MIN <= g[2] <= RUN_MAX:
        return None
    sizes, steps, run = g
    fn = sized(permute_runs, int(np.prod(shape)), threads)

    def run_permute(i, o):
        x = i[0]
        if x.dtype != np.float32 or not x.flags.c_contiguous or not o[0].flags.c_contiguous:
            np.copyto(o[0], x.transpose(perm))
            return
        fn(x.reshape(-1), o[0].reshape(-1), sizes, steps, run)
    return run_permute


RUN_MIN = 5     # shorter runs: WIDE_RUNS's wider elements (2, 4) or NumPy's copy
RUN_MAX = 64    # longer runs: NumPy's copy (memcpy a run: Swin's window partitions, runs of 96-5376 floats,
                # 1.0-2.3x faster there than the copy loop)


def _blocked_transpose(shape, perm, dtype, threads: int):
    """A float32 Permute that is a batched 2-D transpose of rows and columns both at least MIN_SIDE long, in
    register blocks (micro.transpose: 3-20x NumPy's copy of the transposed view); None otherwise."""
    from .. import sized
    from ..micro.transpose import MIN_SIDE, as_batched_transpose, transpose_blocks
    if shape is None or str(dtype) != "float32" or not all(isinstance(d, int) for d in shape):
        return None
    brc = as_batched_transpose(tuple(shape), tuple(perm))
    if brc is None or min(brc[1:]) < MIN_SIDE:
        return None
    b, r, c = brc
    fn = sized(transpose_blocks, b * r * c, threads)

    def run(i, o):
        x = i[0]
        if x.dtype != np.float32 or not x.flags.c_contiguous or not o[0].flags.c_contiguous:
            np.copyto(o[0], x.transpose(perm))
            return
        fn(x.reshape(b, r, c), o[0].reshape(b, c, r))
    return run


@kernel("Squeeze", "Unsqueeze", "ExpandDims")
def squeeze(node, ins, outs, settings):
    shape = tuple(outs[0].shape)
    return views(lambda i: [i[0].reshape(shape)])


@kernel("BroadcastTo")
def broadcast_to(node, ins, outs, settings):
    """Into the planned buffer: the definition's new array each run was fresh memory (MobileViTv2's
    (1, 64, 4, 196) expands: ~50 us a step in page faults, 7 as a copy)."""
    shape = tuple(outs[0].shape) if outs[0].shape is not None else ()
    if not shape or not all(isinstance(d, int) for d in shape) or ins[0].dtype != outs[0].dtype:
        return by_definition(node)
    return writes(lambda i, o: np.copyto(o[0], np.broadcast_to(i[0], shape)))


@kernel("Concat")
def concat(node, ins, outs, settings):
    axis = int(params(node)["axis"])
    out = outs[0].shape
    if out is not None and len(out) and all(v.dtype == outs[0].dtype for v in ins) and \
            (par := parallel_steps.concat([v.shape for v in ins], axis % len(out), out, outs[0].dtype,
                                          settings.threads)) is not None:
        return writes(par)     # threads, with the work for them
    return writes(lambda i, o: np.concatenate([np.asarray(a).astype(o[0].dtype, copy=False) for a in i],
                                              axis=axis, out=o[0]))


@kernel("GatherV2")
def gather(node, ins, outs, settings):
    """One constant index along an axis with only 1s before it (a decoder's past_k[layer]) is a view of
    a contiguous block, not a copy (12 copies of 256 KB: 0.5 ms a token at dim 512); run-time indices
    into rows are `_row_gather`; else the definition."""
    from ....ir.ops.tensor import _gather_axis
    x, idx = ins[0].shape, ins[1]
    if x is None or idx.value is None or np.size(idx.value) != 1 or np.ndim(idx.value) != 0 or \
            (len(ins) > 2 and ins[2].value is None):
        rows = _row_gather(node, ins, outs) if idx.value is None else None
        return rows if rows is not None else by_definition(node)
    axis = _gather_axis(node, ins[2].value if len(ins) > 2 else None) % len(x)
    k = int(np.asarray(idx.value))
    k = k + x[axis] if k < 0 and isinstance(x[axis], int) else k
    if any(d != 1 for d in x[:axis]) or not isinstance(x[axis], int) or not 0 <= k < x[axis]:
        return by_definition(node)
    at = (0,) * axis + (k,)
    shape = tuple(outs[0].shape)
    return views(lambda i: [np.ascontiguousarray(i[0])[at].reshape(shape)])


@njit(cache=True)
def take_rows(x, idx, out):
    """out[j] = x[idx[j]] for rows of a 2-D x, negative indices from the end; False at the first index
    out of range (the definition's error, raised by the caller)."""
    n = x.shape[0]
    for j in range(idx.shape[0]):
        r = idx[j]
        if r < 0:
            r += n
        if r < 0 or r >= n:
            return False
        out[j, :] = x[r, :]
    return True


def _row_gather(node, ins, outs):
    """Run-time integer indices into rows (only 1s before the axis: an embedding lookup) as `take_rows`:
    one call where the definition's bounds checks and take were five NumPy calls (10 us for a tiny
    BERT's 16 tokens), or None."""
    x, idx, out = ins[0].shape, ins[1], outs[0].shape
    if x is None or idx.shape is None or out is None or len(ins) > 2 and ins[2].value is None or \
            any(not isinstance(d, int) for d in tuple(x) + tuple(idx.shape)) or \
            str(idx.dtype) not in ("int32", "int64") or str(ins[0].dtype) != str(outs[0].dtype) or \
            str(ins[0].dtype) not in ("float32", "float16", "int8", "uint8", "int32", "int64", "bool"):
        return None
    from ....ir.ops.tensor import _gather_axis
    axis = _gather_axis(node, ins[2].value if len(ins) > 2 else None) % len(x)
    if any(d != 1 for d in x[:axis]):
        return None
    rows, inner, count = x[axis], int(np.prod(x[axis + 1:], dtype=np.int64)), int(np.prod(idx.shape, dtype=np.int64))
    dtype, take = np.dtype(ins[0].dtype), Bound(take_rows)

    def run(i, o):
        src = np.ascontiguousarray(i[0], dtype).reshape(rows, inner)
        if not take(src, np.ascontiguousarray(i[1]).reshape(count), o[0].reshape(count, inner)):
            raise IndexError(f"{node.op} '{node.name}': index out of range for axis of size {rows}")
    return writes(run)


@kernel("Slice")
def split(node, ins, outs, settings):
    # the pieces as precomputed index tuples: np.split costs 4 us a call, these 0.6 (an LSTM splits its
    # gates once per time step)
    if len(ins) > 1 and ins[1].value is None:
        return by_definition(node)
    axis, bounds = split_points(node, ins[0].shape, ins[1].value if len(ins) > 1 else None)
    pieces = [(slice(None),) * axis + (slice(lo, hi),) for lo, hi in zip(bounds[:-1], bounds[1:])]
    return views(lambda i: [i[0][p] for p in pieces])


@kernel("StridedSlice")
def strided_slice(node, ins, outs, settings):
    """The index tuple built once when the bounds are known at prepare."""
    if any(v.value is None for v in ins[1:]):
        return by_definition(node)
    sl = strided_index(node, len(ins[0].shape), [v.value for v in ins[1:]])
    shape, out = ins[0].shape, outs[0].shape
    if shape is not None and out is not None and all(isinstance(d, int) for d in tuple(shape) + tuple(out)) and \
            np.broadcast_to(np.float32(0), tuple(shape))[sl].shape == tuple(out) and ins[0].dtype == outs[0].dtype:
        if _contiguous_block(tuple(shape), sl, ins[0].dtype):
            # a block of a contiguous input (attention's q/k/v of a packed qkv, tokens after the class
            # token): a view, no copy (CoaT's 13 slices: ~0.5 ms a run)
            return views(lambda i: [i[0][sl]])
        # into the planned buffer: a fresh array each run is fresh memory to fault in
        par = parallel_steps.strided_slice(tuple(shape), sl, tuple(out), ins[0].dtype, settings.threads)
        return writes(par or (lambda i, o: np.copyto(o[0], i[0][sl])))
    return returns(lambda i: [np.ascontiguousarray(i[0][sl])])


def _contiguous_block(shape: tuple, sl, dtype) -> bool:
    """Whether slicing a C-contiguous array of `shape` by the index tuple `sl` gives one contiguous,
    non-empty block."""
    itemsize = np.dtype(str(dtype)).itemsize if str(dtype) in np.sctypeDict else 0
    if not itemsize or not shape or 0 in shape:
        return False
    strides = tuple(int(np.prod(shape[a + 1:])) * itemsize for a in range(len(shape)))
    probe = np.lib.stride_tricks.as_strided(np.zeros(1, np.dtype(str(dtype))), shape, strides)[sl]
    return probe.size > 0 and probe.flags.c_contiguous


def channel_shuffle(node, ins, outs, settings):
    """runtime.fusion.fuse_channel_shuffle's step: input a's channel j to output channel j k + a."""
    k = len(ins)
    n, c = ins[0].shape[:2]
    plane = int(np.prod(ins[0].shape[2:]))

    def run(i, o):
        out = o[0].reshape(n, c, k, plane)
        for a in range(k):
            np.copyto(out[:, :, a], i[a].reshape(n, c, plane))
    # threads with the work for them: the parallel copy (timed against this one near the threshold)
    return writes(parallel_steps.shuffle(ins[0].shape, k, ins[0].dtype, settings.threads, run) or run)


PLAN_ONLY["ChannelShuffle"] = channel_shuffle


@njit(parallel=True, cache=True)
def pad_planes(x, step, h, w, t, l, value, out):
    """out (B, OH, OW) = x's B planes of h rows of w floats placed at row t, column l, the rest `value`: each
    output row written once (the definition's np.pad allocated and filled the whole output, then copied into
    it: HGNetV2-B0's stem pad, 16 x 112 x 112 -> 113 x 113, 0.26 ms against onnxruntime's 0.07). x is flat,
    row r (plane * h + y) at x[r * step:r * step + w] (parallel_rows.row_span: a contiguous map, step w, or a
    split's strided view read in place: EfficientViT pads its attention's v, a (8, 196, 16) view of rows 48
    floats apart, which NumPy's copy first took 9 us of the step's 17)."""
    B, OH, OW = out.shape
    of = out.reshape(-1)
    uw, ustep, uow, ul, right = np.uint64(w), np.uint64(step), np.uint64(OW), np.uint64(l), np.uint64(OW - l - w)
    for b in prange(B):
        # flat unsigned indices: the row views and slice assignments cost ~50 ns a row (CoaT's cls-token
        # pad, 8 x 3136 rows of 8 floats: 220 us)
        src, dst = np.uint64(b * h) * ustep, np.uint64(b * OH * OW)
        if l == 0 and OW == w and step == w:      # rows only: one fill, one copy, one fill a plane
            top, body = np.uint64(t * w), np.uint64(h * w)
            for j in range(top):
                of[dst + j] = value
            for j in range(body):
                of[dst + top + j] = x[src + j]
            for j in range(top + body, np.uint64(OH * OW)):
                of[dst + j] = value
            continue
        for y in range(OH):
            o = dst + np.uint64(y) * uow
            iy = y - t
            if 0 <= iy < h:
                i = src + np.uint64(iy) * ustep
                for j in range(ul):
                    of[o + j] = value
                for j in range(uw):
                    of[o + ul + j] = x[i + j]
                for j in range(right):
                    of[o + ul + uw + j] = value
            else:
                for j in range(uow):
                    of[o + j] = value


@kernel("Padding")
def padding(node, ins, outs, settings):
    """Constant padding of a float32 tensor's last two axes by pads known at prepare (convolution and
    pooling pads the passes could not fold); any other padding runs the definition."""
    from .. import sized
    x = ins[0]
    pads = None if len(ins) < 2 or ins[1].value is None else _ints(ins[1].value)
    shape = x.shape
    if pads is None or shape is None or len(shape) < 2 or not all(isinstance(d, int) for d in shape) or \
            str(x.dtype) != "float32" or params(node).get("mode", "CONSTANT") != "CONSTANT" or min(pads) < 0:
        return by_definition(node)
    pads = pads + [0] * (2 * len(shape) - len(pads))
    if any(pads[:2 * (len(shape) - 2)]) or (len(ins) > 2 and ins[2].value is None):
        return by_definition(node)
    value = np.float32(np.asarray(ins[2].value).reshape(-1)[0]) if len(ins) > 2 and np.size(ins[2].value) else \
        np.float32(0)
    t, l = pads[-4], pads[-2]
    b, h, w = int(np.prod(shape[:-2])), shape[-2], shape[-1]
    oh, ow = h + t + pads[-3], w + l + pads[-1]
    fn = parallel_steps.pad(b, h, w, oh, ow, settings.threads) or \
        sized(pad_planes, b * oh * ow, settings.threads)       # (few planes, threads: rows across them)
    from ..micro.parallel_rows import RowSpan
    span = RowSpan(b * h, w)

    def run(i, o):
        xs = span(i[0]) or (np.ascontiguousarray(i[0], np.float32).reshape(-1), w)    # (another layout: copied)
        fn(xs[0], xs[1], h, w, t, l, value, o[0].reshape(b, oh, ow))
    return writes(run)
