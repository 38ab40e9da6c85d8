"""Frontends: source framework files -> IR graphs. The frontend is chosen by the file."""
from __future__ import annotations

from pathlib import Path

from ..errors import MnnToolError

FRAMEWORKS = {".onnx": "onnx", ".pt": "torchscript", ".pth": "torchscript", ".torchscript": "torchscript",
              ".prototxt": "caffe", ".caffemodel": "caffe", ".pb": "tensorflow", ".keras": "tensorflow",
              ".h5": "tensorflow", ".hdf5": "tensorflow"}


def detect(path: str | Path, framework: str | None = None) -> str:
    if framework:
        return framework.lower()
    if Path(path).is_dir():
        if (Path(path) / "saved_model.pb").exists():
            return "tensorflow"
        raise MnnToolError(f"{path}: a directory, but not a TensorFlow SavedModel (no saved_model.pb)")
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
    if fw in ("tensorflow", "tf", "keras"):
        from .tensorflow import load_tensorflow
        return load_tensorflow(path, input_shapes or {})
    raise MnnToolError(f"{path}: framework '{fw}' is not supported (supported: onnx, torchscript, caffe, "
                       "tensorflow)")
