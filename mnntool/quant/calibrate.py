"""Activation range calibrators: one histogram of |x| per tensor, four ways to pick the clipping range.

Feed a calibrator tensors (observe), then ask it for the range (amax) and the int8 grid (scale, zero).
A tensor that was never negative (a ReLU's output) gets the whole int8 range for [0, amax]: 254 steps
with zero point -127 (real = scale * (q - zero)), as MNN's asymmetric (EMA) quantizer writes it, where a
symmetric grid would waste the negative half. Other tensors get [-amax, amax] in 127 steps each way.
The histogram grows (summing runs of bins) when a batch exceeds its range, so one pass suffices, and
histograms of separate shards of the data merge into exactly the histogram of the whole.
"""
from __future__ import annotations

import math

import numpy as np

BINS = 4096     # the used part (up to absmax) is 2048-4096 bins: the range is a power of two
QMAX = 127


def _edge_above(m: float) -> float:
    """The least power of two above m (m > 0)."""
    return math.ldexp(1.0, math.frexp(m)[1])


class Histogram:
    """Counts of |x| in `bins` equal bins over [0, edge), edge the least power of two above every |x|
    seen. A value's bin is floor(|x| * bins / edge), exact in float64 since bins/edge is a power of two,
    and widening the range by 2^k sums runs of 2^k bins, which is what binning at the wider range gives.
    So the histogram depends only on the values seen, never on their order or on how they were split:
    histograms of shards merge exactly (quant --workers gives the single process's file bit for bit).
    """

    def __init__(self, bins: int = BINS):
        self.bins = bins
        self.counts = np.zeros(bins, np.float64)
        self.edge = 0.0     # upper edge of the last bin (0 while only zeros were seen)
        self.absmax = 0.0
        self.negative = False   # any value below zero seen
        self.negmax = 0.0       # the largest -x seen (0 when never negative)
        self.samples = 0        # arrays observed

    def observe(self, x: np.ndarray) -> None:
        x = np.asarray(x, np.float32).ravel()
        if x.size == 0:
            return
        self.samples += 1
        low = float(x.min())
        self.negative = self.negative or low < 0
        self.negmax = max(self.negmax, -low)
        a = np.abs(x)
        m = float(a.max())
        if not math.isfinite(m):
            raise ValueError("infinite or NaN values")
        self.absmax = max(self.absmax, m)
        if m > 0:
            self._widen(_edge_above(m))
        if self.edge == 0:
            self.counts[0] += a.size
            return
        idx = (a.astype(np.float64) * (self.bins / self.edge)).astype(np.int64)
        self.counts += np.bincount(idx, minlength=self.bins)

    def _at(self, edge: float) -> np.ndarray:
        """The counts over [0, edge), a power of two at least this histogram's edge: runs of bins summed."""
        if self.edge == 0 or edge == self.edge:
            return self.counts
        f = int(edge / self.edge)      # a power of two
        counts = np.zeros(self.bins)
        if f >= self.bins:
            counts[0] = self.counts.sum()
        else:
            counts[:self.bins // f] = self.counts.reshape(-1, f).sum(1)
        return counts

    def _widen(self, edge: float) -> None:
        if edge > self.edge:
            self.counts, self.edge = self._at(edge), edge

    def merge(self, other: Histogram) -> None:
        """Add another histogram's counts (of other samples of the same tensor)."""
        self._widen(other.edge)
        self.counts = self.counts + other._at(self.edge)
        self.absmax = max(self.absmax, other.absmax)
        self.negative = self.negative or other.negative
        self.negmax = max(self.negmax, other.negmax)
        self.samples += other.samples

    @property
    def width(self) -> float:
        return self.edge / self.bins if self.edge else 0.0


# a tensor whose negative values reach at most this fraction of its largest magnitude (a SiLU's output:
# down to -0.28, up to 0.8 or several units) gets an offset grid over [-negmax, amax] where its readers
# take zero points: the step is (amax + negmax) / 254 against amax / 127 on [-amax, amax]
OFFSET_FRACTION = 0.5


class Calibrator:
    """Base: collects the histogram; subclasses choose amax from it."""
    name = "base"

    def __init__(self, asymmetric: bool = True):
        self.hist = Histogram()
        self.asymmetric = asymmetric
        self.offset = False         # an offset grid is allowed (the reader quantizes with any zero point): `make`

    def observe(self, x) -> None:
        self.hist.observe(x)

    @property
    def one_sided(self) -> bool:
        return (self.asymmetric and not self.hist.negative) or self._offset_grid()

    def _offset_grid(self) -> bool:
        h = self.hist
        return self.offset and h.negative and h.negmax <= OFFSET_FRACTION * h.absmax

    @property
    def steps(self) -> int:
        """Grid steps between 0 and amax: 127 for a symmetric grid, 254 for a one-sided one."""
        return 2 * QMAX if self.one_sided else QMAX

    def amax(self) -> float:
        raise NotImplementedError

    def grid(self) -> tuple[float, int]:
        """(scale, zero point) of the int8 grid. An offset grid puts its 254 steps over [-negmax, amax],
        amax chosen as for a one-sided grid, the zero point the step nearest -negmax."""
        amax = max(self.amax(), 1e-8)
        if self._offset_grid():
            neg = self.hist.negmax
            scale = (amax + neg) / self.steps
            return scale, -QMAX + min(int(math.ceil(neg / scale)), QMAX)
        return amax / self.steps, -QMAX if self.one_sided else 0


class MinMaxCalibrator(Calibrator):
    name = "minmax"

    def amax(self) -> float:
        return self.hist.absmax


class PercentileCalibrator(Calibrator):
    name = "percentile"

    def __init__(self, asymmetric: bool = True, percentile: float = 99.99):
        super().__init__(asymmetric)
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
        steps = self.steps
        for t in np.geomspace(max(h.width * 4, h.absmax * 1e-3), h.absmax, 160):
            s = t / steps
            q = np.clip(np.rint(centers / s), 0, steps) * s
            err = float(np.sum(h.counts * (centers - q) ** 2))
            if err < best_err:
                best, best_err = t, err
        return float(best)


# A tensor of fewer values a sample is a vector whose every value matters, not a distribution with a
# tail to cut: KL keeps its whole range (squeeze-excite vectors, C values a sample: MobileNetV3's SE
# gates clipped to 0.42 of their range by KL, output cosine 0.59; with them unclipped 0.998, as mse).
KL_MIN_SIZE = 4096


class KlCalibrator(Calibrator):
    """TensorRT's entropy calibration: the threshold whose quantized distribution (128 levels, or 255 on
    a one-sided grid) is closest (KL divergence) to the clipped reference distribution."""
    name = "kl"

    def amax(self) -> float:
        h = self.hist
        levels = self.steps + 1
        counts = h.counts.copy()
        if counts.sum() == 0 or h.edge == 0:
            return 0.0
        if counts.sum() < KL_MIN_SIZE * max(h.samples, 1):
            return h.absmax
        # a ReLU's zeros pile up in the first bin; left there, that spike dominates the divergence and
        # pulls the threshold far down (ResNet-18 stem: 0.50 of a 1.93 range, layer cosine 0.976)
        counts[0] = counts[1]
        nonzero = np.flatnonzero(counts)
        last = int(nonzero[-1]) + 1
        start = min(levels, last)
        best_i, best_kl = last, np.inf
        for i in range(start, last + 1, max(1, (last - start) // 256 or 1)):
            p = counts[:i].copy()
            p[i - 1] += counts[i:].sum()          # outliers fold into the last kept bin
            chunks = np.array_split(np.arange(i), levels)
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


def make(method: str, asymmetric: bool = True, offset: bool = False) -> Calibrator:
    from ..errors import MnnToolError
    if method not in CALIBRATORS:
        raise MnnToolError(f"unknown calibration method '{method}' (kl, mse, percentile, minmax)")
    cal = CALIBRATORS[method](asymmetric)
    cal.offset = offset
    return cal
