"""Calibration data: a folder of .npy/.npz samples, of images preprocessed as MNN's quantizer does
(corner-to-corner bilinear resize without antialiasing, channel order, (x - mean) * normal), or of
folders, one per sample of a multi-input model."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from ..errors import MnnToolError
from ..inputs import load_feeds
from ..ir.graph import Graph

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp"}


@dataclass
class ImagePrep:
    mean: tuple = (0.0, 0.0, 0.0)
    normal: tuple = (1.0, 1.0, 1.0)     # multiplied after subtracting the mean (1/std)
    size: tuple | None = None           # (width, height); default: the model input's
    fmt: str = "RGB"

    def check(self) -> None:
        """--mean/--normal/--std: one value per channel of --format (or one for all), finite; --size positive."""
        channels = 1 if self.fmt.upper() == "GRAY" else 3
        for what, vals in (("--mean", self.mean), ("--normal/--std", self.normal)):
            vals = tuple(vals)
            if len(vals) not in (1, channels) and not (channels == 1 and len(vals) == 3 and len(set(vals)) == 1):
                raise MnnToolError(f"{what}: {len(vals)} values for {channels} channel(s) ({self.fmt.upper()}); "
                                   f"give {channels}" + (" or 1 for all" if channels > 1 else ""))
            if not all(np.isfinite(v) for v in vals):
                raise MnnToolError(f"{what}: values must be finite numbers, got {','.join(map(str, vals))}")
        if self.size is not None and not all(int(v) >= 1 for v in self.size):
            raise MnnToolError(f"--size must be positive WxH, got {'x'.join(map(str, self.size))}")

    @property
    def is_identity(self) -> bool:
        return all(v == 0 for v in self.mean) and all(v == 1 for v in self.normal)


RAW_PIXELS_NOTE = ("images are fed as raw 0-255 pixel values (no --mean/--std given): give the model's "
                   "preprocessing, e.g. --mean 127.5,127.5,127.5 --std 127.5,127.5,127.5")
ASPECT_TOLERANCE = 0.01      # relative change of width/height that resizing calls a distortion


def _target_size(path: Path, prep: ImagePrep, shape) -> tuple[int, int]:
    w, h = prep.size or (shape[3], shape[2])
    if not isinstance(w, int) or not isinstance(h, int):
        raise MnnToolError(f"{path}: the model leaves the image size open ({list(shape)}); give it with "
                           "--input-shape NAME:1x3xHxW or --size WxH")
    return int(w), int(h)


def resize_bilinear(img: np.ndarray, w: int, h: int) -> np.ndarray:
    """uint8 (H, W, C) -> (h, w, C) as MNN's quantizer resizes: its dataset reads images as RGBA and
    maps the corners onto each other, and ImageProcess's 4-channel bilinear sampler (x86) steps the
    source x by (W-1)/(w-1) in float32 per pixel, weighs the 4 nearest pixels in float32 and truncates.
    No antialiasing: Pillow's BILINEAR filter averages the whole footprint when it shrinks, so a 640-wide
    image calibrated at 224 gave smoother inputs than MNN's quantizer feeds. Bit-exact with MNN 3.6's
    CVImageProcess (tests/quant/test_calib_data.py)."""
    f32 = np.float32
    H, W = img.shape[:2]
    sx = f32(W - 1) / f32(w - 1) if w > 1 else f32(0)
    sy = f32(H - 1) / f32(h - 1) if h > 1 else f32(0)
    xs = np.cumsum(np.concatenate([[f32(0)], np.full(w - 1, sx, f32)]), dtype=f32)     # sequential, as MNN steps
    ys = np.arange(h, dtype=f32) * sy
    xs, ys = np.clip(xs, f32(0), f32(W - 1)), np.clip(ys, f32(0), f32(H - 1))
    x0, y0 = xs.astype(np.int64), ys.astype(np.int64)
    x1, y1 = np.ceil(xs).astype(np.int64), np.ceil(ys).astype(np.int64)
    xf, yf = (xs - x0.astype(f32))[None, :, None], (ys - y0.astype(f32))[:, None, None]
    one = f32(1)
    src = img.astype(f32)
    v = (one - xf) * (one - yf) * src[y0][:, x0] + xf * (one - yf) * src[y0][:, x1]
    v = v + yf * (one - xf) * src[y1][:, x0]
    v = v + xf * yf * src[y1][:, x1]
    return np.clip(v, f32(0), f32(255)).astype(np.uint8)


def _load_image(path: Path, prep: ImagePrep, shape) -> np.ndarray:
    try:
        from PIL import Image
    except ImportError:
        raise MnnToolError("image calibration data needs Pillow: pip install pillow") from None
    w, h = _target_size(path, prep, shape)
    try:
        with Image.open(path) as img:
            rgb = np.asarray(img.convert("RGB"), np.uint8)
    except Exception as e:
        raise MnnToolError(f"{path}: not a readable image ({type(e).__name__})") from None
    x = resize_bilinear(rgb, w, h).astype(np.int64)
    if prep.fmt == "GRAY":      # MNN's RGBA->GRAY: (19 R + 38 G + 7 B) >> 6, on the resized bytes
        x = (19 * x[:, :, 0:1] + 38 * x[:, :, 1:2] + 7 * x[:, :, 2:3]) >> 6
    elif prep.fmt == "BGR":
        x = x[:, :, ::-1]
    x = x.astype(np.float32)
    c = x.shape[2]
    x = (x - np.asarray(prep.mean[:c], np.float32)) * np.asarray(prep.normal[:c], np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None])


def aspect_note(files: list[Path], prep: ImagePrep, shape) -> str | None:
    """One line when resizing changes the images' aspect ratio (MNN's quantizer stretches them, and so
    does this reader; a model that letterboxes at inference then sees other statistics). Reads headers
    only."""
    from PIL import Image
    w, h = _target_size(files[0], prep, shape)
    changed = []
    for p in files:
        try:
            with Image.open(p) as img:
                W, H = img.size
        except Exception:       # noqa: BLE001 - an unreadable image is reported, named, when it is read
            continue
        if abs((W / H) / (w / h) - 1) > ASPECT_TOLERANCE:
            changed.append((p, W, H))
    if not changed:
        return None
    p, W, H = changed[0]
    return (f"{len(changed)} of {len(files)} calibration images change aspect ratio when resized to {w}x{h} "
            f"(e.g. {p.name}: {W}x{H}); MNN's quantizer stretches them the same way. If the application crops or "
            "letterboxes instead, preprocess the images that way and calibrate on .npy files")


class CalibrationReader:
    """Calibration samples as a stream (onnxruntime's CalibrationDataReader): iterating yields one feed
    dict at a time, read when it is needed, so calibrating holds one sample and the per-tensor
    histograms, never the whole set. A reader can be iterated again (auto-skip's evaluations do)."""

    def __iter__(self) -> Iterator[dict]:
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    def split(self, at: int) -> tuple[CalibrationReader, CalibrationReader]:
        """The samples before `at` and from `at` on, as two readers."""
        raise NotImplementedError


class ListReader(CalibrationReader):
    """Samples already in memory (a Python API caller's arrays)."""

    def __init__(self, samples: list[dict]):
        self.samples = list(samples)

    def __iter__(self):
        return iter(self.samples)

    def __len__(self):
        return len(self.samples)

    def split(self, at):
        return ListReader(self.samples[:at]), ListReader(self.samples[at:])


class FolderReader(CalibrationReader):
    """A folder of samples, sorted by name; each is read and checked against the model's inputs when the
    iteration reaches it. A sample is one of: a .npy (single-input models), a .npz with an array per
    input, an image (single-input NCHW models; preprocessed as MNN's quantizer does), or a folder with a
    file per input named after it (NAME.npy or an image NAME.jpg/.png/...; characters a file name cannot
    hold as _), for models with several inputs."""

    def __init__(self, folder, g: Graph, prep: ImagePrep | None = None, limit: int | None = None, files=None):
        self.folder, self.g, self.prep = Path(folder), g, prep or ImagePrep()
        self.notes: list[str] = []      # what the caller should tell the user (aspect ratios)
        if files is None:
            if not self.folder.is_dir():
                raise MnnToolError(f"{self.folder}: calibration folder does not exist")
            entries = sorted(self.folder.iterdir())
            files = [p for p in entries if p.suffix.lower() in IMAGE_SUFFIXES]
            if files:
                self._check_image_model()
                note = aspect_note(files[:limit] if limit else files, self.prep, g.tensors[g.inputs[0]].shape)
                self.notes += [note] if note else []
                if self.prep.is_identity:
                    self.notes.append(RAW_PIXELS_NOTE)
            else:
                files = [p for p in entries if p.suffix.lower() in (".npy", ".npz")] or \
                    [p for p in entries if p.is_dir()]
                if not files:
                    raise MnnToolError(f"{self.folder}: no samples in the folder (.npy, .npz, images, or a "
                                       "folder per sample with a file per input)")
        self.files = files[:limit] if limit else files

    def _check_image_model(self):
        g = self.g
        if len(g.inputs) != 1:
            raise MnnToolError(f"{self.folder}: image calibration of a model with several inputs ({', '.join(g.inputs)})"
                               " takes a folder per sample, with an image or .npy per input named after it")
        shape = g.tensors[g.inputs[0]].shape
        if shape is None or len(shape) != 4:
            raise MnnToolError(f"{self.folder}: image calibration needs an NCHW input, got {shape}")

    def __len__(self):
        return len(self.files)

    def __getstate__(self):
        """Pickled (a shard sent to a worker process or a Ray task) with the graph's inputs only: reading a
        sample needs their names and shapes, not the weights (21 MB a shard for EfficientNet-B0)."""
        g = self.g
        return dict(self.__dict__, g=Graph(inputs=list(g.inputs), tensors={n: g.tensors[n] for n in g.inputs
                                                                               if n in g.tensors}))

    def split(self, at):
        return (FolderReader(self.folder, self.g, self.prep, files=self.files[:at]),
                FolderReader(self.folder, self.g, self.prep, files=self.files[at:]))

    def __iter__(self):
        g = self.g
        for p in self.files:
            if p.is_dir():
                feeds = self._sample_folder(p)
            elif p.suffix.lower() in IMAGE_SUFFIXES:
                feeds = {g.inputs[0]: _load_image(p, self.prep, g.tensors[g.inputs[0]].shape)}
            else:
                spec = str(p) if p.suffix.lower() == ".npz" or len(g.inputs) != 1 else f"{g.inputs[0]}={p}"
                feeds = load_feeds([spec], g)
                missing = [n for n in g.inputs if n not in feeds]
                if missing:
                    raise MnnToolError(f"{p}: no data for input(s) {', '.join(missing)}")
            _check_sample(p, feeds, g)
            yield feeds

    def _sample_folder(self, folder: Path) -> dict:
        g = self.g
        by_stem: dict[str, Path] = {}
        for f in folder.iterdir():
            if f.suffix.lower() in IMAGE_SUFFIXES | {".npy"}:
                by_stem[f.stem] = f
        feeds = {}
        for name in g.inputs:
            f = by_stem.get(name) or by_stem.get(file_stem(name))
            if f is None:
                raise MnnToolError(f"{folder}: no file for input '{name}' ({file_stem(name)}.npy or an image "
                                   f"of that name; found: {', '.join(sorted(by_stem)) or 'nothing'})")
            if f.suffix.lower() == ".npy":
                feeds.update(load_feeds([f"{name}={f}"], g))
            else:
                shape = g.tensors[name].shape
                if shape is None or len(shape) != 4:
                    raise MnnToolError(f"{f}: input '{name}' is not an NCHW image input ({shape})")
                feeds[name] = _load_image(f, self.prep, shape)
        return feeds


def file_stem(name: str) -> str:
    """The file name an input's data goes under in a sample folder: the name with every character
    outside letters, digits, '_', '-' and '.' as '_' (input names such as 'input:0' or 'x/y')."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def _check_sample(path: Path, feeds: dict, g: Graph) -> None:
    for name, x in feeds.items():
        want = g.tensors[name].shape
        if want is not None and all(isinstance(d, int) and d > 0 for d in want) and tuple(x.shape) != tuple(want):
            raise MnnToolError(f"{path}: gives '{name}' shape {list(x.shape)}, the model wants {list(want)}")
        if x.dtype.kind == "f" and not np.isfinite(x).all():
            raise MnnToolError(f"{path}: input '{name}' contains NaN or infinite values")


def calibration_samples(folder, g: Graph, prep: ImagePrep | None = None, limit: int | None = None) -> list[dict]:
    """Every sample of a folder in memory (verify's --calib, which compares over all of them)."""
    return list(FolderReader(folder, g, prep, limit))
