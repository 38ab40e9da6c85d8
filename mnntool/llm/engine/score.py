"""Every position's logits of evaluation windows from mnntool's engine: `llm eval --runtime mnntool` and
`--kv-int8` (the engine's 8-bit KV cache, which MNN-LLM's Python API cannot be asked for).

The counterpart of evaluate.mnn_logits: one model for all windows, the cache emptied before each
(Model.reset: positions from 0), each window's float32 [len(ids), vocab] logits written to a .npy in a
work folder and handed back memory-mapped (logit_files.mapped), so vocab x tokens floats are never held
for all windows at once. In-process: the engine is mnntool's own code (MNN-LLM runs in a child because
it can crash its process).
"""
from __future__ import annotations

import numpy as np


def engine_logits(bundle, windows_: list, threads: int = 1, kv_int8: bool = False, precision: str = "normal",
                  tmp_dir=None) -> list:
    """Logits of every position of each window (evaluate.Window) from the engine, memory-mapped."""
    import shutil

    from ..logit_files import mapped as _mapped, workdir as _workdir
    from .model import Model
    ctx = max((len(w.ids) for w in windows_), default=1)
    m = Model.load(bundle, threads=threads, context=ctx + 1, precision=precision, kv_int8=kv_int8)
    work = _workdir(tmp_dir)
    try:
        for i, w in enumerate(windows_):
            m.reset()
            a = np.ascontiguousarray(m.forward(w.ids, all_logits=True), np.float32)
            np.save(work / f"win_{i}.npy", a)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return _mapped(work, len(windows_))
