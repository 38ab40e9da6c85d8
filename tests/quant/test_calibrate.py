"""Calibrators on known distributions (independent reference: numpy's own statistics)."""
import numpy as np
import pytest

from mnntool.quant.calibrate import CALIBRATORS, Histogram

RNG = np.random.default_rng(0)
HEAVY = RNG.standard_t(2, 100_000).astype(np.float32)
UNIFORM = RNG.uniform(-3, 3, 100_000).astype(np.float32)


def amax(method, data, chunks=5):
    c = CALIBRATORS[method]()
    for part in np.array_split(data, chunks):
        c.observe(part)
    return c.amax()


def test_minmax_is_the_absolute_maximum():
    assert amax("minmax", HEAVY) == pytest.approx(float(np.abs(HEAVY).max()), rel=1e-6)


def test_kl_clips_a_heavy_tail_and_minmax_does_not():
    top = float(np.abs(HEAVY).max())
    assert amax("kl", HEAVY) < top / 3


def test_percentile_matches_numpy_within_a_bin():
    c = CALIBRATORS["percentile"]()
    c.observe(HEAVY)
    ref = float(np.percentile(np.abs(HEAVY), 99.99))
    assert abs(c.amax() - ref) <= 2 * c.hist.width


@pytest.mark.parametrize("method", ["kl", "mse", "percentile"])
def test_uniform_data_is_not_clipped_much(method):
    assert amax(method, UNIFORM) >= 0.95 * 3.0


def test_histogram_grows_without_losing_counts():
    h = Histogram()
    h.observe(np.linspace(-1, 1, 1000))
    h.observe(np.linspace(-10, 10, 1000))
    assert h.counts.sum() == 2000 and h.absmax == 10.0 and h.edge >= 10.0
