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


@pytest.mark.parametrize("method", ["kl", "mse", "percentile", "minmax"])
def test_never_negative_tensors_get_a_one_sided_grid(method):
    relu = np.maximum(UNIFORM, 0)
    c = CALIBRATORS[method]()
    c.observe(relu)
    scale, zero = c.grid()
    assert zero == -127 and scale == pytest.approx(c.amax() / 254)
    # the same data on a symmetric grid has twice the step, so about twice the rounding error
    sym = CALIBRATORS[method](asymmetric=False)
    sym.observe(relu)
    s_sym, z_sym = sym.grid()
    assert z_sym == 0 and s_sym == pytest.approx(sym.amax() / 127)

    def rms(s, z):
        q = np.clip(np.rint(relu / s) + z, -127, 127)
        return float(np.sqrt(np.mean(((q - z) * s - relu) ** 2)))
    assert rms(scale, zero) < 0.6 * rms(s_sym, z_sym)


def test_signed_tensors_stay_symmetric():
    c = CALIBRATORS["mse"]()
    c.observe(np.maximum(UNIFORM, 0))
    c.observe(np.array([-0.01], np.float32))      # one negative value anywhere makes the grid symmetric
    assert c.grid()[1] == 0


@pytest.mark.parametrize("method", sorted(CALIBRATORS))
def test_a_silu_output_gets_an_offset_grid_where_its_readers_take_zero_points(method):
    """x * sigmoid(x) reaches -0.28: with offset=True (the quantizer's choice for a float product its int8
    readers quantize) the 254 steps cover [-negmax, amax], the zero point the step at -negmax, and the
    rounding error falls against the symmetric grid; a tensor as negative as positive stays symmetric."""
    x = RNG.standard_normal(200_000).astype(np.float32) * 2
    silu = (x / (1 + np.exp(-x))).astype(np.float32)
    c = CALIBRATORS[method]()
    c.offset = True
    for part in np.array_split(silu, 4):
        c.observe(part)
    scale, zero = c.grid()
    neg = float(-silu.min())
    assert c.hist.negmax == neg and scale == pytest.approx((c.amax() + neg) / 254)
    assert (-127 - zero) * scale <= -neg < (-126 - zero) * scale      # the lowest step reaches -negmax
    sym = CALIBRATORS[method]()
    sym.observe(silu)
    s_sym, z_sym = sym.grid()
    assert z_sym == 0

    def rms(s, z):
        q = np.clip(np.round(silu / s) + z, -127, 127)
        return float(np.sqrt(np.mean(((q - z) * s - silu) ** 2)))
    # KL minimises a divergence, not the squared error, and clips the longer range harder
    assert rms(scale, zero) < (0.97 if method == "kl" else 0.8) * rms(s_sym, z_sym)
    both = CALIBRATORS[method]()
    both.offset = True
    both.observe(x)
    assert both.grid()[1] == 0
    # the negative extent merges as a maximum: shards give the whole's grid
    a, b = Histogram(), Histogram()
    a.observe(silu[:1000])
    b.observe(silu[1000:])
    a.merge(b)
    assert a.negmax == neg


def test_kl_ignores_the_zero_spike_of_a_relu():
    """Half of a ReLU's outputs are 0: the KL threshold must be the one of the positive part alone, not
    one pulled down by the spike in the first bin (before the fix: about a quarter of the range)."""
    x = RNG.standard_normal(200_000).astype(np.float32)
    relu, positive = CALIBRATORS["kl"](), CALIBRATORS["kl"]()
    relu.observe(np.maximum(x, 0))
    positive.observe(x[x > 0])          # the same non-zero values, without the zeros
    assert relu.amax() == pytest.approx(positive.amax(), rel=0.02)
    assert relu.amax() > 0.6 * float(x.max())


def test_histograms_of_any_split_merge_into_the_whole():
    """Power-of-two ranges: the histogram depends on the values only, not on their order or split."""
    data = np.concatenate([UNIFORM[:5000] * 0.01, HEAVY[:20000], UNIFORM[5000:9000] * 40]).astype(np.float32)
    whole = Histogram()
    whole.observe(data)
    for cuts in ([3, 7000, 24000], [12000], [1, 2, 3, 28000]):
        parts = np.split(data, cuts)
        merged = Histogram()
        for k, p in enumerate(parts[::-1] if len(cuts) % 2 else parts):
            h = Histogram()
            for piece in np.array_split(p, 3):      # each shard observed in several batches
                h.observe(piece)
            merged.merge(h)
        assert merged.edge == whole.edge and merged.absmax == whole.absmax
        assert np.array_equal(merged.counts, whole.counts)
    # and against numpy's own binning of the whole at the final range
    ref, _ = np.histogram(np.abs(data).astype(np.float64), bins=whole.bins, range=(0, whole.edge))
    assert np.array_equal(whole.counts, ref)


def test_histogram_of_zeros_then_values():
    h = Histogram()
    h.observe(np.zeros(10, np.float32))
    h.observe(np.array([0.3, -0.7], np.float32))
    assert h.edge == 1.0 and h.counts[0] == 10 and h.counts.sum() == 12 and h.negative


def test_kl_keeps_the_range_of_small_vectors():
    """Squeeze-excite vectors (hundreds of values a sample) are not a distribution with a tail to cut:
    KL keeps their whole range; the same values in arrays of 5000 get clipped as a distribution."""
    vectors = HEAVY[:15_000]
    assert amax("kl", vectors, chunks=30) == pytest.approx(float(np.abs(vectors).max()), rel=1e-6)
    assert amax("kl", vectors, chunks=3) < float(np.abs(vectors).max()) / 3
