"""Tensor comparison metrics shared by verify, quant reports and tests."""
from __future__ import annotations

import numpy as np


def metrics(ref: np.ndarray, got: np.ndarray) -> dict:
    a = np.asarray(ref, np.float64).ravel()
    b = np.asarray(got, np.float64).ravel()
    if a.shape != b.shape:
        return {"cosine": 0.0, "max_abs": float("inf"), "rel_l2": float("inf"), "snr_db": float("-inf"),
                "shape_mismatch": True}
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    cos = 1.0 if na == nb == 0 else float(a @ b / (na * nb)) if na and nb else 0.0
    err = np.linalg.norm(a - b)
    return {"cosine": cos, "max_abs": float(np.abs(a - b).max()) if a.size else 0.0,
            "rel_l2": float(err / na) if na else float(err),
            "snr_db": float(20 * np.log10(na / err)) if err else float("inf"),
            "scale": float(np.abs(a).max()) if a.size else 0.0}
