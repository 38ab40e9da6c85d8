"""mnntool's own runtime for MNN-LLM bundles: the bundle's files (files.py), the graph's decoder
recognised from its ops (graph.py), the weights kept quantized with the file's values (weights.py), Numba
kernels (packed.py: int4/int8 GEMV and GEMM on int16 inputs; qkernels.py + qdot.py: float32 inputs on the
file's layout; steps.py: norms, RoPE, attention), a KV cache owned by the engine (model.py, kernels.py;
kv8.py: its int8 form), the bundle's tokenizer read back (tokenizer.py), generation and sampling
(generate.py), the benchmark (bench.py) with the host's memory bandwidth (membw.py), and a per-step
profile (profile.py)."""
from __future__ import annotations


def load(folder, threads: int = 1, context: int | None = None, precision: str = "normal", kv_int8: bool = False):
    from .generate import load as _load
    return _load(folder, threads=threads, context=context, precision=precision, kv_int8=kv_int8)
