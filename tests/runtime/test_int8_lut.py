"""int8_lut.lut_values (a float table looked up by byte in registers) against NumPy's indexing, and the int8
depthwise requantize pass that uses it (int8_conv.requantize_acc_planes) against requantize_acc_values'
scalar lookups, bit for bit (uint32 views: signed zeros, infinities, NaN payloads, subnormals kept)."""
from __future__ import annotations

import numpy as np
import pytest

from mnntool.runtime.kernels import sized
from mnntool.runtime.kernels.compile.jit import njit
from mnntool.runtime.kernels.micro import int8_conv
from mnntool.runtime.kernels.micro.int8_lut import lut_values, value_planes
from mnntool.runtime.kernels.micro.llvm_ir import host_has

pytestmark = pytest.mark.skipif(not host_has("avx512vbmi"), reason="needs AVX-512 VBMI")
f = np.float32


@njit(cache=True)
def _looked_up(x, planes):
    for i in range(0, x.shape[0], 64):
        lut_values(x, i, x.shape[0] - i, planes)


def _table(r, size):
    """Random values with the bit patterns a byte-wise copy could get wrong."""
    v = r.standard_normal(size).astype(f)
    odd = np.array([0x80000000, 0x7F800000, 0xFF800000, 0x7FC01234, 0x00000001, 0x807FFFFF, 0x3F800000],
                   np.uint32).view(f)
    v[:min(size, odd.size)] = odd[:size]
    return v


@pytest.mark.parametrize("size", [256, 200, 17, 1])
@pytest.mark.parametrize("n", [1, 15, 63, 64, 65, 130, 1001])
def test_lut_values_matches_indexing(size, n):
    """Every index 0..255 (past the table: its last value, mnn_math.lookup's clamp), whole and partial
    chunks of 64; the floats past n are left as they were."""
    r = np.random.default_rng(size * 1000 + n)
    values = _table(r, size)
    idx = r.integers(0, 256, n)
    idx[:min(n, 4)] = [0, 255, 127, 128][:min(n, 4)]         # both halves of the byte permutes, bit 7
    buf = np.concatenate([idx.astype(f), np.full(70, 7.5, f)])
    _looked_up(buf[:n], value_planes(values))
    want = values[np.minimum(idx, size - 1)]
    np.testing.assert_array_equal(buf[:n].view(np.uint32), want.view(np.uint32))
    assert (buf[n:] == f(7.5)).all()


def test_value_planes_rejects_sizes():
    with pytest.raises(ValueError):
        value_planes(np.zeros(257, f))
    with pytest.raises(ValueError):
        value_planes(np.zeros(0, f))


@pytest.mark.parametrize("bounds", [(-np.inf, np.inf), (3.0, 70.3), (140.0, 300.0), (-300.0, -140.2)])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("P", [301, 64, 49])
def test_requantize_acc_planes_matches_values(bounds, threads, P):
    """requantize_acc_planes == requantize_acc_values bit for bit on sums within 0.4 of an integer (as
    depthwise_int8's are), activation bounds inside, across and outside the byte's, rows of whole and
    partial chunks; and a table shorter than the byte range reads its last value past its end."""
    r = np.random.default_rng(P + threads + len(str(bounds)))
    C = 13
    s_in = f(0.037)
    k = r.integers(-4000, 4000, (C, P)).astype(np.float64)
    v = ((k + r.uniform(-0.39, 0.39, (C, P))) * float(s_in)).astype(f)
    scale = (r.random(C) * 0.05 + 0.001).astype(f)
    scale[0] = f(0.5)
    acc_bias = r.integers(-300, 300, C).astype(f)
    lo, hi = (np.clip(f(b), -int8_conv.FLT_MAX, int8_conv.FLT_MAX) for b in bounds)
    q_lo, q_hi = f(-128), f(127)
    ml, mh = int8_conv.merged_bounds(lo, hi, q_lo, q_hi)
    inv_in = f(1) / s_in
    for size in (256, 150):
        values = _table(r, size)
        want, got = np.full_like(v, np.nan), np.full_like(v, np.nan)
        sized(int8_conv.requantize_acc_values, v.size, threads)(v, inv_in, acc_bias, scale, ml, mh, q_lo, values,
                                                                 want)
        sized(int8_conv.requantize_acc_planes, v.size, threads)(v, inv_in, acc_bias, scale, ml, mh, q_lo,
                                                                 value_planes(values), got)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_without_vbmi_the_gathers_match(monkeypatch):
    """The IR for a host without VBMI (byte gathers), compiled here: the same floats."""
    from mnntool.runtime.kernels.micro import int8_lut
    monkeypatch.setattr(int8_lut, "HAS_VBMI", False)

    @njit(cache=False)
    def gathered(x, planes):
        for i in range(0, x.shape[0], 64):
            lut_values(x, i, x.shape[0] - i, planes)

    r = np.random.default_rng(5)
    values = _table(r, 200)
    idx = r.integers(0, 256, 201)
    buf = np.concatenate([idx.astype(f), np.full(30, 7.5, f)])
    gathered(buf[:201], value_planes(values))
    np.testing.assert_array_equal(buf[:201].view(np.uint32), values[np.minimum(idx, 199)].view(np.uint32))
    assert (buf[201:] == f(7.5)).all()
