"""mnntool's own runtime for MNN-LLM bundles: the graph's decoder recognised (graph.py), the weights kept
quantized as the file stores them (weights.py), Numba kernels (qdot.py, qkernels.py, steps.py), a KV
cache owned by the engine (model.py), the bundle's tokenizer read back (tokenizer.py), generation
(generate.py) and the benchmark (bench.py)."""
from __future__ import annotations


def load(folder, threads: int = 1, context: int | None = None, precision: str = "normal"):
    from .generate import load as _load
    return _load(folder, threads=threads, context=context, precision=precision)
