"""Language models: export to MNN-LLM's bundle."""


def load(folder, threads: int = 1, context: int | None = None, precision: str = "normal", kv_int8: bool = False):
    """An MNN-LLM bundle in mnntool's runtime: `.generate(prompt, max_new_tokens=...)`, `.forward(ids)`;
    kv_int8: the KV cache in 8-bit codes (engine/kv8.py)."""
    from .engine import load as _load
    return _load(folder, threads=threads, context=context, precision=precision, kv_int8=kv_int8)
