"""Per-window logits on disk: each window's float32 [tokens, vocab] array saved to a work folder and handed
back memory-mapped, so vocab x tokens floats are never held for every window at once. Shared by MNN-LLM's
child (evaluate.mnn_logits) and mnntool's engine (engine/score.py)."""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np


def mapped(folder: Path, count: int) -> list[np.ndarray]:
    """Map win_0.npy .. win_{count-1}.npy read-only, then delete the folder (the mappings keep the data)."""
    try:
        return [np.load(folder / f"win_{i}.npy", mmap_mode="r") for i in range(count)]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def workdir(tmp_dir) -> Path:
    return Path(tempfile.mkdtemp(prefix="mnntool_eval_", dir=tmp_dir))
