"""Calibration data: a folder of .npy/.npz samples, or of images preprocessed as MNN's quantizer does
(resize, channel order, (x - mean) * normal)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import MnnToolError
from ..inputs import dir_feeds
from ..ir.graph import Graph

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp"}


@dataclass
class ImagePrep:
    mean: tuple = (0.0, 0.0, 0.0)
    normal: tuple = (1.0, 1.0, 1.0)     # multiplied after subtracting the mean (1/std)
    size: tuple | None = None           # (width, height); default: the model input's
    fmt: str = "RGB"


def _load_image(path: Path, prep: ImagePrep, shape) -> np.ndarray:
    try:
        from PIL import Image
    except ImportError:
        raise MnnToolError("image calibration data needs Pillow: pip install pillow") from None
    try:
        img = Image.open(path)
        img = img.convert("L" if prep.fmt == "GRAY" else "RGB")
    except Exception as e:
        raise MnnToolError(f"{path}: not a readable image ({type(e).__name__})") from None
    w, h = prep.size or (shape[3], shape[2])
    img = img.resize((int(w), int(h)), Image.BILINEAR)
    x = np.asarray(img, np.float32)
    x = x[:, :, None] if x.ndim == 2 else x
    if prep.fmt == "BGR":
        x = x[:, :, ::-1]
    c = x.shape[2]
    x = (x - np.asarray(prep.mean[:c], np.float32)) * np.asarray(prep.normal[:c], np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None])


def calibration_samples(folder, g: Graph, prep: ImagePrep | None = None, limit: int | None = None) -> list[dict]:
    folder = Path(folder)
    if not folder.is_dir():
        raise MnnToolError(f"{folder}: calibration folder does not exist")
    images = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not images:
        samples = dir_feeds(folder, g, limit)
    else:
        if len(g.inputs) != 1:
            raise MnnToolError(f"{folder}: image calibration needs a single-input model ({', '.join(g.inputs)})")
        shape = g.tensors[g.inputs[0]].shape
        if shape is None or len(shape) != 4:
            raise MnnToolError(f"{folder}: image calibration needs an NCHW input, got {shape}")
        samples = [{g.inputs[0]: _load_image(p, prep or ImagePrep(), shape)} for p in images[:limit]]
    for k, feeds in enumerate(samples):
        for name, x in feeds.items():
            want = g.tensors[name].shape
            if want is not None and all(isinstance(d, int) and d > 0 for d in want) and tuple(x.shape) != tuple(want):
                raise MnnToolError(f"{folder}: sample {k} gives '{name}' shape {list(x.shape)}, the model wants "
                                   f"{list(want)}")
            if x.dtype.kind == "f" and not np.isfinite(x).all():
                raise MnnToolError(f"{folder}: sample {k} input '{name}' contains NaN or infinite values")
    return samples
