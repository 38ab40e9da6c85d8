"""Language models: export to MNN-LLM's bundle."""


def load(folder, threads: int = 1, context: int | None = None, precision: str = "normal"):
    """An MNN-LLM bundle in mnntool's runtime: `.generate(prompt, max_new_tokens=...)`, `.forward(ids)`."""
    from .engine import load as _load
    return _load(folder, threads=threads, context=context, precision=precision)
