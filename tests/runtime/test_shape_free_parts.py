"""The kernel factories' shape-free parts (weight_cache.shape_free: a GEMM's padded bias and epilogue, a
depthwise layer's bias in lanes) are made once per layer while a session plans its input shapes (issue 46,
item 4: a new shape costs planning only). They must never be served for other weights, biases or
parameters, must not pile up over plans, and change no output bit: each shape's outputs equal a fresh
session's; onnxruntime's within rtol 1e-4 + atol 1e-4 (summation order)."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto as TP
from onnx import helper as h

from mnntool import api
from mnntool.runtime.kernels import weight_cache
from mnntool.runtime.kernels.micro import few_pixel_gemm, float_gemm
from mnntool.runtime.kernels.micro.epilogue import NO_GRID, NO_POST, grid_of
from mnntool.runtime.session import Session


FILE_WEIGHT = np.random.default_rng(0).standard_normal((24, 40)).astype(np.float32)


def _kept_weight(parts):
    """Weights as a convolution's node part holds them (kept across plans: the same object each plan)."""
    return weight_cache.node_part("test_weight", (FILE_WEIGHT,), lambda: FILE_WEIGHT.copy())


def test_outside_planning_every_call_makes_its_own():
    made = []
    w = np.ones((4, 4), np.float32)
    for _ in range(3):
        weight_cache.shape_free("t", w, (), (0,), lambda: made.append(1) or len(made))
    assert len(made) == 3


def test_packed_gemm_parts_kept_and_shape_parts_recomputed():
    """Within a session's planning the padded bias, epilogue and packed weights are the first plan's objects at
    every pixel count, while the tiles, k blocks and walk follow the pixel count; the values equal those made
    outside planning (a fresh session's)."""
    parts = weight_cache.Parts()
    bias = np.arange(24, dtype=np.float32)
    got = []
    for pixels in (49 * 3, 200, 4096, 97):
        with weight_cache.parts_of(parts):
            w = _kept_weight(parts)
            got.append(float_gemm.PackedGemm(w, bias, 1, NO_GRID, pixels, 1))
    fresh = float_gemm.PackedGemm(w.copy(), bias.copy(), 1, NO_GRID, 97, 1)
    for pg in got[1:]:
        assert pg.bias is got[0].bias and pg.wp is got[0].wp and pg.epf is got[0].epf
    for pg, pixels in zip(got, (49 * 3, 200, 4096, 97)):
        assert pg.pixels == pixels and pg.tiles == float_gemm.tile_count(pixels)
        assert pg.kc == float_gemm.k_block(40, pg.rows(), pg.tiles)
        assert pg.by_block == float_gemm.walk_by_block(40, pixels, 24)
    assert np.array_equal(got[-1].bias, fresh.bias) and np.array_equal(got[-1].wp, fresh.wp)
    assert got[-1].epf == fresh.epf and got[-1].grid == fresh.grid and got[-1].bias.flags.writeable


def test_other_bias_activation_grid_or_post_made_anew():
    """Any other bias object (even with the same numbers), activation, grid or fused post gets its own parts:
    nothing made for one layer's parameters is served for another's."""
    parts = weight_cache.Parts()
    with weight_cache.parts_of(parts):
        w = _kept_weight(parts)
        b1 = np.zeros(24, np.float32)
        b2 = np.ones(24, np.float32)
        base = float_gemm.PackedGemm(w, b1, 0, NO_GRID, 64, 1)
        other_bias = float_gemm.PackedGemm(w, b2, 0, NO_GRID, 64, 1)
        same_numbers = float_gemm.PackedGemm(w, b1.copy(), 0, NO_GRID, 64, 1)
        relu6 = float_gemm.PackedGemm(w, b1, 2, NO_GRID, 64, 1)
        grid = float_gemm.PackedGemm(w, b1, 0, grid_of(0.05, -128, 127), 64, 1)
        leaky = float_gemm.PackedGemm(w, b1, 0, NO_GRID, 64, 1, (4, 0.1, 0.0))
        oc = few_pixel_gemm.OcGemm(w, b2, 0, NO_GRID, 49, 1)
    assert np.array_equal(other_bias.bias[:24], b2) and np.array_equal(base.bias[:24], b1)
    assert same_numbers.bias is not base.bias
    assert relu6.epf == float_gemm.epilogue(2, NO_GRID) and base.epf == float_gemm.epilogue(0, NO_GRID)
    assert grid.grid == 1 and grid.epf == float_gemm.epilogue(0, grid_of(0.05, -128, 127))
    assert leaky.epf == float_gemm.epilogue(0, NO_GRID, (4, 0.1, 0.0))
    assert oc.bias.size == oc.wp.size // 40 and np.array_equal(oc.bias[:24], b2) and oc.wp is not base.wp


def test_weights_of_a_plans_own_made_every_time_and_not_held():
    """Weights that own their data and no node part holds (a layer trimmed for its shape) get parts of their
    own at every call, and no entry holds them."""
    parts = weight_cache.Parts()
    made = []
    with weight_cache.parts_of(parts):
        for k in range(3):
            w = np.full((8, 8), k, np.float32)
            got = weight_cache.shape_free("t", w, (), (0,), lambda: made.append(1) or w.sum())
            assert got == 64 * k
    assert len(made) == 3 and not parts.entries


def test_parts_of_new_objects_each_plan_stay_bounded():
    """An int8 layer's grid is a new tuple at each plan: its parts are made at each plan and go after
    Parts.KEEP_PLANS plans unused; a layer's parts every plan uses are made once."""
    parts = weight_cache.Parts()
    made = {"grid": 0, "same": 0}
    bias = np.zeros(24, np.float32)
    for k in range(4 * weight_cache.Parts.KEEP_PLANS):
        with weight_cache.parts_of(parts):
            w = _kept_weight(parts)
            g = grid_of(0.05, -128, 127)
            weight_cache.shape_free("grid", w, (bias, g), (0,), lambda: made.__setitem__("grid", made["grid"] + 1))
            weight_cache.shape_free("same", w, (bias, NO_GRID, NO_POST), (0,),
                                    lambda: made.__setitem__("same", made["same"] + 1))
    assert made["same"] == 1 and made["grid"] == 4 * weight_cache.Parts.KEEP_PLANS
    assert sum(1 for key in parts.entries if key[0] == "grid") <= 2 * weight_cache.Parts.KEEP_PLANS


def _mixed(path):
    """Pointwise layers (PackedGemm at wide maps, OcGemm at 7x7), a depthwise 3x3 (channels in the lanes on
    small maps), a grouped 3x3 (GroupedTapsInPlace), a squeeze-excite scale (ScaledPointwise) and a 3x3/2 on
    implicit im2col, ReLU6 and LeakyReLU epilogues."""
    rng = np.random.RandomState(7)

    def w(name, *shape, s=0.2):
        return onnx.numpy_helper.from_array((rng.randn(*shape) * s).astype(np.float32), name)
    inits = [w("w1", 32, 3, 3, 3), w("b1", 32), w("wd", 32, 1, 3, 3), w("bd", 32), w("wg", 32, 8, 3, 3),
             w("ws1", 8, 32, 1, 1), w("bs1", 8), w("ws2", 32, 8, 1, 1), w("bs2", 32), w("wp", 48, 32, 1, 1),
             w("bp", 48), w("w3", 40, 48, 3, 3, s=0.05), w("b3", 40)]
    nodes = [h.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
             h.make_node("Clip", ["c1", "lo", "hi"], ["r1"]),
             h.make_node("Conv", ["r1", "wd", "bd"], ["d"], pads=[1, 1, 1, 1], group=32),
             h.make_node("Relu", ["d"], ["rd"]),
             h.make_node("Conv", ["rd", "wg"], ["gc"], pads=[1, 1, 1, 1], group=4),
             h.make_node("GlobalAveragePool", ["gc"], ["g"]),
             h.make_node("Conv", ["g", "ws1", "bs1"], ["s1"]), h.make_node("Relu", ["s1"], ["rs1"]),
             h.make_node("Conv", ["rs1", "ws2", "bs2"], ["s2"]), h.make_node("Sigmoid", ["s2"], ["gate"]),
             h.make_node("Mul", ["gc", "gate"], ["m"]),
             h.make_node("Conv", ["m", "wp", "bp"], ["p"]), h.make_node("LeakyRelu", ["p"], ["lp"], alpha=0.1),
             h.make_node("Conv", ["lp", "w3", "b3"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2])]
    lo = onnx.numpy_helper.from_array(np.array(0, np.float32), "lo")
    hi = onnx.numpy_helper.from_array(np.array(6, np.float32), "hi")
    g = h.make_graph(nodes, "mixed", [h.make_tensor_value_info("x", TP.FLOAT, [1, 3, "H", "W"])],
                     [h.make_tensor_value_info("y", TP.FLOAT, None)], inits + [lo, hi])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))


# 7x7 maps after the stem (OcGemm), wide ones (PackedGemm), revisits after more than MAX_PLANS others
MIXED_SHAPES = [(14, 14), (40, 56), (13, 14), (64, 30), (14, 14), (28, 28), (96, 20), (22, 26), (40, 56), (16, 18),
                (50, 50), (14, 13), (30, 44), (14, 14), (40, 56)]


def test_layers_parts_made_once_and_outputs_those_of_a_fresh_session(tmp_path, monkeypatch):
    """One session over MIXED_SHAPES: each layer's shape-free parts are made once (PackedGemm's, OcGemm's, the
    grouped layer's: counted by their makers; at most one a layer and kind), and every output equals that of a
    session that never saw another shape, bit for bit."""
    from mnntool.runtime.kernels.ops.conv_strategies import dense
    _mixed(tmp_path / "m.onnx")
    api.convert(tmp_path / "m.onnx", tmp_path / "m.mnn")
    ref = ort.InferenceSession(str(tmp_path / "m.onnx"))
    rng = np.random.default_rng(2)
    xs = {hw: rng.standard_normal((1, 3) + hw).astype(np.float32) for hw in MIXED_SHAPES}
    fresh = {hw: Session(api.load_graph(tmp_path / "m.mnn"), threads=1).run({"x": x})["y"] for hw, x in xs.items()}
    made = {}

    def counting(module, name):
        real = getattr(module, name)

        def wrapped(*a):
            made[module.__name__] = made.get(module.__name__, 0) + 1
            return real(*a)
        monkeypatch.setattr(module, name, wrapped)
    counting(float_gemm, "_shape_free_parts")
    counting(few_pixel_gemm, "_shape_free_parts")
    counting(dense, "_grouped_parts")
    s = Session(api.load_graph(tmp_path / "m.mnn"), threads=1)
    for hw in MIXED_SHAPES:
        got = s.run({"x": xs[hw]})["y"]
        assert np.array_equal(got, fresh[hw]), hw
        np.testing.assert_allclose(got, ref.run(None, {"x": xs[hw]})[0], rtol=1e-4, atol=1e-4, err_msg=str(hw))
    tags = {}
    for key in s._parts.entries:
        if key[0] in ("PackedGemm", "OcGemm", "grouped"):
            tags[key[0]] = tags.get(key[0], 0) + 1
    # PackedGemm: the scaled pointwise layer; OcGemm: 3x3 layers on 7x7 maps (im2col-oc); grouped: the grouped
    # layer and the 3x3/2 layers on WideTapsInPlace (GroupedTapsInPlace at one group)
    assert tags.get("PackedGemm", 0) >= 1 and tags.get("OcGemm", 0) >= 1 and tags.get("grouped", 0) >= 2, tags
    # made once a layer and kind over 15 plans (7 convolutions in the model)
    assert made[float_gemm.__name__] == tags["PackedGemm"] <= 7, (made, tags)
    assert made[few_pixel_gemm.__name__] == tags["OcGemm"] <= 7, (made, tags)
    assert made[dense.__name__] == tags["grouped"] <= 7, (made, tags)


def test_geometry_made_without_init_equals_the_dataclass():
    """Geometry.made (no frozen-dataclass __init__) gives the object the constructor gives: equal, same hash,
    still frozen, `replace` works on it."""
    import dataclasses

    import pytest

    from mnntool.runtime.kernels.ops.conv_strategies.base import Geometry
    values = (1, 8, 10, 12, 16, 5, 6, 3, 3, 2, 2, 1, 1, 1, 1, 0, 1, 2)
    g = Geometry.made(values)
    assert g == Geometry(*values) and hash(g) == hash(Geometry(*values)) and dataclasses.astuple(g) == values
    assert dataclasses.replace(g, kh=1) == Geometry(*values[:7], 1, *values[8:])
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.h = 3


def test_bound_kernels_of_new_plans_bind_to_the_code_found_before():
    """Bound.bind keeps what it found per (kernel, type key, library): a new plan's Bound binds to the same code
    for the same types; a bound kernel still refuses other types."""
    import pytest

    from mnntool.runtime.kernels.compile import aot, jit
    from mnntool.runtime.kernels.ops.conv import scale_packed
    base, s = np.ones((1, 2, 8), np.float32), np.ones(2, np.float32)
    a, b = jit.Bound(scale_packed), jit.Bound(scale_packed)
    a(base, s, np.empty_like(base))
    b(base, s, np.empty_like(base))
    assert a.fn is b.fn and a.key == b.key
    assert (scale_packed, a.key, False, aot.library()) in jit._BOUND
    with pytest.raises(TypeError):      # (checked before any lookup: nothing compiles for it)
        a.bind((base.astype(np.float64), s, np.empty((1, 2, 8), np.float64)))


def test_geometry_check_passes_exactly_the_geometries_mnn_accepts():
    """Geometry.check's one-expression pass (the usual case) lets through exactly what its per-condition checks
    accept: 3,000 random small geometries, valid and not, against the conditions written out here."""
    import random

    import pytest

    from mnntool.errors import InvalidModel
    from mnntool.runtime.kernels.ops.conv_strategies.base import Geometry
    rng = random.Random(0)
    passed = 0

    def pick(good, bad):        # a bad value one time in twenty
        return rng.choice(bad) if rng.random() < 0.05 else rng.choice(good)
    for _ in range(3000):
        kh, kw, sh, sw, dh, dw = (pick([1, 2, 3], [0, -1]) for _ in range(6))
        group = pick([1, 1, 2, 4], [0, 3])
        cin, cout = pick([4, 8, 16], [0, 6]), pick([4, 8, 16], [0, 6])
        t, l, b, r = (pick([0, 0, 1, 2], [-1]) for _ in range(4))
        n, h, w = pick([1, 2], [0]), pick([3, 5, 8, 11], [0]), pick([3, 5, 8, 11], [0])
        oh = max(0, (h + t + b - dh * (kh - 1) - 1) // max(sh, 1) + 1) + pick([0], [1])
        ow = max(0, (w + l + r - dw * (kw - 1) - 1) // max(sw, 1) + 1) + pick([0], [1])
        g = Geometry(n, cin, h, w, cout, oh, ow, kh, kw, sh, sw, dh, dw, t, l, b, r, group)
        weights = pick([cout * (cin // group if group else 0) * kh * kw], [7])
        ok = (min(kh, kw, sh, sw, dh, dw, group) >= 1 and min(t, l, b, r) >= 0 and cin % group == 0 and
              cout % group == 0 and weights == cout * (cin // group) * kh * kw and min(n, cin, h, w, cout, oh, ow) >= 1
              and (oh - 1) * sh + (kh - 1) * dh + 1 <= h + t + b and (ow - 1) * sw + (kw - 1) * dw + 1 <= w + l + r)
        if ok:
            g.check(weights, "layer")
            passed += 1
        else:
            with pytest.raises(InvalidModel, match="layer: "):
                g.check(weights, "layer")
    assert 300 <= passed <= 2700


def test_type_key_inline_tokens_are_the_tokens():
    """aot.type_key's inline arrays and ints give the key the per-argument tokens give, edge cases included
    (ints past 64 bits, bools, strided, transposed, read-only and unaligned arrays, scalars, tuples)."""
    from mnntool.runtime.kernels.compile import aot
    x = np.zeros(64, np.float32)
    unaligned = np.frombuffer(b"\0" * 33, np.uint8)[1:].view(np.float32)
    args = (x, x[::2], x.reshape(8, 8).T, x.reshape(8, 8)[:, :3], np.frombuffer(b"\0" * 16, np.float32), unaligned,
            1, 1 << 63, -(1 << 63), -(1 << 63) - 1, True, 1.5, np.float32(2), np.int64(3), None, (1, 2.0, np.float32(1)),
            float_gemm.IDENTITY, "s", np.zeros(3, np.int64))
    assert aot.type_key(args) == ",".join(aot._token(a) for a in args)
    assert aot.type_key(args[6:10]) == "i,?,i,?"
