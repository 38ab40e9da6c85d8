"""Caffe's detection layers: SSD's PriorBox (a constant: it depends only on shapes and parameters) and
Fast R-CNN's ROIPooling (MNN's ROIPooling op)."""
from __future__ import annotations

import numpy as np

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
