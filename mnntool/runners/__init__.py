"""One interface over every engine mnntool runs a model on (Polygraphy's runners, in our shape): a
Runner loads a model, runs feeds to outputs, runs to every tensor it can expose (per-layer outputs in
graph order, for verify), and can profile. `bench` times any runner, `verify` compares a source
framework's runner with one of the .mnn's."""
from __future__ import annotations

from pathlib import Path

from ..errors import MnnToolError
from .base import Runner

# --backend name -> (module, class): the runners of a .mnn (or of a source converted on the way)
BACKENDS = {"numba": ("own", "OwnRunner"), "mnn": ("mnn", "MnnRunner"), "onnxruntime": ("ort", "OrtRunner"),
            "openvino": ("openvino", "OpenVinoRunner")}
# framework -> (module, class): the runner of a source model in its own framework, for verify
REFERENCES = {"onnx": ("ort", "OrtRunner"), "caffe": ("caffe", "OpenCvRunner"),
              "torchscript": ("torchscript", "TorchRunner"), "torch.export": ("torchscript", "ExportedRunner"),
              "tensorflow": ("tensorflow", "TfRunner")}


def _class(module: str, name: str):
    import importlib
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def backend_runner(path, backend: str, threads: int | None = 1, shapes: dict | None = None) -> Runner:
    """The runner `--backend` names for a model file."""
    if backend not in BACKENDS:
        raise MnnToolError(f"unknown backend '{backend}' ({', '.join(BACKENDS)})")
    return _class(*BACKENDS[backend])(Path(path), threads, shapes or {})


def reference_runner(source, shapes: dict | None = None, allow_io: bool = False) -> Runner:
    """The source model's own framework, every tensor it can expose kept: what verify compares against."""
    from ..frontends import detect
    source = Path(source)
    if source.suffix.lower() == ".mnn":
        raise MnnToolError(f"{source}: the source must be the original model (.onnx, .pt, .prototxt, .pb, .keras "
                           "or a SavedModel directory), not a .mnn file")
    fw = detect(source)
    if fw not in REFERENCES:
        raise MnnToolError(f"{source}: verify cannot run {fw} models")
    extra = {"allow_io": allow_io} if fw == "tensorflow" else {}
    return _class(*REFERENCES[fw])(source, None, shapes or {}, reference=True, **extra)
