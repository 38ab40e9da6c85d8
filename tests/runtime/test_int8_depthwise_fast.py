"""The int8 depthwise convolution's sums over the real on-grid input (int8_conv.sums_exact, the 5x5 layers
that skip the pass casting their input to steps) give the same bytes as the steps path, bit for bit, and
both match the integer reference: acc = sum(k w) + B in int64, then MNN's float32 requantize step by step
(half away from zero). Kernel 3 and 5, stride 1 and 2, padding on every border, channel counts that are
not multiples of 16, zero points. Also: a fused table op with float output looked up in the requantize
loop = the lookup pass after it, and the requantize_acc kernels = requantize_rows' steps, bit for bit."""
import types

import numpy as np
import pytest

from mnntool.ir.graph import Node
from mnntool.format.idst import pack
from mnntool.runtime.kernels import sized
from mnntool.runtime.kernels.micro import int8_conv
from mnntool.runtime.kernels.micro.int8_gemm import byte_table
from mnntool.runtime.kernels.ops.conv import Int8Grids, convolution
from mnntool.runtime.kernels.micro.epilogue import grid_of
from mnntool.runtime.kernels.ops import int8_tables
from mnntool.runtime.kernels.ops.int8_tables import TABLE
from mnntool.runtime.kernels.ops.mnn_math import ON_GRID, table
from mnntool.runtime.settings import Settings

f = np.float32


def _layer(r, c, k, s, hw, z_in, zero_weights_above, relu6=True, table=None):
    """A ConvolutionDepthwise node with per-channel int8 weights, its input on its grid, and the grids."""
    h, w = hw
    p = k // 2
    oh, ow = ((n + 2 * p - k) // s + 1 for n in hw)
    q = r.integers(-127, 128, (c, k * k)).astype(np.int8)
    q[:, zero_weights_above:] //= 3         # sum |q| small enough for sums_exact, as trained layers' are
    q[:, 0] = 127                            # every channel reaches the int8 bound
    alpha = (r.random(c) * 0.02 + 0.001).astype(f)
    s_in, s_out = 0.0371, 0.0893
    lo, hi = -128, 127
    common = {"kernelX": k, "kernelY": k, "strideX": s, "strideY": s, "padX": p, "padY": p,
              "outputCount": c, "inputCount": c, "group": c, "relu": False, "relu6": relu6}
    qp = {"type": 1, "alpha": alpha, "buffer": pack(q, c, 8), "scaleIn": s_in, "scaleOut": s_out}
    sq = {"clampMin": lo, "clampMax": hi, "zeroPoint": z_in, "outputZeroPoint": 3}
    bias = (r.standard_normal(c) * 0.5).astype(f)
    node = Node("ConvolutionDepthwise", ["x"], ["y"], "dw",
                {"common": common, "quanParameter": qp, "symmetricQuan": sq, "bias": bias}, None, None)
    if table is not None:                   # a table op fused in, its output kept float (no grid)
        node.param[TABLE] = table
    grids = Int8Grids((s_in, lo - z_in, hi - z_in), (s_out, lo - 3, hi - 3), z_in, 3)
    steps = r.integers(lo - z_in, hi - z_in + 1, (1, c, h, w))
    x = (steps.astype(f) * f(s_in)).astype(f)                # on the input's grid: fl(k s)
    return node, q, alpha, bias, grids, x, (1, c, oh, ow)


def _reference(q, alpha, bias, grids, steps, k, s, out_shape, relu6=True):
    """MNN's int8 depthwise in integers, then its float32 requantize in its order (int8_conv.depthwise_int8)."""
    _, c, oh, ow = out_shape
    p = k // 2
    xp = np.pad(steps[0].astype(np.int64), ((0, 0), (p, p), (p, p)))
    acc = np.zeros((c, oh, ow), np.int64)
    wk = q.astype(np.int64).reshape(c, k, k)
    for i in range(k):
        for j in range(k):
            acc += wk[:, i, j, None, None] * xp[:, i:i + s * (oh - 1) + 1:s, j:j + s * (ow - 1) + 1:s]
    s_in, s_out, z = f(grids.input[0]), f(grids.output[0]), f(grids.zero_out)
    a = np.where(np.abs(alpha) < f(1e-6), f(1e-6), alpha).astype(f)
    scale = (a * (s_in / s_out)).astype(f)
    b = (np.trunc(bias / (s_in * a)) + np.trunc(z / scale)).astype(f)
    t = ((acc.astype(f) + b[:, None, None]).astype(f) * scale[:, None, None]).astype(f)
    lo, hi = (f(0 / s_out + z), f(f(6) / s_out + z)) if relu6 else (f(-np.inf), f(np.inf))   # ReLU6's bounds
    t = np.clip(t, lo, hi)
    r = np.trunc((t + np.copysign(f(0.5), t)).astype(f))
    r = np.clip(r, f(grids.output[1]) + z, f(grids.output[2]) + z)
    return ((r - z) * s_out).astype(f)[None]


def _run(node, x, grids, out_shape, threads):
    g_in = grid_of(*grids.input)
    ins = [types.SimpleNamespace(shape=x.shape, grid=g_in)]
    outs = [types.SimpleNamespace(shape=out_shape, grid=None)]
    kern = convolution(node, ins, outs, Settings.of(threads, ()))
    assert kern.fn.__module__ == int8_conv.__name__        # depthwise_int8's own step, table included
    y = np.full(out_shape, np.nan, f)
    kern.fn([x], [y])
    return y


@pytest.mark.parametrize("c,k,s,hw,z_in", [(21, 5, 1, (13, 11), 0), (37, 5, 2, (15, 12), 0), (19, 3, 1, (9, 20), -5),
                                           (50, 3, 2, (11, 11), 0), (17, 5, 2, (7, 7), 7), (33, 5, 1, (28, 28), 0)])
@pytest.mark.parametrize("threads", [1, 2])
def test_on_grid_sums_match_steps_path_and_integers(c, k, s, hw, z_in, threads, monkeypatch):
    r = np.random.default_rng(c * 7 + k + s)
    node, q, alpha, bias, grids, x, out_shape = _layer(r, c, k, s, hw, z_in, zero_weights_above=k)
    assert k * k <= int8_conv.EXACT_TAPS or int8_conv.sums_exact(q, grids.input)   # the new path is taken
    fast = _run(node, x, grids, out_shape, threads)
    monkeypatch.setattr(int8_conv, "sums_exact", lambda q, grid: False)
    monkeypatch.setattr(int8_conv, "EXACT_TAPS", 0)          # every layer through the steps pass
    slow = _run(node, x, grids, out_shape, threads)
    np.testing.assert_array_equal(fast, slow)
    steps = np.round(x / f(grids.input[0])).astype(np.int64)
    np.testing.assert_array_equal(fast, _reference(q, alpha, bias, grids, steps, k, s, out_shape))


def test_sums_exact_bound():
    """The bound: (K+3) 2^-24 k_max max_c sum|q| < 0.4. All-127 weights of 25 taps fail it (the worst case
    EXACT_TAPS guards), 3x3 ones pass, and a wider input grid (a zero point: steps to 218) counts."""
    full = np.full((4, 25), 127, np.int8)
    assert not int8_conv.sums_exact(full, (0.1, -127, 127))
    assert int8_conv.sums_exact(np.full((4, 9), 127, np.int8), (0.1, -128, 127))
    half = np.full((4, 25), 60, np.int8)                     # sum 1500: 28 * 127 * 1500 * 2^-24 = 0.318
    assert int8_conv.sums_exact(half, (0.1, -127, 127))
    assert not int8_conv.sums_exact(half, (0.1, -36, 218))   # 28 * 218 * 1500 * 2^-24 = 0.546


@pytest.mark.parametrize("c,k,s,hw", [(23, 3, 1, (10, 13)), (40, 5, 2, (12, 9)), (17, 3, 2, (9, 9))])
@pytest.mark.parametrize("threads", [1, 2])
def test_float_table_in_epilogue_matches_lookup_pass(c, k, s, hw, threads):
    """A table op (SiLU) whose output the file keeps float: looked up in the requantize loop
    (int8_conv.requantize_acc_values) = the requantize then mnn_math.lookup's pass, bit for bit, and
    = the table at the integer reference's bytes."""
    r = np.random.default_rng(c + k * 5 + s)
    node, q, alpha, bias, grids, x, out_shape = _layer(r, c, k, s, hw, 0, k, relu6=False, table="FusedSiLU")
    fused = _run(node, x, grids, out_shape, threads)
    passed = _run_unfused(node, x, grids, out_shape, threads)
    np.testing.assert_array_equal(fused, passed)
    steps = np.round(x / f(grids.input[0])).astype(np.int64)
    y = _reference(q, alpha, bias, grids, steps, k, s, out_shape, relu6=False)
    g_out = grid_of(*grids.output)
    values = table(ON_GRID["FusedSiLU"], g_out)
    idx = np.rint(y * g_out[0]).astype(np.int64) - int(g_out[2])
    np.testing.assert_array_equal(fused, values[idx])


def _run_unfused(node, x, grids, out_shape, threads):
    """The depthwise kernel writing the bytes' values, then the lookup pass (the path before the fusion)."""
    g_in, g_out = grid_of(*grids.input), grid_of(*grids.output)
    ins = [types.SimpleNamespace(shape=x.shape, grid=g_in)]
    outs = [types.SimpleNamespace(shape=out_shape, grid=None)]
    plain = Node(node.op, node.inputs, node.outputs, node.name,
                 {k: v for k, v in node.param.items() if k != TABLE}, None, None)
    kern = convolution(plain, ins, outs, Settings.of(threads, ()))
    fn = int8_tables.looked_up(kern.fn, table(ON_GRID["FusedSiLU"], g_out), g_out, out_shape, threads)
    y = np.full(out_shape, np.nan, f)
    fn([x], [y])
    return y


@pytest.mark.parametrize("bounds", [(-np.inf, np.inf), (3.0, np.inf), (3.0, 70.3), (-200.0, 500.0), (140.0, 300.0),
                                    (-300.0, -140.2), (-127.5, 126.5)])
@pytest.mark.parametrize("threads", [1, 2])
def test_requantize_acc_matches_requantize_rows(bounds, threads):
    """requantize_acc* (rint for the accumulator, one merged clamp) against requantize_rows* (MNN's steps),
    bit for bit (uint32 views: signed zeros too), on sums within 0.4 of an integer as depthwise_int8's
    are, with ties at the output rounding, and activation bounds inside, across and outside the byte's."""
    r = np.random.default_rng(len(str(bounds)) + threads)
    C, P = 13, 301
    s_in = f(0.037)
    k = r.integers(-4000, 4000, (C, P)).astype(np.float64)
    v = ((k + r.uniform(-0.39, 0.39, (C, P))) * float(s_in)).astype(f)
    v[:, :5] = (np.array([0, 1, -1, 2, -2]) * s_in).astype(f)
    scale = (r.random(C) * 0.05 + 0.001).astype(f)
    scale[0] = f(0.5)                                       # (acc + b) * 0.5: exact ties at the rounding
    acc_bias = r.integers(-300, 300, C).astype(f)
    lo, hi = (np.clip(f(b), -int8_conv.FLT_MAX, int8_conv.FLT_MAX) for b in bounds)
    q_lo, q_hi, z, s_out = f(-128), f(127), f(3), f(0.0893)
    inv_in = f(1) / s_in
    ml, mh = int8_conv.merged_bounds(lo, hi, q_lo, q_hi)
    ref, got = np.empty_like(v), np.empty_like(v)
    sized(int8_conv.requantize_rows, 1, threads)(v, inv_in, acc_bias, scale, lo, hi, q_lo, q_hi, z, s_out, ref)
    sized(int8_conv.requantize_acc, v.size, threads)(v, inv_in, acc_bias, scale, ml, mh, z, s_out, got)
    np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32))
    codes = r.integers(-128, 128, 256)
    tab = byte_table(codes)
    sized(int8_conv.requantize_rows, 1, threads)(v, inv_in, acc_bias, scale, lo, hi, q_lo, q_hi, f(0), f(1), ref)
    sized(int8_conv.requantize_acc_table, v.size, threads)(v, inv_in, acc_bias, scale, ml, mh, q_lo, tab,
                                                             f(7), f(0.5), got)
    want = ((codes[(ref - q_lo).astype(np.int64)].astype(f) - f(7)) * f(0.5)).astype(f)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    values = r.standard_normal(256).astype(f)
    sized(int8_conv.requantize_rows, 1, threads)(v, inv_in, acc_bias, scale, lo, hi, q_lo, q_hi, f(0), f(1), ref)
    sized(int8_conv.requantize_acc_values, v.size, threads)(v, inv_in, acc_bias, scale, ml, mh, q_lo, values, got)
    np.testing.assert_array_equal(got.view(np.uint32), values[(ref - q_lo).astype(np.int64)].view(np.uint32))
