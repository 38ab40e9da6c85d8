"""Frontends: source framework files -> IR graphs. The frontend is chosen by the file."""
from __future__ import annotations

from pathlib import Path

from ..errors import MnnToolError

FRAMEWORKS = {".onnx": "onnx", ".pt2": "torch.export", ".pt": "torchscript", ".pth": "torchscript", ".torchscript": "torchscript",
              ".prototxt": "caffe", ".caffemodel": "caffe", ".pb": "tensorflow", ".keras": "tensorflow",
              ".h5": "tensorflow", ".hdf5": "tensorflow", ".tflite": "tflite"}


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


# framework name (and its aliases) -> (module, loader)
LOADERS = {"onnx": ("onnx", "load_onnx"), "torchscript": ("torchscript", "load_torchscript"),
           "torch.export": ("torchscript.exported", "load_exported"),
           "caffe": ("caffe", "load_caffe"), "tensorflow": ("tensorflow", "load_tensorflow"),
           "tflite": ("tflite", "load_tflite")}
ALIASES = {"pt2": "torch.export", "export": "torch.export", "torch": "torchscript", "pytorch": "torchscript", "tf": "tensorflow", "keras": "tensorflow"}


def load(path: str | Path, framework: str | None = None, input_shapes: dict | None = None):
    fw = detect(path, framework)
    fw = ALIASES.get(fw, fw)
    if fw not in LOADERS:
        raise MnnToolError(f"{path}: framework '{fw}' is not supported (supported: {', '.join(LOADERS)})")
    import importlib
    module, loader = LOADERS[fw]
    return getattr(importlib.import_module(f"{__name__}.{module}"), loader)(path, input_shapes or {})
