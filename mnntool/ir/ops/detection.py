"""Object-detection heads: greedy non-maximum suppression (TensorFlow's NonMaxSuppressionV2), Fast
R-CNN's ROIPooling and SSD's DetectionOutput, each with MNN's meaning."""
from __future__ import annotations

import numpy as np

from . import Val, define, numel, params


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
        inputs=("boxes", "scores", "max_output", "iou_threshold?", "score_threshold?"), kind="detection")
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


# MNN reads ROIPooling's regions (R, 5, 1, 1) in NC4HW4 as well
@define("ROIPooling", param="RoiParameters", inputs=("x", "rois"), kind="pooling", layout="NC4HW4-all",
        spreads_grid=True)
class ROIPooling:
    """Fast R-CNN's max pooling of each region (batch index, x1, y1, x2, y2 in input pixels times
    spatialScale, rounded) into pooledHeight x pooledWidth bins; an empty bin is 0."""
    def infer(node, ins):
        p = params(node)
        return [Val((ins[1].shape[0], ins[0].shape[1], int(p["pooledHeight"]), int(p["pooledWidth"])), ins[0].dtype)]

    def flops(node, ins, outs):
        return numel(ins[0].shape[1:]) * (ins[1].shape[0] if ins[1].shape else 1)

    def compute(node, xs):
        p = params(node)
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


# rows_at_run_time: MNN sets the output's row count only as the op runs, so anything MNN sized after it
# before the run (a layout conversion, a consumer) reads stale rows: its results must be graph outputs
@define("DetectionOutput", param="DetectionOutput", inputs=("loc", "conf", "priors"), kind="detection",
        layout="NC4HW4-all", rows_at_run_time=True)
class DetectionOutput:
    """SSD's detection head as MNN runs it (one image, boxes shared by the classes, CENTER_SIZE code, class
    0 the background): decode every prior, keep per class (1..C-1) the boxes scoring above the confidence
    threshold, NMS them (at most keepTopK), then keep the keepTopK best over all classes. Rows are
    (label, score, xmin, ymin, xmax, ymax), best first; how many is known only at run time."""
    def infer(node, ins):
        raise ValueError("the count is known only at run time")

    def compute(node, xs):
        p = params(node)
        f = np.float32
        classes, keep = int(p["classCount"]), int(p["keepTopK"])
        thr, conf_t = float(p["nmsThresholdold"]), float(p["confidenceThreshold"])
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
