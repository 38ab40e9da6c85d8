"""Frontends: source framework files -> IR graphs. The frontend is chosen by the file."""
from __future__ import annotations

from pathlib import Path

from ..errors import MnnToolError

FRAMEWORKS = {".onnx": "onnx", ".pt": "torchscript", ".pth": "torchscript", ".torchscript": "torchscript",
              ".prototxt": "caffe", ".caffemodel": "caffe"}


def detect(path: str | Path, framework: str | None = None) -> str:
    if framework:
        return framework.lower()
    suffix = Path(path).suffix.lower()
    if suffix not in FRAMEWORKS:
        raise MnnToolError(f"{path}: cannot tell the framework from '{suffix}'; use --framework")
    return FRAMEWORKS[suffix]


def load(path: str | Path, framework: str | None = None, input_shapes: dict | None = None):
    fw = detect(path, framework)
    if fw == "onnx":
        from .onnx import load_onnx
        return load_onnx(path, input_shapes or {})
    if fw in ("torchscript", "torch", "pytorch"):
        from .torchscript import load_torchscript
        return load_torchscript(path, input_shapes or {})
    if fw == "caffe":
        from .caffe import load_caffe
        return load_caffe(path, input_shapes or {})
    raise MnnToolError(f"{path}: framework '{fw}' is not supported (supported: onnx, torchscript, caffe)")
