"""mnntool: convert, optimize, quantize, verify and benchmark models in MNN's .mnn format.

The Python API is the CLI's: each function returns the dict that the command's `--json` prints and
raises `mnntool.MnnToolError` where the command prints its one-line error.

    import mnntool
    mnntool.convert("model.onnx", "model.mnn")
    mnntool.quantize("model.mnn", "int8.mnn", int8=True, calib="calib/", method="mse")
    report = mnntool.verify("model.onnx", "int8.mnn", min_cosine=0.99)
    outputs = mnntool.load("int8.mnn").run({"input": x})

Importing it changes no process settings; `mnntool.threadpool.tune_process()` is the one call that does
(the CLI makes it).
"""
from ._version import MNN_FORMAT_VERSION, __version__
from .errors import MnnToolError

__all__ = ["MNN_FORMAT_VERSION", "MnnToolError", "__version__", "bench", "convert", "info", "load", "quantize",
           "verify"]


def convert(src, dst, *, framework: str | None = None, input_shapes: dict | None = None, optimize: int = 1,
            passes: list[str] | None = None, biz_code: str = "mnntool", external_weights: bool | None = None) -> dict:
    """Convert a model file (.onnx, .pt2, .pt, .prototxt, .pb/.keras/SavedModel, .tflite) into `dst`.

    `input_shapes` fixes open input dims ({"x": (1, 3, 224, 224)}); `optimize` is -O (0, 1, 2) and
    `passes` replaces the default pipeline; `external_weights` True writes the weights to `dst`.weight
    (MNN's --saveExternalData layout), None does so past 2000 MB. Returns the report: ops, params, size,
    per-pass changes."""
    from . import api
    return api.convert(src, dst, framework, input_shapes, optimize, biz_code, passes, external_weights)


def quantize(src, dst, *, int8: bool = False, calib=None, method: str = "mse", weight_bits: int | None = None,
             fp16: bool = False, progress=None, **options) -> dict:
    """Quantize a float .mnn into `dst`: int8 with calibration (`calib` a folder, a list of feed dicts
    or a `mnntool.quant.CalibrationReader`), weight-only (`weight_bits` 8 or 4) or fp16. Further
    `options` are `mnntool.quant.QuantConfig` fields (samples, skip, auto_skip, per_channel, threads,
    input_shapes, ...). Returns sizes, output cosine vs fp32 and per-layer accuracy."""
    from .quant import QuantConfig, quantize_file
    cfg = QuantConfig(int8=int8, calib=calib, method=method, weight_bits=weight_bits, fp16=fp16, **options)
    return quantize_file(src, dst, cfg, progress=progress)


def verify(source, model, *, feeds=None, input_shapes: dict | None = None, backend: str = "numba",
           min_cosine: float = 0.999, max_abs: float | None = None, threads: int | None = None,
           workers: int = 1, ray: str | None = None, outputs_only: bool = False, seed: int = 0) -> dict:
    """Compare every tensor of the .mnn `model` with the `source` model run in its own framework, on
    `feeds` (a dict, a list of dicts, or None for random N(0,1) inputs drawn with `seed`; a list split
    over `workers` local processes, or Ray tasks with `ray` an address). `report["pass"]` is the verdict:
    every output and every compared layer meets the thresholds (only the outputs with `outputs_only`);
    `report["exit_code"]` is the CLI's (0, 1, or 3 for files that are not the same model);
    `report["first_failing"]` names the first layer under `min_cosine`."""
    from .verifier import verify as run
    return run(source, model, feeds, input_shapes, backend, min_cosine, max_abs, threads, workers=workers, ray=ray,
               outputs_only=outputs_only, seed=seed)


def load(path, threads=None):
    """A runtime session: `mnntool.load("m.mnn").run({name: array}) -> {name: array}`."""
    from .api import load_session
    return load_session(path, threads)


def bench(path, *, backend: str = "numba", threads: int = 1, warmup: int = 5, runs: int = 50,
          input_shapes: dict | None = None, profile: bool = False) -> dict:
    """Time a model (median, percentiles, first run, load+prepare, GFLOP/s, peak RSS; per-op profile)."""
    from .timing import bench as run
    return run(path, backend, threads, warmup, runs, input_shapes, profile)


def info(path, *, framework: str | None = None, input_shapes: dict | None = None) -> dict:
    """Inputs, outputs, op counts, parameters, FLOPs and size of any model file mnntool reads."""
    from . import api
    return api.info(path, framework, input_shapes)
