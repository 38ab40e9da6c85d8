"""Run a .mnn file in the real MNN runtime (the `mnn` package), for comparisons and the oracle tests."""
from __future__ import annotations

import threading

import numpy as np

from ..errors import MnnToolError
from ..native_output import redirected_fd


def _mnn():
    """Import MNN with its C-level start-up banner sent to stderr, so --json output stays clean."""
    try:
        with redirected_fd(1, 2):
            import MNN  # noqa: N811
    except ImportError:
        raise MnnToolError("the MNN runtime is not installed: pip install 'mnntool[mnn]'") from None
    return MNN


class MnnSession:
    def __init__(self, path: str, inputs: list[str], outputs: list[str], threads: int | None = None,
                 memory: str | None = None):
        """memory "low": MNN keeps weight-only int8/int4 weights quantized and runs its dynamic-quant
        kernels on them (its LLM setting) instead of dequantizing them at load."""
        MNN = _mnn()
        self.MNN = MNN
        self.inputs, self.outputs = list(inputs), list(outputs)
        kwargs = {}
        if threads or memory:
            # load_module_from_file's own thread_num is not honoured (a "1 thread" module keeps both cores
            # busy); a runtime manager's numThread is
            config = {"numThread": int(threads or 1), "precision": "normal", "backend": "CPU"}
            if memory:
                config["memory"] = memory
            kwargs["runtime_manager"] = MNN.nn.create_runtime_manager((config,))
        self.module = MNN.nn.load_module_from_file(str(path), self.inputs, self.outputs, **kwargs)
        # an MNN Module keeps its tensors between forwards: one forward (and read of its outputs) at a
        # time. pymnn holds the GIL through forward, so threads gain nothing from a module each (8
        # threads x 30 MobileNetV2 runs: 2.26 s with a module per thread, 2.28 s sharing one under this
        # lock, 2.10 s serially): the lock costs nothing measurable and no module is loaded twice
        self._lock = threading.Lock()

    def run(self, feeds: dict[str, np.ndarray], profile=None) -> dict[str, np.ndarray]:
        """Safe from many threads at once (one forward at a time)."""
        with self._lock:
            return self._run(self.module, feeds)

    def _run(self, module, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        expr = self.MNN.expr
        vs = []
        for name in self.inputs:
            v = np.asarray(feeds[name], order="C")     # ascontiguousarray makes a scalar 1-d
            if v.dtype.kind in "iub":
                vs.append(expr.const(v.astype(np.int32), list(v.shape), expr.NCHW, expr.int))
            else:
                vs.append(expr.const(v.astype(np.float32), list(v.shape), expr.NCHW, expr.float))
        outs = module.forward(vs)
        if len(outs) < len(self.outputs):     # MNN prints why ("Create execution error") and returns nothing
            raise MnnToolError(f"the MNN runtime could not run the model (it returned {len(outs)} of "
                               f"{len(self.outputs)} outputs)")
        result = {}
        for name, o in zip(self.outputs, outs):
            if 0 in list(o.shape):         # MNN's read() fails on an empty tensor (no detections)
                result[name] = np.zeros(list(o.shape), np.float32)
                continue
            if o.data_format == expr.NC4HW4:
                o = expr.convert(o, expr.NCHW)
            result[name] = np.array(o.read()).copy()
        return result
