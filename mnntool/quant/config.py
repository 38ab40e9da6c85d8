"""What `quant` does, as one value: the CLI, the Python API and a --config JSON file all fill it."""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import MnnToolError
from .calibrate import CALIBRATORS
from .data import ImagePrep

WEIGHT_BITS = (8, 4)
BLOCK_SIZES = (16, 32, 64, 128, 256, 512, 1024)     # --block-size: input channels that share one scale
FILE_KEYS = ("method", "skip", "per_channel", "samples", "symmetric_activations")   # what --config may set
OLD_KEYS = {"batches": "samples"}


@dataclass(frozen=True)
class QuantConfig:
    # the mode: exactly one
    int8: bool = False
    weight_bits: int | None = None      # weight-only, 8 or 4
    fp16: bool = False
    # int8 post-training quantization
    calib: object = None                # a folder of samples, or a data.CalibrationReader
    method: str = "mse"
    per_channel: bool = True
    samples: int | None = None          # calibrate on the first N samples
    threads: int = 1                    # for the runtime sessions that calibrate and evaluate
    workers: int = 1                    # local processes calibrating shards of the samples (quant.shards)
    ray: str | None = None              # calibrate on a Ray cluster: 'local', 'auto' or ray://HOST:PORT
    skip: tuple = ()                    # layers (or tensors) kept in float
    auto_skip: float | None = None      # keep the fewest layers in float for output cosine >= this
    skip_budget: float | None = None    # at most this % of the weights (or MACs) kept float, by sensitivity
    skip_budget_by: str = "weights"     # what --skip-budget counts: weights or macs
    bias_correction: bool = True
    symmetric_activations: bool = False
    float_weights: bool = False         # layers kept float keep fp32 weights (default: weight-only int8)
    prep: ImagePrep | None = field(default=None)
    input_shapes: dict = field(default_factory=dict)   # open dims fixed for reading calibration data only
    # weight-only
    asymmetric: bool = False
    block_size: int | None = None
    hqq: bool = False                   # zero points by half-quadratic optimisation (implies asymmetric)
    head_bits: int | None = None        # bits of the output layers (weight_only.head_layers); None: 8 at int4
    compression_params: str | None = None         # MNN's per-layer JSON (--compressionParamsFile) to follow
    write_compression_params: str | None = None   # write the weight-only plan used in that format
    target_bits: float | None = None    # weight-only, 4 or 8 bits per layer for this average (bit_budget)
    # the output: weights in a .mnn.weight file beside it (True), or when they pass 2000 MB (None)
    external_weights: bool | None = None

    def resolved_head_bits(self) -> int | None:
        return self.head_bits if self.head_bits is not None else (8 if self.weight_bits == 4 else None)

    def with_file(self, path) -> QuantConfig:
        """This config with a JSON file's settings on top (its `skip` adds to ours)."""
        try:
            cfg = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise MnnToolError(f"{path}: no such config file") from None
        except json.JSONDecodeError as e:
            raise MnnToolError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
        if not isinstance(cfg, dict):
            raise MnnToolError(f"{path}: a config file holds one JSON object")
        cfg = {OLD_KEYS.get(k, k): v for k, v in cfg.items()}
        unknown = sorted(set(cfg) - set(FILE_KEYS))
        if unknown:
            raise MnnToolError(f"{path}: unknown setting(s) {', '.join(unknown)} (known: {', '.join(FILE_KEYS)})")
        if "skip" in cfg:
            cfg["skip"] = tuple(self.skip) + tuple(cfg["skip"])
        return replace(self, **cfg)

    def check(self) -> None:
        if sum([bool(self.int8), self.weight_bits is not None or self.target_bits is not None, bool(self.fp16)]) != 1:
            raise MnnToolError("choose exactly one of --int8, --weight-bits 8|4 (or --target-bits), --fp16")
        if self.block_size is not None and not self.weight_only():
            raise MnnToolError("--block-size applies to weight-only quantization: add --weight-bits 8|4")
        if self.head_bits is not None and not self.weight_only():
            raise MnnToolError("--head-bits applies to weight-only quantization: add --weight-bits 8|4")
        if self.hqq and not self.weight_only():
            raise MnnToolError("--hqq applies to weight-only quantization: add --weight-bits 8|4")
        if self.workers < 1:
            raise MnnToolError(f"--workers must be at least 1, got {self.workers}")
        if self.ray is not None and not self.int8:
            raise MnnToolError("--ray calibrates int8 quantization: add --int8")
        if self.int8 and self.calib is None:
            raise MnnToolError("--int8 needs calibration data: --calib DIR")
        if self.int8 and self.method not in CALIBRATORS:
            raise MnnToolError(f"unknown calibration method '{self.method}' ({', '.join(CALIBRATORS)})")
        self._check_ranges()

    def _check_ranges(self) -> None:
        """Every number in its stated range, and no option that means nothing in the chosen mode, before
        any work: one line naming the option and the range."""
        if self.weight_bits is not None and self.weight_bits not in WEIGHT_BITS:
            raise MnnToolError(f"--weight-bits: only 8 and 4 are supported, got {self.weight_bits}")
        if self.head_bits is not None and self.head_bits not in WEIGHT_BITS:
            raise MnnToolError(f"--head-bits: only 8 and 4 are supported, got {self.head_bits}")
        if self.block_size is not None and self.block_size not in BLOCK_SIZES:
            raise MnnToolError(f"--block-size must be a power of two from {BLOCK_SIZES[0]} to {BLOCK_SIZES[-1]} "
                               f"(input channels per scale), got {self.block_size}")
        self._check_budgets()
        if self.auto_skip is not None:
            if not self.int8 and self.weight_bits is None:
                raise MnnToolError("--auto-skip chooses layers to keep float in int8 or weight-only quantization: "
                                   "add --int8 or --weight-bits 8|4")
            if not 0.0 < self.auto_skip <= 1.0:     # (also false for NaN)
                raise MnnToolError(f"--auto-skip is a target output cosine, in (0, 1], got {self.auto_skip}")
        if self.samples is not None and self.samples < 1:
            raise MnnToolError(f"--samples must be at least 1, got {self.samples}")
        if self.threads is not None and self.threads < 1:
            raise MnnToolError(f"--threads must be at least 1, got {self.threads}")
        if not self.int8 and not self.measures():
            if self.calib is not None:
                mode = "--fp16" if self.fp16 else f"--weight-bits {self.weight_bits}"
                raise MnnToolError(f"--calib calibrates int8 activations; {mode} quantizes weights only and "
                                   "reads no data (only to measure layers for --target-bits, --auto-skip or "
                                   "--skip-budget): drop --calib, or use --int8")
        if self.prep is not None:
            self.prep.check()

    def weight_only(self) -> bool:
        return self.weight_bits is not None or self.target_bits is not None

    def measures(self) -> bool:
        """Whether layers are chosen by measured sensitivity (quant.sensitivity): they read inputs."""
        return self.target_bits is not None or self.skip_budget is not None or (
            self.auto_skip is not None and not self.int8)

    def _check_budgets(self) -> None:
        if self.target_bits is not None:
            lo, hi = min(WEIGHT_BITS), max(WEIGHT_BITS)
            if not lo <= self.target_bits <= hi:       # (also false for NaN)
                raise MnnToolError(f"--target-bits is the average bits per weight, scales counted, between {lo} and "
                                   f"{hi} (the widths a layer takes), got {self.target_bits:g}")
            if self.weight_bits is not None:
                raise MnnToolError("--target-bits chooses each layer's width (4 or 8): drop --weight-bits")
            if self.compression_params:
                raise MnnToolError("--target-bits chooses each layer's width; --compression-params fixes them: "
                                   "use one")
            if self.auto_skip is not None or self.skip_budget is not None:
                raise MnnToolError("--target-bits chooses widths, not layers to keep float: drop --auto-skip "
                                   "and --skip-budget (or use --skip NAMES)")
        if self.skip_budget is not None:
            if not self.int8 and self.weight_bits is None:
                raise MnnToolError("--skip-budget limits the layers kept float in int8 or weight-only quantization:"
                                   " add --int8 or --weight-bits 8|4")
            if not 0.0 <= self.skip_budget <= 100.0:
                raise MnnToolError(f"--skip-budget is a percentage of the weights in [0, 100], "
                                   f"got {self.skip_budget:g}")
        if self.skip_budget_by not in ("weights", "macs"):
            raise MnnToolError(f"--skip-budget-by: weights or macs, got {self.skip_budget_by}")
