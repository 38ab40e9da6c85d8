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


class Sums:
    """What `metrics` needs of a pair of tensors, as sums that add: metrics over many samples come from
    the per-sample sums merged in sample order, so a verify split over processes gives the single
    process's numbers bit for bit."""

    __slots__ = ("ab", "aa", "bb", "ee", "max_abs", "scale", "size")

    def __init__(self, ab=0.0, aa=0.0, bb=0.0, ee=0.0, max_abs=0.0, scale=0.0, size=0):
        self.ab, self.aa, self.bb, self.ee = ab, aa, bb, ee
        self.max_abs, self.scale, self.size = max_abs, scale, size

    @classmethod
    def of(cls, ref, got) -> Sums:
        a = np.asarray(ref, np.float64).ravel()
        b = np.asarray(got, np.float64).reshape(-1)
        if a.shape != b.shape:
            raise ValueError(f"shapes {a.shape} and {b.shape}")
        e = a - b
        return cls(float(a @ b), float(a @ a), float(b @ b), float(e @ e),
                   float(np.abs(e).max()) if a.size else 0.0, float(np.abs(a).max()) if a.size else 0.0, a.size)

    @classmethod
    def total(cls, parts) -> Sums:
        """The parts merged in the order given (the order fixes the float sums)."""
        t = cls()
        for p in parts:
            t = t.merge(p)
        return t

    def merge(self, other: Sums) -> Sums:
        return Sums(self.ab + other.ab, self.aa + other.aa, self.bb + other.bb, self.ee + other.ee,
                    max(self.max_abs, other.max_abs), max(self.scale, other.scale), self.size + other.size)

    def metrics(self) -> dict:
        na, nb, err = np.sqrt(self.aa), np.sqrt(self.bb), np.sqrt(self.ee)
        cos = 1.0 if na == nb == 0 else float(self.ab / (na * nb)) if na and nb else 0.0
        return {"cosine": cos, "max_abs": self.max_abs, "rel_l2": float(err / na) if na else float(err),
                "snr_db": float(20 * np.log10(na / err)) if err else float("inf"), "scale": self.scale}
