"""Caffe's detection layers: SSD's PriorBox (a constant: it depends only on shapes and parameters) and
DetectionOutput (MNN's DetectionOutput op), Fast R-CNN's ROIPooling (MNN's ROIPooling op)."""
from __future__ import annotations

import numpy as np

from ..onnx.context import Ctx
from .layers import _fail, layer


def prior_boxes(p, layer_hw, image_hw) -> np.ndarray:
    """SSD's priors for a feature map: (1, 2, H*W*priors*4), the boxes then their variances."""
    lh, lw = layer_hw
    ih, iw = (p.img_h, p.img_w) if p.img_h and p.img_w else ((p.img_size, p.img_size) if p.img_size else image_hw)
    sh, sw = (p.step_h, p.step_w) if p.step_h and p.step_w else ((p.step, p.step) if p.step else (ih / lh, iw / lw))
    ratios = [1.0]
    for ar in p.aspect_ratio:
        if all(abs(ar - r) >= 1e-6 for r in ratios):
            ratios.append(float(ar))
            if p.flip:
                ratios.append(1.0 / float(ar))
    sizes = [(p.min_size, p.min_size)]
    if p.HasField("max_size"):
        s = float(np.sqrt(p.min_size * p.max_size))
        sizes.append((s, s))
    sizes += [(p.min_size * np.sqrt(r), p.min_size / np.sqrt(r)) for r in ratios if abs(r - 1) >= 1e-6]
    boxes = []
    for y in range(lh):
        for x in range(lw):
            cx, cy = (x + p.offset) * sw, (y + p.offset) * sh
            for bw, bh in sizes:
                boxes.append([(cx - bw / 2) / iw, (cy - bh / 2) / ih, (cx + bw / 2) / iw, (cy + bh / 2) / ih])
    boxes = np.asarray(boxes, np.float32).reshape(-1)
    if p.clip:
        boxes = np.clip(boxes, 0, 1)
    var = list(p.variance) or [0.1]
    if len(var) not in (1, 4):
        raise ValueError(f"{len(var)} variances (1 or 4 expected)")
    variances = np.tile(np.asarray(var * (4 if len(var) == 1 else 1), np.float32), boxes.size // 4)
    return np.stack([boxes, variances])[None]


@layer("PriorBox")
def prior_box(ctx, lay, blobs, bottoms, tops):
    if len(bottoms) < 2 and not (lay.prior_box_param.img_size or lay.prior_box_param.img_h):
        _fail(ctx, lay, "needs the image as its second bottom (or img_size)")
    image = ctx.shape_of(bottoms[1])[2:] if len(bottoms) > 1 else (0, 0)
    try:
        priors = prior_boxes(lay.prior_box_param, ctx.shape_of(bottoms[0])[2:], image)
    except ValueError as e:
        _fail(ctx, lay, str(e))
    return [ctx.tensor(priors, lay.name)]


@layer("ROIPooling")
def roi_pooling(ctx, lay, blobs, bottoms, tops):
    p = lay.roi_pooling_param
    if not p.pooled_h or not p.pooled_w:
        _fail(ctx, lay, "pooled_h and pooled_w must be set")
    rois = bottoms[1]
    if ctx.shape_of(rois)[1:] != (5, 1, 1):
        rois = ctx.reshape(rois, [-1, 5, 1, 1], ctx.tmp(lay.name + "_rois"))[0]
    return ctx.emit("ROIPooling", [bottoms[0], rois], [tops[0]],
                    {"pooledWidth": int(p.pooled_w), "pooledHeight": int(p.pooled_h),
                     "spatialScale": float(p.spatial_scale), "poolType": "MAXPOOL"}, lay.name)


CENTER_SIZE = 2


@layer("DetectionOutput")
def detection_output(ctx, lay, blobs, bottoms, tops):
    """MNN's DetectionOutput implements one configuration of SSD's layer (see the IR op); anything else is
    refused rather than converted to a different meaning. MNN runs NMS over every box above the
    confidence threshold, where Caffe first keeps the nms top_k best per class: the kept boxes among those
    top_k are the same, MNN may add lower-scored ones. Rows are (label, score, box), best first, without
    Caffe's image index column: MNN sets the row count as the op runs, so no layer may follow it."""
    p = lay.detection_output_param
    if len(bottoms) != 3:
        _fail(ctx, lay, f"{len(bottoms)} bottoms (location, confidence, priors expected; ARM refinement inputs "
                        "are not supported)")
    if not p.num_classes:
        _fail(ctx, lay, "num_classes must be set")
    for bad, what in ((not p.share_location, "share_location: false"),
                      (p.background_label_id != 0, f"background_label_id {p.background_label_id}"),
                      (p.code_type != CENTER_SIZE, f"code_type {p.code_type} (only CENTER_SIZE = 2)"),
                      (p.variance_encoded_in_target, "variance_encoded_in_target: true"),
                      (not p.normalized_bbox, "normalized_bbox: false"),
                      (p.nms_param.eta != 1.0, f"adaptive NMS (eta {p.nms_param.eta})")):
        if bad:
            _fail(ctx, lay, f"{what} is not supported (MNN's DetectionOutput decodes shared CENTER_SIZE boxes "
                            "with class 0 as the background)")
    if ctx.shape_of(bottoms[0])[0] != 1:
        _fail(ctx, lay, "MNN's DetectionOutput reads one image: the batch must be 1")
    priors = ctx.shape_of(bottoms[2])
    count = int(np.prod(priors)) // 8
    if int(np.prod(ctx.shape_of(bottoms[0]))) != count * 4:
        _fail(ctx, lay, f"{count} priors but {int(np.prod(ctx.shape_of(bottoms[0])))} location values")
    if int(np.prod(ctx.shape_of(bottoms[1]))) != count * p.num_classes:
        _fail(ctx, lay, f"{count} priors x {p.num_classes} classes but "
                        f"{int(np.prod(ctx.shape_of(bottoms[1])))} confidences")
    # MNN reads all three in NC4HW4 and matches the location's channels with the priors' height
    loc = ctx.reshape(bottoms[0], [1, count * 4, 1, 1], ctx.tmp(lay.name + "_loc"))[0]
    conf = ctx.reshape(bottoms[1], [1, count * p.num_classes, 1, 1], ctx.tmp(lay.name + "_conf"))[0]
    pri = ctx.reshape(bottoms[2], [1, 2, count * 4, 1], ctx.tmp(lay.name + "_priors"))[0]
    keep = int(p.keep_top_k) if p.keep_top_k > 0 else count * (int(p.num_classes) - 1)
    nms_top_k = int(p.nms_param.top_k) if p.nms_param.HasField("top_k") else -1
    # how many rows is known only at run time: emitted without shape inference
    return Ctx.emit(ctx, "DetectionOutput", [loc, conf, pri], [tops[0]],
                    {"classCount": int(p.num_classes), "nmsThresholdold": float(p.nms_param.nms_threshold),
                     "nmsTopK": nms_top_k, "keepTopK": keep,
                     "confidenceThreshold": float(p.confidence_threshold), "shareLocation": 1,
                     "backgroundLable": 0, "varianceEncodedTarget": 0, "codeType": CENTER_SIZE}, lay.name)
