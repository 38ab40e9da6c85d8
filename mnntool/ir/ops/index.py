"""Ops that index: arg-reductions, sorting and selection, gathers and scatters by index tensors,
sequence generators. Indices are int32 (MNN has no int64 tensors)."""
from __future__ import annotations

import numpy as np

from . import Val, define, ints, known, numel, same


def _axis_of(operand, default=0) -> int:
    return ints(operand)[0] if operand is not None else default


@define("ArgMax", "ArgMin", param="ArgMax")
class ArgMax:
    """The first index of the largest (smallest) value along `axis`, the axis removed."""
    def infer(node, ins):
        shape = ins[0].shape
        axis = node.param.get("axis", 0) % len(shape)
        return [Val(tuple(d for i, d in enumerate(shape) if i != axis), "int32")]

    def compute(node, xs):
        x = xs[0]
        axis = node.param.get("axis", 0) % x.ndim
        fn = np.argmax if node.op == "ArgMax" else np.argmin
        return fn(x, axis=axis).astype(np.int32)


@define("TopKV2", param="TopKV2", inputs=("x", "k"))
class TopKV2:
    """The k largest (smallest when not `largest`) values along the last axis and their indices; ties
    keep the lower index first."""
    def infer(node, ins):
        k = known(ins[1], "k", node)[0]
        shape = tuple(ins[0].shape[:-1]) + (k,)
        return [Val(shape, ins[0].dtype), Val(shape, "int32")]

    def compute(node, xs):
        x, k = xs[0], ints(xs[1])[0]
        largest = node.param.get("largest", True)
        key = -x.astype(np.float64) if largest and x.dtype.kind == "f" else (-x.astype(np.int64) if largest else x)
        idx = np.argsort(key, axis=-1, kind="stable")[..., :k]
        return [np.take_along_axis(x, idx, axis=-1), idx.astype(np.int32)]


@define("CumSum", "CumProd", param="CumSum", inputs=("x", "axis"))
class CumSum:
    """Running sum (product) along the axis input; exclusive starts from the identity, reverse runs
    from the end."""
    infer = same

    def compute(node, xs):
        x = xs[0]
        axis = _axis_of(xs[1]) % x.ndim
        p = node.param
        fn = np.cumsum if node.op == "CumSum" else np.cumprod
        if p.get("reverse"):
            x = np.flip(x, axis)
        out = fn(x, axis=axis, dtype=x.dtype)
        if p.get("exclusive"):
            ident = np.zeros_like if node.op == "CumSum" else np.ones_like
            head = ident(np.take(out, [0], axis=axis))
            out = np.concatenate([head, np.take(out, np.arange(x.shape[axis] - 1), axis=axis)], axis=axis)
        return np.flip(out, axis) if p.get("reverse") else out


def _wrap(idx, size):
    idx = np.asarray(idx).astype(np.int64)
    return np.where(idx < 0, idx + size, idx)


@define("GatherElements", inputs=("x", "indices", "axis"))
class GatherElements:
    """out[i][j][k] = x[index][j][k] along the axis (ONNX GatherElements); negative indices count back."""
    def infer(node, ins):
        return [Val(ins[1].shape, ins[0].dtype)]

    def compute(node, xs):
        x = xs[0]
        axis = _axis_of(xs[2] if len(xs) > 2 else None) % x.ndim
        idx = _wrap(xs[1], x.shape[axis])
        x = x[tuple(slice(None) if a == axis else slice(0, n) for a, n in enumerate(idx.shape))]
        return np.take_along_axis(x, idx, axis=axis)


@define("GatherND", param="Axis", inputs=("x", "indices"))
class GatherND:
    """ONNX GatherND with `axis` batch dims (MNN's converter folds batch dims into the indices)."""
    def infer(node, ins):
        b = node.param.get("axis", 0)
        ishape, xshape = ins[1].shape, ins[0].shape
        return [Val(tuple(ishape[:-1]) + tuple(xshape[b + ishape[-1]:]), ins[0].dtype)]

    def compute(node, xs):
        x, idx = xs[0], np.asarray(xs[1]).astype(np.int64)
        b = node.param.get("axis", 0)
        if b:
            batch = int(np.prod(x.shape[:b]))
            xr = x.reshape((batch,) + x.shape[b:])
            ir = idx.reshape((batch, -1, idx.shape[-1]))
            out = np.stack([xr[i][tuple(_wrap(ir[i][..., k], xr.shape[1 + k]) for k in range(idx.shape[-1]))]
                            for i in range(batch)])
            return out.reshape(idx.shape[:-1] + x.shape[b + idx.shape[-1]:])
        m = idx.shape[-1]
        return x[tuple(_wrap(idx[..., k], x.shape[k]) for k in range(m))]


SCATTER_REDUCE = {"ADD": np.add, "MUL": np.multiply, "MAXIMUM": np.maximum, "MINIMUM": np.minimum}


@define("ScatterElements", param="BinaryOp", inputs=("x", "indices", "updates", "axis"))
class ScatterElements:
    """x with updates written at the indices along the axis; opType -1 replaces, else reduces."""
    infer = same

    def compute(node, xs):
        out = np.array(xs[0], copy=True)
        axis = _axis_of(xs[3] if len(xs) > 3 else None) % out.ndim
        idx = _wrap(xs[1], out.shape[axis])
        upd = np.asarray(xs[2]).astype(out.dtype)
        op = node.param.get("opType", -1)
        red = SCATTER_REDUCE.get(op) if isinstance(op, str) else None
        for pos in np.ndindex(*idx.shape):
            tgt = list(pos)
            tgt[axis] = idx[pos]
            tgt = tuple(tgt)
            out[tgt] = red(out[tgt], upd[pos]) if red else upd[pos]
        return out


@define("ScatterNd", param="BinaryOp", inputs=("indices", "updates", "shape", "x?"))
class ScatterNd:
    """A tensor of `shape` (or the 4th input) with updates written at the index tuples."""
    def infer(node, ins):
        if len(ins) > 3:
            return [Val(ins[3].shape, ins[3].dtype)]
        return [Val(tuple(known(ins[2], "shape", node)), ins[1].dtype)]

    def compute(node, xs):
        idx, upd = np.asarray(xs[0]).astype(np.int64), np.asarray(xs[1])
        out = np.array(xs[3], copy=True) if len(xs) > 3 and xs[3] is not None else np.zeros(ints(xs[2]), upd.dtype)
        op = node.param.get("opType", -1)
        red = SCATTER_REDUCE.get(op) if isinstance(op, str) else None
        m = idx.shape[-1]
        flat_idx = idx.reshape(-1, m)
        flat_upd = upd.reshape((flat_idx.shape[0],) + out.shape[m:])
        for k in range(flat_idx.shape[0]):
            tgt = tuple(_wrap(flat_idx[k], np.array(out.shape[:m])))
            out[tgt] = red(out[tgt], flat_upd[k]) if red else flat_upd[k]
        return out


@define("Where", param="Extra", inputs=("condition",))
class Where:
    """TensorFlow's where with one input: the coordinates of the non-zero elements, [count, rank]. MNN
    counts wrongly without its parameter table (Extra {vector: false}, as its converter writes it)."""
    def infer(node, ins):
        if ins[0].value is None:
            raise ValueError("the count is known only at run time")
        return [Val((int(np.count_nonzero(ins[0].value)), len(ins[0].shape)), "int32")]

    def compute(node, xs):
        return np.argwhere(np.asarray(xs[0]) != 0).astype(np.int32).reshape(-1, np.ndim(xs[0]))


@define("Unique", inputs=("x",))
class Unique:
    """The distinct values of a flattened tensor in order of first appearance, with the first index of
    each, the index of each element's value and the counts (ONNX Unique, sorted=0, no axis)."""
    def infer(node, ins):
        if ins[0].value is None:
            raise ValueError("the count is known only at run time")
        return [Val(v.shape, str(v.dtype)) for v in Unique.compute(node, [np.asarray(ins[0].value)])]

    def compute(node, xs):
        x = np.asarray(xs[0]).reshape(-1)
        values, first, inverse, counts = np.unique(x, return_index=True, return_inverse=True, return_counts=True)
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        outs = [values[order], first[order].astype(np.int32), rank[inverse].astype(np.int32),
                counts[order].astype(np.int32)]
        return outs[:max(len(node.outputs), 1)]


@define("OneHot", param="OneHotParam", inputs=("indices", "depth", "on", "off"))
class OneHot:
    """on where the index hits, off elsewhere, along a new `axis`; negative indices count back from depth."""
    def infer(node, ins):
        depth = known(ins[1], "depth", node)[0]
        shape = list(ins[0].shape)
        axis = node.param.get("axis", -1)
        axis = axis % (len(shape) + 1)
        shape.insert(axis, depth)
        return [Val(tuple(shape), ins[2].dtype)]

    def compute(node, xs):
        idx = np.asarray(xs[0]).astype(np.int64)
        depth = ints(xs[1])[0]
        on, off = np.asarray(xs[2]).reshape(-1)[0], np.asarray(xs[3]).reshape(-1)[0]
        idx = np.where(idx < 0, idx + depth, idx)
        axis = node.param.get("axis", -1) % (idx.ndim + 1)
        hot = idx[..., None] == np.arange(depth)
        out = np.where(hot, on, off).astype(np.asarray(xs[2]).dtype)
        return np.moveaxis(out, -1, axis)


@define("EyeLike", inputs=("x", "k"))
class EyeLike:
    """Ones on the k-th diagonal of a matrix shaped like x."""
    infer = same

    def compute(node, xs):
        k = _axis_of(xs[1] if len(xs) > 1 else None)
        return np.eye(xs[0].shape[0], xs[0].shape[1], k=k, dtype=xs[0].dtype)


@define("Tile", inputs=("x", "repeats"))
class Tile:
    def infer(node, ins):
        reps = known(ins[1], "repeats", node)
        return [Val(tuple(d * r if isinstance(d, int) else d for d, r in zip(ins[0].shape, reps)), ins[0].dtype)]

    def compute(node, xs):
        return np.tile(xs[0], ints(xs[1]))


@define("Range", param="Range", inputs=("start", "limit", "delta"))
class Range:
    def infer(node, ins):
        """Bounds known only at run time give a length of its own name: the rank still flows on (a
        decoder's positions arange(past, past + new) feed its embeddings and mask)."""
        if any(v.value is None for v in ins):
            return [Val((f"len({node.outputs[0]})",), ins[0].dtype)]
        start, limit, delta = (np.asarray(v.value) for v in ins)
        n = max(int(np.ceil((float(np.asarray(limit).reshape(-1)[0]) - float(np.asarray(start).reshape(-1)[0]))
                            / float(np.asarray(delta).reshape(-1)[0]))), 0)
        return [Val((n,), ins[0].dtype)]

    def compute(node, xs):
        start, limit, delta = (np.asarray(v).reshape(-1)[0] for v in xs)
        n = max(int(np.ceil((float(limit) - float(start)) / float(delta))), 0)
        return (start + np.arange(n) * delta).astype(np.asarray(xs[0]).dtype)


@define("Pack", param="PackParam", inputs=("*xs",))
class Pack:
    """np.stack along `axis`."""
    def infer(node, ins):
        shape = list(ins[0].shape)
        axis = node.param.get("axis", 0) % (len(shape) + 1)
        shape.insert(axis, len(ins))
        return [Val(tuple(shape), ins[0].dtype)]

    def compute(node, xs):
        shape = np.broadcast_shapes(*[np.shape(x) for x in xs])
        return np.stack([np.broadcast_to(x, shape) for x in xs], axis=node.param.get("axis", 0))


@define("ZerosLike", inputs=("x",))
class ZerosLike:
    infer = same

    def compute(node, xs):
        return np.zeros_like(xs[0])


@define("CastLike", inputs=("x", "like"))
class CastLike:
    def infer(node, ins):
        return [Val(ins[0].shape, ins[1].dtype)]

    def compute(node, xs):
        return xs[0].astype(np.asarray(xs[1]).dtype)


def depth_space(x, block, mode, to_space):
    n, c, h, w = x.shape
    b = block
    if to_space:
        if mode == "DCR":
            y = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
        else:
            y = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
        return y.reshape(n, c // (b * b), h * b, w * b)
    y = x.reshape(n, c, h // b, b, w // b, b)
    y = y.transpose(0, 3, 5, 1, 2, 4) if mode == "DCR" else y.transpose(0, 1, 3, 5, 2, 4)
    return y.reshape(n, c * b * b, h // b, w // b)


@define("DepthToSpace", "SpaceToDepth", param="DepthSpaceParam")
class DepthToSpace:
    """Channel blocks to pixels and back (DCR or CRD order), NCHW."""
    def infer(node, ins):
        n, c, h, w = ins[0].shape
        b = node.param.get("blockSize", 1)
        if node.op == "DepthToSpace":
            return [Val((n, c // (b * b), h * b, w * b), ins[0].dtype)]
        return [Val((n, c * b * b, h // b, w // b), ins[0].dtype)]

    def compute(node, xs):
        return depth_space(xs[0], node.param.get("blockSize", 1), node.param.get("mode", "DCR"),
                           node.op == "DepthToSpace")


@define("LRN", param="LRN")
class LRN:
    """Across-channel local response normalization: x / (bias + alpha / size * sum of squares)^beta."""
    infer = same

    def flops(node, ins, outs):
        return numel(outs[0].shape) * (node.param.get("localSize", 1) + 3)

    def compute(node, xs):
        x = xs[0].astype(np.float64)
        p = node.param
        size = p.get("localSize", 1)
        sq = np.pad(x * x, [(0, 0), ((size - 1) // 2, size // 2)] + [(0, 0)] * (x.ndim - 2))
        acc = sum(sq[:, k:k + x.shape[1]] for k in range(size))
        return (x / (p.get("bias", 1.0) + p.get("alpha", 1.0) / size * acc) ** p.get("beta", 0.75)).astype(xs[0].dtype)


def _reflect(c, lo, hi):
    span = hi - lo
    if span <= 0:
        return np.zeros_like(c)
    c = np.abs(c - lo)
    flips = np.floor(c / span)
    extra = c - flips * span
    return np.where(flips % 2 == 0, lo + extra, hi - extra)


def grid_sample(x, grid, mode, padding, align):
    """ONNX/PyTorch grid_sample on NCHW x with an [N, Ho, Wo, 2] grid of (x, y) in [-1, 1]."""
    n, c, h, w = x.shape
    gx, gy = grid[..., 0].astype(np.float64), grid[..., 1].astype(np.float64)
    if align:
        ix, iy = (gx + 1) / 2 * (w - 1), (gy + 1) / 2 * (h - 1)
    else:
        ix, iy = ((gx + 1) * w - 1) / 2, ((gy + 1) * h - 1) / 2
    if padding == "CLAMP":
        ix, iy = np.clip(ix, 0, w - 1), np.clip(iy, 0, h - 1)
    elif padding == "REFLECTION":
        if align:
            ix, iy = _reflect(ix, 0, w - 1), _reflect(iy, 0, h - 1)
        else:
            ix, iy = np.clip(_reflect(ix, -0.5, w - 0.5), 0, w - 1), np.clip(_reflect(iy, -0.5, h - 0.5), 0, h - 1)
    out = np.zeros((n, c) + gx.shape[1:], np.float64)
    xd = x.astype(np.float64)

    def pick(b, yy, xx):
        ok = (yy >= 0) & (yy < h) & (xx >= 0) & (xx < w)
        v = xd[b][:, np.clip(yy, 0, h - 1), np.clip(xx, 0, w - 1)]
        return v * ok
    for b in range(n):
        if mode == "NEAREST":       # MNN rounds halves up (measured): floor(c + 0.5)
            out[b] = pick(b, np.floor(iy[b] + 0.5).astype(np.int64), np.floor(ix[b] + 0.5).astype(np.int64))
            continue
        x0, y0 = np.floor(ix[b]).astype(np.int64), np.floor(iy[b]).astype(np.int64)
        fx, fy = ix[b] - x0, iy[b] - y0
        out[b] = (pick(b, y0, x0) * (1 - fx) * (1 - fy) + pick(b, y0, x0 + 1) * fx * (1 - fy)
                  + pick(b, y0 + 1, x0) * (1 - fx) * fy + pick(b, y0 + 1, x0 + 1) * fx * fy)
    return out.astype(x.dtype)


@define("GridSample", param="GridSample", inputs=("x", "grid"))
class GridSample:
    """Samples x at the grid's normalized (x, y) points: bilinear or nearest, zeros/clamp/reflection
    outside, corners aligned or not."""
    def infer(node, ins):
        n, c = ins[0].shape[:2]
        return [Val((n, c) + tuple(ins[1].shape[1:3]), ins[0].dtype)]

    def flops(node, ins, outs):
        return 8 * numel(outs[0].shape)

    def compute(node, xs):
        p = node.param
        return grid_sample(xs[0], xs[1], p.get("mode", "BILINEAR"), p.get("paddingMode", "ZEROS"),
                           bool(p.get("alignCorners", False)))


def _iou(a, b) -> float:
    """Intersection over union of two boxes given by any two opposite corners ([y1, x1, y2, x2])."""
    ya0, yb0 = min(a[0], a[2]), min(b[0], b[2])
    xa0, xb0 = min(a[1], a[3]), min(b[1], b[3])
    ya1, yb1 = max(a[0], a[2]), max(b[0], b[2])
    xa1, xb1 = max(a[1], a[3]), max(b[1], b[3])
    area_a, area_b = (ya1 - ya0) * (xa1 - xa0), (yb1 - yb0) * (xb1 - xb0)
    if area_a <= 0 or area_b <= 0:
        return 0.0
    inter = max(min(ya1, yb1) - max(ya0, yb0), 0.0) * max(min(xa1, xb1) - max(xa0, xb0), 0.0)
    return float(inter / (area_a + area_b - inter))


@define("NonMaxSuppressionV2", param="NonMaxSuppressionV2",
        inputs=("boxes", "scores", "max_output", "iou_threshold?", "score_threshold?"))
class NonMaxSuppressionV2:
    """Greedy NMS of one class, MNN's (TensorFlow's): boxes [N, 4] as corners, scores [N]; candidates
    score above the threshold, highest first (ties: lower index first); a box is dropped when its IoU
    with a kept one exceeds the IoU threshold. The kept boxes' indices, as many as were kept."""
    def infer(node, ins):
        raise ValueError("the count is known only at run time")

    def compute(node, xs):
        boxes = np.asarray(xs[0], np.float32).reshape(-1, 4)
        scores = np.asarray(xs[1], np.float32).reshape(-1)
        limit = min(int(np.asarray(xs[2]).reshape(-1)[0]), boxes.shape[0])
        iou_t = float(np.asarray(xs[3]).reshape(-1)[0]) if len(xs) > 3 and xs[3] is not None else 0.0
        score_t = float(np.asarray(xs[4]).reshape(-1)[0]) if len(xs) > 4 and xs[4] is not None else -np.inf
        order = [i for i in np.argsort(-scores, kind="stable") if scores[i] > score_t]
        kept: list[int] = []
        for i in order:
            if len(kept) >= limit:
                break
            if all(_iou(boxes[i], boxes[j]) <= iou_t for j in kept):
                kept.append(int(i))
        return np.array(kept, np.int32)


@define("ROIPooling", param="RoiParameters", inputs=("x", "rois"))
class ROIPooling:
    """Fast R-CNN's max pooling of each region (batch index, x1, y1, x2, y2 in input pixels times
    spatialScale, rounded) into pooledHeight x pooledWidth bins; an empty bin is 0."""
    def infer(node, ins):
        p = node.param
        return [Val((ins[1].shape[0], ins[0].shape[1], int(p["pooledHeight"]), int(p["pooledWidth"])), ins[0].dtype)]

    def flops(node, ins, outs):
        return numel(ins[0].shape[1:]) * (ins[1].shape[0] if ins[1].shape else 1)

    def compute(node, xs):
        p = node.param
        x, rois = np.asarray(xs[0]), np.asarray(xs[1], np.float64).reshape(-1, 5)
        ph_n, pw_n, scale = int(p["pooledHeight"]), int(p["pooledWidth"]), float(p["spatialScale"])
        n, c, h, w = x.shape
        out = np.zeros((rois.shape[0], c, ph_n, pw_n), x.dtype)

        def rnd(v):                 # C's round(): halves away from zero
            return int(np.sign(v) * np.floor(abs(v) + 0.5))
        for r, (b, x1, y1, x2, y2) in enumerate(rois):
            b = min(max(int(b), 0), n - 1)
            sw, sh, ew, eh = rnd(x1 * scale), rnd(y1 * scale), rnd(x2 * scale), rnd(y2 * scale)
            bh, bw = max(eh - sh + 1, 1) / ph_n, max(ew - sw + 1, 1) / pw_n
            for i in range(ph_n):
                hs = min(max(int(np.floor(i * bh)) + sh, 0), h)
                he = min(max(int(np.ceil((i + 1) * bh)) + sh, 0), h)
                for j in range(pw_n):
                    ws = min(max(int(np.floor(j * bw)) + sw, 0), w)
                    we = min(max(int(np.ceil((j + 1) * bw)) + sw, 0), w)
                    if he > hs and we > ws:
                        out[r, :, i, j] = x[b, :, hs:he, ws:we].max(axis=(1, 2))
        return out


def _decode_center_size(priors: np.ndarray, variances: np.ndarray, loc: np.ndarray) -> np.ndarray:
    """SSD's CENTER_SIZE decoding of (P, 4) offsets against (P, 4) corner priors, in float32 as MNN."""
    f = np.float32
    pw, ph = priors[:, 2] - priors[:, 0], priors[:, 3] - priors[:, 1]
    pcx, pcy = (priors[:, 0] + priors[:, 2]) * f(0.5), (priors[:, 1] + priors[:, 3]) * f(0.5)
    cx = variances[:, 0] * loc[:, 0] * pw + pcx
    cy = variances[:, 1] * loc[:, 1] * ph + pcy
    w = np.exp(variances[:, 2] * loc[:, 2]) * pw
    h = np.exp(variances[:, 3] * loc[:, 3]) * ph
    return np.stack([cx - w * f(0.5), cy - h * f(0.5), cx + w * f(0.5), cy + h * f(0.5)], 1).astype(f)


def _nms_corners(boxes: np.ndarray, threshold: float, limit: int) -> list[int]:
    """Greedy NMS over boxes already sorted by score, as MNN's DetectionOutput: IoU of (xmin, ymin, xmax,
    ymax) boxes, a box dropped when its IoU with a kept one exceeds the threshold; at most `limit` kept."""
    kept: list[int] = []
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    for i in range(boxes.shape[0]):
        if len(kept) >= limit:
            break
        if kept:
            k = np.asarray(kept)
            b = boxes[k]
            disjoint = ((boxes[i, 0] > b[:, 2]) | (boxes[i, 2] < b[:, 0]) | (boxes[i, 1] > b[:, 3])
                        | (boxes[i, 3] < b[:, 1]))
            inter = ((np.minimum(boxes[i, 2], b[:, 2]) - np.maximum(boxes[i, 0], b[:, 0]))
                     * (np.minimum(boxes[i, 3], b[:, 3]) - np.maximum(boxes[i, 1], b[:, 1])))
            inter = np.where(disjoint, np.float32(0), inter)
            with np.errstate(divide="ignore", invalid="ignore"):
                iou = inter / (area[i] + area[k] - inter)
            if np.any(iou > threshold):
                continue
        kept.append(i)
    return kept


# ops whose output row count MNN sets only as the op runs: anything MNN sized after them before the run
# (a layout conversion, a consumer) reads stale rows, so their results must be graph outputs as they are
RUN_TIME_ROWS = {"DetectionOutput"}


@define("DetectionOutput", param="DetectionOutput", inputs=("loc", "conf", "priors"))
class DetectionOutput:
    """SSD's detection head as MNN runs it (one image, boxes shared by the classes, CENTER_SIZE code, class
    0 the background): decode every prior, keep per class (1..C-1) the boxes scoring above the confidence
    threshold, NMS them (at most keepTopK), then keep the keepTopK best over all classes. Rows are
    (label, score, xmin, ymin, xmax, ymax), best first; how many is known only at run time."""
    def infer(node, ins):
        raise ValueError("the count is known only at run time")

    def compute(node, xs):
        p = node.param
        f = np.float32
        classes, keep = int(p["classCount"]), int(p["keepTopK"])
        thr, conf_t = float(p.get("nmsThresholdold", 0.0)), float(p.get("confidenceThreshold", 0.0))
        pri = np.asarray(xs[2], f).reshape(2, -1)
        priors, variances = pri[0].reshape(-1, 4), pri[1].reshape(-1, 4)
        count = priors.shape[0]
        loc = np.asarray(xs[0], f).reshape(-1)[:count * 4].reshape(count, 4)
        conf = np.asarray(xs[1], f).reshape(-1)[:count * classes].reshape(count, classes)
        boxes = _decode_center_size(priors, variances, loc)
        rows = []
        for c in range(1, classes):
            cand = np.nonzero(conf[:, c] > conf_t)[0]
            cand = cand[np.argsort(-conf[cand, c], kind="stable")]
            for i in _nms_corners(boxes[cand], thr, keep):
                j = cand[i]
                rows.append((f(c), conf[j, c], *boxes[j]))
        rows.sort(key=lambda r: -r[1])
        out = np.asarray(rows[:keep], f).reshape(-1, 6)
        return out.reshape(1, 1, -1, 6)
