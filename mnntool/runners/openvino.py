"""OpenVINO's CPU plugin on the source .onnx: the second speed reference of `bench` and the paired
benchmarks (the runtime Intel users compare mnntool with). Latency hint and f32 inference precision,
so it computes what onnxruntime and mnntool compute (its default on AVX-512 BF16/AMX hosts is bf16)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import MnnToolError
from .base import Runner


class OpenVinoRunner(Runner):
    name = "openvino"

    def __init__(self, path: Path, threads: int | None, shapes: dict, reference: bool = False):
        if path.suffix.lower() != ".onnx":
            raise MnnToolError(f"{path}: OpenVINO runs the source .onnx model")
        try:
            import openvino as ov
        except ImportError:
            raise MnnToolError("--backend openvino needs OpenVINO: pip install 'mnntool[bench]'") from None
        from ..frontends.onnx import load_onnx
        self.path = path
        self.graph = load_onnx(path, shapes)
        config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"}
        if threads:
            config["INFERENCE_NUM_THREADS"] = int(threads)
        try:
            core = ov.Core()
            model = core.read_model(str(path))
            fixed = {i: tuple(self.graph.tensors[i].shape) for i in self.graph.inputs
                     if self.graph.tensors[i].shape and all(isinstance(d, int) for d in self.graph.tensors[i].shape)}
            if fixed:       # the shapes mnntool plans for, so both run the same problem
                model.reshape({k: ov.PartialShape(list(v)) for k, v in fixed.items()})
            self.compiled = core.compile_model(model, "CPU", config)
        except Exception as e:      # noqa: BLE001 - OpenVINO raises RuntimeError subclasses of its own
            raise MnnToolError(f"{path}: OpenVINO cannot load it ({' '.join(str(e).split())[:160]})") from None
        self.request = self.compiled.create_infer_request()
        self._inputs = [p.get_any_name() for p in self.compiled.inputs]
        self._outputs = [p.get_any_name() for p in self.compiled.outputs]

    def run(self, feeds):
        missing = [n for n in self._inputs if n not in feeds]
        if missing:
            raise MnnToolError(f"{self.path}: no data for input(s) {', '.join(missing)}")
        result = self.request.infer({n: np.ascontiguousarray(feeds[n]) for n in self._inputs})
        return {name: np.asarray(result[port]) for name, port in zip(self._outputs, self.compiled.outputs)}
