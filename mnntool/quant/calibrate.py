"""Activation range calibrators: one histogram of |x| per tensor, four ways to pick the clipping range.

Feed a calibrator tensors (observe), then ask it for the range (amax); the int8 scale is amax / 127.
The histogram grows (re-binning what it holds) when a batch exceeds its range, so one pass suffices.
"""
from __future__ import annotations

import numpy as np

BINS = 2048
QMAX = 127


class Histogram:
    def __init__(self, bins: int = BINS):
        self.bins = bins
        self.counts = np.zeros(bins, np.float64)
        self.edge = 0.0     # upper edge of the last bin
        self.absmax = 0.0

    def observe(self, x: np.ndarray) -> None:
        a = np.abs(np.asarray(x, np.float32).ravel())
        if a.size == 0:
            return
        m = float(a.max())
        self.absmax = max(self.absmax, m)
        if m > self.edge:
            new_edge = m if self.edge == 0 else max(m, self.edge * 2)
            if self.edge > 0:     # re-bin what we have into the wider range
                centers = (np.arange(self.bins) + 0.5) * (self.edge / self.bins)
                idx = np.minimum((centers / new_edge * self.bins).astype(np.int64), self.bins - 1)
                counts = np.zeros(self.bins)
                np.add.at(counts, idx, self.counts)
                self.counts = counts
            self.edge = new_edge
        if self.edge == 0:
            self.counts[0] += a.size
            return
        hist, _ = np.histogram(a, bins=self.bins, range=(0.0, self.edge))
        self.counts += hist

    @property
    def width(self) -> float:
        return self.edge / self.bins if self.edge else 0.0


class Calibrator:
    """Base: collects the histogram; subclasses choose amax from it."""
    name = "base"

    def __init__(self):
        self.hist = Histogram()

    def observe(self, x) -> None:
        self.hist.observe(x)

    def amax(self) -> float:
        raise NotImplementedError

    def scale(self) -> float:
        return max(self.amax(), 1e-8) / QMAX


class MinMaxCalibrator(Calibrator):
    name = "minmax"

    def amax(self) -> float:
        return self.hist.absmax


class PercentileCalibrator(Calibrator):
    name = "percentile"

    def __init__(self, percentile: float = 99.99):
        super().__init__()
        self.percentile = percentile

    def amax(self) -> float:
        c = np.cumsum(self.hist.counts)
        if c[-1] == 0:
            return 0.0
        k = int(np.searchsorted(c, c[-1] * self.percentile / 100.0))
        return min((k + 1) * self.hist.width, self.hist.absmax)


class MseCalibrator(Calibrator):
    """The clipping range with the least expected squared quantization error over the histogram."""
    name = "mse"

    def amax(self) -> float:
        h = self.hist
        if h.edge == 0:
            return 0.0
        centers = (np.arange(h.bins) + 0.5) * h.width
        best, best_err = h.absmax, np.inf
        for t in np.geomspace(max(h.width * 4, h.absmax * 1e-3), h.absmax, 160):
            s = t / QMAX
            q = np.clip(np.rint(centers / s), 0, QMAX) * s
            err = float(np.sum(h.counts * (centers - q) ** 2))
            if err < best_err:
                best, best_err = t, err
        return float(best)


class KlCalibrator(Calibrator):
    """TensorRT's entropy calibration: the threshold whose 128-level quantized distribution is closest
    (KL divergence) to the clipped reference distribution."""
    name = "kl"
    LEVELS = QMAX + 1

    def amax(self) -> float:
        h = self.hist
        counts = h.counts
        if counts.sum() == 0 or h.edge == 0:
            return 0.0
        nonzero = np.flatnonzero(counts)
        last = int(nonzero[-1]) + 1
        start = min(self.LEVELS, last)
        best_i, best_kl = last, np.inf
        for i in range(start, last + 1, max(1, (last - start) // 256 or 1)):
            p = counts[:i].copy()
            p[i - 1] += counts[i:].sum()          # outliers fold into the last kept bin
            chunks = np.array_split(np.arange(i), self.LEVELS)
            q = np.zeros(i)
            src = counts[:i]
            for idx in chunks:
                if idx.size == 0:
                    continue
                nz = src[idx] > 0
                if nz.any():
                    q[idx[nz]] = src[idx].sum() / nz.sum()
            p_sum, q_sum = p.sum(), q.sum()
            if q_sum == 0:
                continue
            pn, qn = p / p_sum, q / q_sum
            mask = pn > 0
            if np.any(qn[mask] == 0):
                kl = np.inf
            else:
                kl = float(np.sum(pn[mask] * np.log(pn[mask] / qn[mask])))
            if kl < best_kl:
                best_i, best_kl = i, kl
        return min((best_i + 0.5) * h.width, h.absmax)


CALIBRATORS = {c.name: c for c in (KlCalibrator, MseCalibrator, PercentileCalibrator, MinMaxCalibrator)}


def make(method: str) -> Calibrator:
    from ..errors import MnnToolError
    if method not in CALIBRATORS:
        raise MnnToolError(f"unknown calibration method '{method}' (kl, mse, percentile, minmax)")
    return CALIBRATORS[method]()
