"""onnxruntime on the source .onnx: the speed reference for bench, and the per-layer reference for
verify (every tensor made a graph output, graph optimizations off so each keeps its own value)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import MnnToolError
from .base import Runner


class OrtRunner(Runner):
    name = "onnxruntime"

    def __init__(self, path: Path, threads: int | None, shapes: dict, reference: bool = False):
        if path.suffix.lower() != ".onnx":
            raise MnnToolError(f"{path}: onnxruntime needs the source .onnx model")
        self.path, self.shapes, self.threads = path, shapes, threads
        self.graph = None
        self.session = None
        if not reference:
            from ..frontends.onnx import load_onnx
            self.graph = load_onnx(path, shapes)
            self.session = self._open(str(path), optimize=True)

    def _open(self, model, optimize: bool):
        try:
            import onnxruntime as ort
        except ImportError:
            raise MnnToolError("running the source .onnx needs onnxruntime: pip install 'mnntool[onnxruntime]'") \
                from None
        opts = ort.SessionOptions()
        if self.threads:
            opts.intra_op_num_threads = self.threads
            opts.inter_op_num_threads = 1
        if not optimize:
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        try:
            return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
        except Exception as e:
            raise MnnToolError(f"{self.path}: onnxruntime cannot load it ({str(e)[:160]})") from None

    def _feeds(self, sess, feeds: dict) -> dict:
        if getattr(sess, "_input_types", None) is None:     # asked once: a timed run should not ask again
            sess._input_types = {i.name: i.type for i in sess.get_inputs()}
        types = sess._input_types
        missing = [n for n in types if n not in feeds]
        if missing:
            raise MnnToolError(f"{self.path}: no data for input(s) {', '.join(missing)}")
        return {k: (v.astype(np.int64, copy=False) if "int64" in types[k] else
                    v.astype(np.float32, copy=False) if "float" in types[k] else v)
                for k, v in feeds.items() if k in types}

    def run(self, feeds):
        if self.session is None:
            self.session = self._open(str(self.path), optimize=True)
        return dict(zip(self._names(), self.session.run(None, self._feeds(self.session, feeds))))

    def _names(self) -> list[str]:
        if getattr(self, "_outputs", None) is None:
            self._outputs = [o.name for o in self.session.get_outputs()]
        return self._outputs

    def run_all(self, feeds, wanted=None):
        from onnx import helper, shape_inference

        from ..frontends.onnx import _fix_input_shapes, _read
        model = _read(self.path)
        _fix_input_shapes(self.path, model, self.shapes)
        try:
            inferred = shape_inference.infer_shapes(model, strict_mode=False)
        except Exception:
            inferred = model
        typed = {vi.name: vi for vi in inferred.graph.value_info}
        existing = {o.name for o in model.graph.output}
        order = []
        for node in model.graph.node:
            for o in node.output:
                if not o:
                    continue
                order.append((o, node.op_type))
                if o not in existing:
                    model.graph.output.append(typed[o] if o in typed else helper.make_empty_tensor_value_info(o))
                    existing.add(o)
        sess = self._open(model.SerializeToString(), optimize=False)
        names = [o.name for o in sess.get_outputs()]
        return dict(zip(names, sess.run(None, self._feeds(sess, feeds)))), order
