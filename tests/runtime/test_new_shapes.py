"""A new input shape costs planning only (issue 46, item 4): no kernel is compiled for a shape. A shape
may pick a kernel not used before (a strategy or a serial twin chosen by size), compiled once for the
process; but no kernel already compiled gets another signature, and no signature holds a value (a
literal: code specialised on a number). Outputs are onnxruntime's (rtol 1e-4 + atol 1e-4: 3x3
convolutions summed in another order). The model: two 3x3 convolutions with open H/W (the issue's),
the second strided in a variant."""
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h

from mnntool import api
from mnntool.runtime.kernels.compile.jit import JitFunction
from mnntool.runtime.session import Session

ort = pytest.importorskip("onnxruntime")


def _open_model(path, stride: int):
    rng = np.random.RandomState(0)
    inits = [onnx.numpy_helper.from_array((rng.randn(16, 3, 3, 3) * 0.3).astype(np.float32), "w1"),
             onnx.numpy_helper.from_array((rng.randn(16, 16, 3, 3) * 0.1).astype(np.float32), "w2")]
    nodes = [h.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["c1"], ["r1"]),
             h.make_node("Conv", ["r1", "w2"], ["y"], pads=[1, 1, 1, 1], strides=[stride, stride])]
    g = h.make_graph(nodes, "open", [h.make_tensor_value_info("x", TP.FLOAT, [1, 3, "H", "W"])],
                     [h.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))


def _compiled() -> set:
    """(kernel, signature) of every Numba kernel compiled in this process."""
    out = set()
    for name, mod in list(sys.modules.items()):
        if not name.startswith("mnntool.runtime.kernels"):
            continue
        for v in list(vars(mod).values()):
            for fn in (v, getattr(v, "_serial", None)) if isinstance(v, JitFunction) else ():
                if fn is not None and fn._dispatcher is not None:
                    out |= {(fn.name, str(sig)) for sig in fn._dispatcher.signatures}
    return out


@pytest.mark.parametrize("stride", [1, 2])
def test_new_shapes_compile_nothing(tmp_path, stride):
    _open_model(tmp_path / "o.onnx", stride)
    api.convert(tmp_path / "o.onnx", tmp_path / "o.mnn")
    s = Session(api.load_graph(tmp_path / "o.mnn"), threads=1)
    ref = ort.InferenceSession(str(tmp_path / "o.onnx"))
    rng = np.random.default_rng(0)
    shapes = [(40, 56), (57, 33), (96, 71), (23, 130), (64, 64), (81, 45), (33, 97), (120, 30), (9, 200)]
    for k, hw in enumerate(shapes):
        if k == 2:
            before = _compiled()
        x = rng.standard_normal((1, 3) + hw).astype(np.float32)
        np.testing.assert_allclose(s.run({"x": x})["y"], ref.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)
    after = _compiled()
    seen = {name for name, _ in before}
    again = sorted(pair for pair in after - before if pair[0] in seen)
    assert not again, f"a new input shape compiled another signature of a kernel: {again}"
    assert not [pair for pair in after if "Literal" in str(pair[1])], "a kernel specialised on a value"


def test_packed_weights_shared_across_shapes(tmp_path):
    """Planning a new shape reuses the packed weights of the file's convolutions (weight_cache): the
    second plan packs nothing it packed before, its output is still onnxruntime's (tolerances above),
    and closing the session frees them. The 1x1 layer of 64 -> 64 channels at >= 48 pixels goes to
    float_gemm's PackedGemm."""
    import gc

    from mnntool.runtime.kernels import weight_cache
    from mnntool.runtime.kernels.micro import float_gemm
    rng = np.random.RandomState(1)
    inits = [onnx.numpy_helper.from_array((rng.randn(64, 3, 3, 3) * 0.3).astype(np.float32), "w1"),
             onnx.numpy_helper.from_array((rng.randn(64, 64, 1, 1) * 0.1).astype(np.float32), "w2")]
    nodes = [h.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["c1"], ["r1"]),
             h.make_node("Conv", ["r1", "w2"], ["y"])]
    g = h.make_graph(nodes, "open", [h.make_tensor_value_info("x", TP.FLOAT, [1, 3, "H", "W"])],
                     [h.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "p.onnx"))
    api.convert(tmp_path / "p.onnx", tmp_path / "p.mnn")
    gc.collect()
    before = weight_cache.cached_count()
    packs = []
    real = float_gemm.pack_weights

    def counting(w, *a):
        packs.append(w.shape)
        return real(w, *a)

    float_gemm.pack_weights = counting
    try:
        s = Session(api.load_graph(tmp_path / "p.mnn"), threads=1)
        ref = ort.InferenceSession(str(tmp_path / "p.onnx"))
        for k, hw in enumerate([(40, 56), (57, 33), (96, 71)]):
            x = np.random.default_rng(k).standard_normal((1, 3) + hw).astype(np.float32)
            np.testing.assert_allclose(s.run({"x": x})["y"], ref.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)
            if k == 0:
                first = len(packs)
        assert first >= 1 and len(packs) == first, (first, packs)
        assert weight_cache.cached_count() > before
    finally:
        float_gemm.pack_weights = real
    del s
    gc.collect()
    assert weight_cache.cached_count() == before


def _detector_like(path):
    """A stride-2 3x3 convolution (phase planes shared per geometry: SharedZeros), a 3x3 16 -> 16 one
    (Winograd where the host has AVX-512), a 1x1 (channels-in-lanes at few pixels), a stride-2
    transposed convolution (its work buffers): what a text detector runs at every new image size."""
    rng = np.random.RandomState(2)

    def w(name, *shape, s=0.3):
        return onnx.numpy_helper.from_array((rng.randn(*shape) * s).astype(np.float32), name)
    inits = [w("w1", 16, 3, 3, 3), w("w2", 16, 16, 3, 3, s=0.1), w("w3", 24, 16, 1, 1, s=0.2),
             w("wt", 24, 4, 2, 2, s=0.2), w("bt", 4)]
    nodes = [h.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
             h.make_node("Relu", ["c1"], ["r1"]),
             h.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["c2"], ["r2"]),
             h.make_node("Conv", ["r2", "w3"], ["c3"]),
             h.make_node("ConvTranspose", ["c3", "wt", "bt"], ["y"], strides=[2, 2])]
    g = h.make_graph(nodes, "det", [h.make_tensor_value_info("x", TP.FLOAT, [1, 3, "H", "W"])],
                     [h.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))


def test_many_shapes_share_memory_and_packed_weights(tmp_path):
    """More distinct shapes than a session keeps plans for (runtime/plan/arenas.py, SharedZeros' spare
    buffers, the transposed convolution's thread buffers, packed weights of every strategy kept across
    plans): every output is onnxruntime's (rtol 1e-4 + atol 1e-4: summation order), shapes seen before
    give the same numbers again, the plans share one arena, no weights are packed twice, and the
    thread's spare zero buffers stay bounded."""
    from mnntool.runtime import kernels
    from mnntool.runtime import session as session_mod
    from mnntool.runtime.kernels.micro import float_gemm, winograd
    _detector_like(tmp_path / "d.onnx")
    api.convert(tmp_path / "d.onnx", tmp_path / "d.mnn")
    packs = []
    real_pack, real_wino = float_gemm.pack_weights, winograd.transform_packed

    def counting(real):
        def pack(w, *a):
            packs.append((real.__name__, w.shape, a))
            return real(w, *a)
        return pack
    float_gemm.pack_weights, winograd.transform_packed = counting(real_pack), counting(real_wino)
    try:
        s = Session(api.load_graph(tmp_path / "d.mnn"), threads=1)
        ref = ort.InferenceSession(str(tmp_path / "d.onnx"))
        rng = np.random.default_rng(0)
        # the first: padded planes past 1 MB (mapped, kernels.MAPPED_FROM), and an arena the others fit
        shapes = [(400, 360), (34, 50), (8, 10), (60, 22), (14, 14), (46, 38), (10, 30), (52, 52), (20, 44),
                  (30, 16), (64, 40), (12, 12), (26, 58)]
        assert len(shapes) > session_mod.MAX_PLANS
        first = {}
        for hw in shapes + shapes[:3]:
            x = first.setdefault(hw, rng.standard_normal((1, 3) + hw).astype(np.float32))
            got = s.run({"x": x})["y"]
            np.testing.assert_allclose(got, ref.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4, err_msg=str(hw))
        assert len({id(p.arena) for p in s._plans.values()}) == 1 and s._arenas.count == 1
        assert len(packs) == len(set(packs)), f"weights packed again for a new shape: {packs}"
        assert len(kernels._SCRATCH.__dict__.get("spare", [])) <= kernels.SPARE_ZEROS
    finally:
        float_gemm.pack_weights, winograd.transform_packed = real_pack, real_wino


def _squeeze_excite(path):
    """A stem, a depthwise 3x3, a squeeze-excite branch (global pool, 1x1 convolutions on a 1x1 map: the
    same operands at every input shape), the channel scale, a 1x1 projection and a residual add."""
    rng = np.random.RandomState(3)

    def w(name, *shape, s=0.3):
        return onnx.numpy_helper.from_array((rng.randn(*shape) * s).astype(np.float32), name)
    inits = [w("w1", 16, 3, 3, 3), w("wd", 16, 1, 3, 3), w("ws1", 4, 16, 1, 1), w("bs1", 4),
             w("ws2", 16, 4, 1, 1), w("bs2", 16), w("wp", 16, 16, 1, 1, s=0.2)]
    nodes = [h.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
             h.make_node("Relu", ["c1"], ["r1"]),
             h.make_node("Conv", ["r1", "wd"], ["d"], pads=[1, 1, 1, 1], group=16),
             h.make_node("Relu", ["d"], ["rd"]),
             h.make_node("GlobalAveragePool", ["rd"], ["g"]),
             h.make_node("Conv", ["g", "ws1", "bs1"], ["s1"]), h.make_node("Relu", ["s1"], ["rs1"]),
             h.make_node("Conv", ["rs1", "ws2", "bs2"], ["s2"]), h.make_node("Sigmoid", ["s2"], ["gate"]),
             h.make_node("Mul", ["rd", "gate"], ["m"]),
             h.make_node("Conv", ["m", "wp"], ["p"]), h.make_node("Add", ["p", "r1"], ["y"])]
    g = h.make_graph(nodes, "se", [h.make_tensor_value_info("x", TP.FLOAT, [1, 3, "H", "W"])],
                     [h.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))


SE_SHAPES = [(40, 56), (57, 33), (96, 71), (40, 56), (23, 130), (64, 64), (81, 45), (57, 33), (33, 97), (120, 30),
             (9, 200), (64, 66), (40, 56)]


def test_new_shapes_equal_a_fresh_session_bit_for_bit(tmp_path):
    """What a session keeps across input shapes (kernels shared by the plans of its arena where an op's
    operands are the same: plan/reuse.py; the kernels' shape-free parts: weight_cache.node_part; shape
    inference's memo: plan/shapes.py) changes no output bit: at each shape, in an order that revisits
    shapes after more than MAX_PLANS others, the outputs equal those of a session that never saw another
    shape; onnxruntime's within rtol 1e-4 + atol 1e-4 (summation order). The squeeze-excite convolutions'
    kernels are shared by the plans (the same kernel object in two plans of different shapes)."""
    _squeeze_excite(tmp_path / "se.onnx")
    api.convert(tmp_path / "se.onnx", tmp_path / "se.mnn")
    g = api.load_graph(tmp_path / "se.mnn")
    s = Session(g, threads=1)
    ref = ort.InferenceSession(str(tmp_path / "se.onnx"))
    rng = np.random.default_rng(5)
    xs = {hw: rng.standard_normal((1, 3) + hw).astype(np.float32) for hw in SE_SHAPES}
    kernels_of = []
    for hw in SE_SHAPES:
        got = s.run({"x": xs[hw]})["y"]
        kernels_of.append({st.name: st.kernel for st in s.plan.steps if st.kernel is not None})
        fresh = Session(api.load_graph(tmp_path / "se.mnn"), threads=1).run({"x": xs[hw]})["y"]
        assert np.array_equal(got, fresh), hw
        np.testing.assert_allclose(got, ref.run(None, {"x": xs[hw]})[0], rtol=1e-4, atol=1e-4, err_msg=str(hw))
    shared = [name for name, k in kernels_of[-1].items() if any(k is ks.get(name) for ks in kernels_of[1:-1])]
    assert shared, "no kernel shared across the plans of different shapes"


def test_plans_sharing_kernels_run_at_once_in_threads(tmp_path):
    """Three threads, each at its own shapes, on one session: plans of one arena share kernels, plans that
    run at once are in different arenas (plan/arenas.py), so every output equals a one-thread session's."""
    import threading
    _squeeze_excite(tmp_path / "se.onnx")
    api.convert(tmp_path / "se.onnx", tmp_path / "se.mnn")
    s = Session(api.load_graph(tmp_path / "se.mnn"), threads=1)
    rng = np.random.default_rng(6)
    xs = {hw: rng.standard_normal((1, 3) + hw).astype(np.float32) for hw in SE_SHAPES}
    want = {hw: Session(api.load_graph(tmp_path / "se.mnn"), threads=1).run({"x": xs[hw]})["y"] for hw in xs}
    bad = []

    def work(k):
        for r in range(4):
            for hw in SE_SHAPES[k::3]:
                if not np.array_equal(s.run({"x": xs[hw]})["y"], want[hw]):
                    bad.append((k, r, hw))
    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad, bad


def test_shared_kernel_rebuilt_where_argument_types_differ():
    """A plan that takes over a shared kernel keeps it only where its step's arguments have the types the
    kernel was bound to (plan/reuse.check): a strided input (another argument type) gets a kernel of its own."""
    from mnntool.runtime.plan import reuse
    from mnntool.runtime.plan.state import Step
    x, y = np.zeros((4, 8), np.float32), np.zeros((4, 8), np.float32)
    kernel, own = object(), object()
    entry = reuse.Entry(kernel, [])
    builder = Step("a", "Op", kernel, [0], [1], shared=entry, source=(None, [], [], True))
    reuse.check(builder, [x], [y], lambda: own)
    assert builder.kernel is kernel and entry.sig is not None
    same = Step("a", "Op", kernel, [0], [1], shared=entry, source=(None, [], [], False))
    reuse.check(same, [x.copy()], [y.copy()], lambda: own)
    assert same.kernel is kernel
    strided = Step("a", "Op", kernel, [0], [1], shared=entry, source=(None, [], [], False))
    reuse.check(strided, [np.zeros((4, 16), np.float32)[:, ::2]], [y], lambda: own)
    assert strided.kernel is own and strided.shared is None
    unfixed = Step("a", "Op", kernel, [0], [1], shared=entry, source=(None, [], [], False))
    reuse.check(unfixed, None, [y], lambda: own)
    assert unfixed.kernel is own


def test_padded_planes_taken_over_past_the_budget(tmp_path, monkeypatch):
    """With SharedZeros' budget at nothing, every new geometry takes over the zero buffer of a key the run
    does not use (kernels.ZEROS_BUDGET): shapes taken in turns, each run re-zeroes what it took, and every
    output equals a fresh session's, bit for bit."""
    from mnntool.runtime import kernels
    monkeypatch.setattr(kernels, "ZEROS_BUDGET", 0)
    _detector_like(tmp_path / "d.onnx")
    api.convert(tmp_path / "d.onnx", tmp_path / "d.mnn")
    s = Session(api.load_graph(tmp_path / "d.mnn"), threads=1)
    rng = np.random.default_rng(7)
    shapes = [(34, 50), (60, 22), (46, 38), (52, 52)]
    xs = {hw: rng.standard_normal((1, 3) + hw).astype(np.float32) for hw in shapes}
    want = {hw: Session(api.load_graph(tmp_path / "d.mnn"), threads=1).run({"x": xs[hw]})["y"] for hw in shapes}
    for _ in range(3):
        for hw in shapes:
            assert np.array_equal(s.run({"x": xs[hw]})["y"], want[hw]), hw


def test_session_parts_of_plan_own_objects_do_not_pile_up():
    """weight_cache.Parts keeps a part while some recent plan uses it: parts of objects a plan made for itself
    (weights a fusion computes at every plan) go after Parts.KEEP_PLANS plans, with the arrays kept for
    packing; a part every plan uses stays, made once."""
    from mnntool.runtime.kernels import weight_cache
    parts, made = weight_cache.Parts(), []
    shared = np.ones(8, np.float32)
    for k in range(5 * weight_cache.Parts.KEEP_PLANS):
        with weight_cache.parts_of(parts):
            own = np.full(8, k, np.float32)         # this plan's own weights
            got = weight_cache.node_part("w", (own,), lambda: own * 2)
            assert got[0] == 2 * k
            weight_cache.node_part("s", (shared,), lambda: made.append(1) or shared + 1)
    assert len(made) == 1
    assert len(parts.entries) <= 2 * weight_cache.Parts.KEEP_PLANS + 1 and len(parts.kept) <= len(parts.entries)


def test_fusion_stages_read_the_readers_of_their_own_node_list(tmp_path, monkeypatch):
    """plan/match.users_of keeps the readers of a node list for the stages after it that get the same list
    (rewritten hands the list on where a stage fused nothing): each stage's answer must be
    ir.graph.consumers_of of the list it is given, at every shape; a stale one (the last stage's list or
    the last plan's) would fuse the wrong nodes. The outputs stay a fresh session's, bit for bit."""
    import importlib

    from mnntool.ir.graph import consumers_of
    from mnntool.runtime import plan as P
    from mnntool.runtime.plan import match
    asked = []

    def checked(p):
        got = match.users_of(p)
        want = consumers_of(p.nodes)
        assert got == want and all(a == b for a, b in zip(got.values(), want.values()))
        asked.append(id(p.nodes))
        return got
    for name in P.NAMES:
        mod = importlib.import_module(f"mnntool.runtime.plan.{name}")
        if hasattr(mod, "users_of"):
            monkeypatch.setattr(mod, "users_of", checked)
    _squeeze_excite(tmp_path / "se.onnx")
    api.convert(tmp_path / "se.onnx", tmp_path / "se.mnn")
    s = Session(api.load_graph(tmp_path / "se.mnn"), threads=1)
    rng = np.random.default_rng(8)
    for hw in SE_SHAPES[:6]:
        x = rng.standard_normal((1, 3) + hw).astype(np.float32)
        fresh = Session(api.load_graph(tmp_path / "se.mnn"), threads=1).run({"x": x})["y"]
        assert np.array_equal(s.run({"x": x})["y"], fresh), hw
    assert len(asked) > len(set(asked)), "no stage was handed the list of the stage before it"


def test_collector_spaced_while_planning_and_as_it_was_after(tmp_path, monkeypatch):
    """Session._build spaces Python's cycle collector's young passes (BUILD_GEN0 allocations apart) while it
    plans (a plan's thousands of new, living containers are what those passes would scan for nothing) and
    puts its thresholds back after, also when planning fails; thresholds a caller set as far apart (or the
    collector off, threshold 0) are left alone. Cyclic garbage made while planning (a compile's) is still
    collected while planning."""
    import gc
    import weakref

    from mnntool.errors import MnnToolError
    from mnntool.runtime import session as session_module
    from mnntool.runtime.plan import shapes
    _squeeze_excite(tmp_path / "se.onnx")
    api.convert(tmp_path / "se.onnx", tmp_path / "se.mnn")
    s = Session(api.load_graph(tmp_path / "se.mnn"), threads=1)
    seen, cycles = [], []
    real = shapes.run

    class Cycle:
        pass

    def spy(p):
        seen.append(gc.get_threshold()[0])
        c = Cycle()
        c.me = c
        first = weakref.ref(c)
        del c
        for _ in range(3 * session_module.BUILD_GEN0):     # cyclic garbage, as a compile makes
            c = Cycle()
            c.me = c
        cycles.append(first() is None or seen[-1] == 0)     # collected while planning (unless the caller's is off)
        if p.graph.tensors["x"].shape[2] == 13:
            raise MnnToolError("planning failed on purpose")
        real(p)
    monkeypatch.setattr(shapes, "run", spy)
    before = gc.get_threshold()
    assert before[0] < session_module.BUILD_GEN0
    s.prepare({"x": (1, 3, 20, 24)})
    assert seen == [session_module.BUILD_GEN0] and gc.get_threshold() == before
    with pytest.raises(MnnToolError):
        s.prepare({"x": (1, 3, 13, 24)})
    assert seen[-1] == session_module.BUILD_GEN0 and gc.get_threshold() == before
    gc.set_threshold(0)
    try:
        s.prepare({"x": (1, 3, 28, 24)})
        assert seen[-1] == 0 and gc.get_threshold()[0] == 0
    finally:
        gc.set_threshold(*before)
    assert all(cycles)
    x = np.random.default_rng(9).standard_normal((1, 3, 28, 24)).astype(np.float32)
    ref = ort.InferenceSession(str(tmp_path / "se.onnx"))
    np.testing.assert_allclose(s.run({"x": x})["y"], ref.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)


def _zero_bytes(kernels) -> tuple[int, int]:
    """(bytes of this thread's SharedZeros buffers and spares, bytes of those the last run used)."""
    d = kernels._SCRATCH.__dict__
    flat, used, run = d.get("zeros_flat", {}), d.get("zeros_used", {}), d.get("run", 0)
    total = sum(b.nbytes for b in flat.values()) + sum(b.nbytes for b in d.get("spare", []))
    return total, sum(b.nbytes for k, b in flat.items() if used.get(k) == run)


def test_zero_planes_stay_within_their_budget_over_many_shapes(tmp_path, monkeypatch):
    """SharedZeros' buffers stay within kernels.ZEROS_BUDGET over many distinct shapes, each larger than
    the last (so no idle buffer is ever large enough to take over: the case that held ~120 MB of planes
    against a 64 MB budget on a text detector): idle buffers and spares are dropped instead. A run needing
    more than the budget keeps what it uses. Every output equals a fresh session's, bit for bit, also at
    shapes revisited after their buffers went."""
    from mnntool.runtime import kernels
    _detector_like(tmp_path / "d.onnx")
    api.convert(tmp_path / "d.onnx", tmp_path / "d.mnn")
    s = Session(api.load_graph(tmp_path / "d.mnn"), threads=1)
    rng = np.random.default_rng(11)
    shapes = [(40 + 4 * k, 40 + 6 * k) for k in range(24)]
    xs = {hw: rng.standard_normal((1, 3) + hw).astype(np.float32) for hw in shapes}
    s.run({"x": xs[shapes[-1]]})
    _, largest_run = _zero_bytes(kernels)
    budget = 3 * largest_run // 2       # past it after a handful of the shapes below
    monkeypatch.setattr(kernels, "ZEROS_BUDGET", budget)
    got = {}
    for hw in shapes + shapes[:4]:
        got[hw] = s.run({"x": xs[hw]})["y"]
        total, this_run = _zero_bytes(kernels)
        assert 0 < this_run <= largest_run and total <= budget, (hw, total, budget)
    for hw in shapes[:4] + shapes[-3:]:
        want = Session(api.load_graph(tmp_path / "d.mnn"), threads=1).run({"x": xs[hw]})["y"]
        assert np.array_equal(got[hw], want), hw
    monkeypatch.setattr(kernels, "ZEROS_BUDGET", 0)     # less than one run needs: that run's buffers only
    s.run({"x": xs[shapes[5]]})
    total, this_run = _zero_bytes(kernels)
    assert total == this_run > 0


def test_array_type_tokens_kept_by_flags_are_those_from_the_array():
    """aot._token keeps an array's token by (dtype, ndim, flags bits): a kept token must be the one the
    array's own flags give (aot._array_token), for arrays alike but for one thing - layout, a read-only
    flag, the byte order, an unaligned buffer, a datetime unit - asked in both orders (a stale token would
    bind a kernel's compiled code to other argument types)."""
    from mnntool.runtime.kernels.compile import aot
    a = np.zeros((3, 4, 5), np.float32)
    ro = a.copy()
    ro.flags.writeable = False
    cases = [a, a[:, ::2], a.T, np.asfortranarray(a), ro, np.zeros((3, 4, 5), ">f4"), np.zeros((3, 4, 5), np.float64),
             np.ndarray((3,), np.float32, buffer=bytearray(13), offset=1), np.zeros(3, np.float32),
             np.zeros((2, 2), "M8[ns]"), np.zeros((2, 2), "M8[s]"), np.zeros((1, 1), np.float32),
             np.zeros((3, 4, 5), np.float32)[::-1]]
    for order in (cases, cases[::-1], cases):
        assert [aot._token(c) for c in order] == [aot._array_token(c) for c in order]
    assert len({aot._token(c) for c in cases}) == 10
    assert aot.type_key((a, 3, 1.5, ro)) == "f4:3C,i,d,f4:3Cr"


def test_layout_tags_planned_as_other_names_of_their_input(tmp_path, monkeypatch):
    """A ConvertTensor (MNN's layout tag: the same array here) gets no step: its output is another name of its
    input's slot (plan/kernels.aliased), except where it writes a graph output (the model's last, 'y'). The
    outputs equal those of plans that keep the tags as view steps, bit for bit, at each new shape."""
    from mnntool.runtime.plan import kernels
    _squeeze_excite(tmp_path / "se.onnx")
    api.convert(tmp_path / "se.onnx", tmp_path / "se.mnn")
    g = api.load_graph(tmp_path / "se.mnn")
    assert sum(n.op == "ConvertTensor" for n in g.nodes) == 5
    s = Session(g, threads=1)
    rng = np.random.default_rng(7)
    for hw in SE_SHAPES[:4]:
        x = rng.standard_normal((1, 3) + hw).astype(np.float32)
        got = s.run({"x": x})["y"]
        assert [(st.op, st.name) for st in s.plan.steps if st.op == "ConvertTensor"] == [("ConvertTensor", "y")]
        with monkeypatch.context() as m:
            m.setattr(kernels, "ALIAS_PASSTHROUGH", False)
            tagged = Session(api.load_graph(tmp_path / "se.mnn"), threads=1)
            want = tagged.run({"x": x})["y"]
            assert sum(st.op == "ConvertTensor" for st in tagged.plan.steps) > 1
        assert np.array_equal(got, want), hw


def test_fused_nodes_made_once_across_shapes(tmp_path, monkeypatch):
    """The nodes fusion stages make (match.made_node) are the last plan's objects at a new shape, where made of
    the same nodes; the session keeps at most two plans' worth of them, however many shapes come; under
    keep_all (nothing fused) none are kept."""
    from mnntool.runtime import plan as planning
    from mnntool.runtime.plan import kernels
    _squeeze_excite(tmp_path / "se.onnx")
    api.convert(tmp_path / "se.onnx", tmp_path / "se.mnn")
    s = Session(api.load_graph(tmp_path / "se.mnn"), threads=1)
    seen = []
    run = kernels.run

    def recording(p):
        seen.append({n.name: n for n in p.nodes if "(+" in n.name})
        run(p)
    monkeypatch.setattr(planning.STAGES[planning.NAMES.index("kernels")], "run", recording)
    rng = np.random.default_rng(8)
    for hw in SE_SHAPES:
        s.run({"x": rng.standard_normal((1, 3) + hw).astype(np.float32)})
    fused = set(seen[0])
    assert {"Conv_7 (+Sigmoid_8)", "Conv_10 (+Mul_9)"} <= fused
    for before, after in zip(seen, seen[1:]):
        assert set(after) == fused and all(after[k] is before[k] for k in fused)
    memo = s._parts.memos["fused nodes"]
    assert len(memo["now"]) == len(fused) and len(memo["last"]) <= len(fused)
    s.run({"x": np.ones((1, 3, 31, 29), np.float32)}, keep_all=True)
    assert seen[-1] == {} and len(memo["now"]) == len(fused)


def test_shape_inference_at_new_shapes_is_the_definitions(tmp_path):
    """plan/shapes.infer (the session's memo, ops that infer `same` answered without infer_node's generic tests)
    gives every tensor the facts ir.ops.evaluate.infer_values gives it, at each shape of a sequence."""
    from mnntool.ir.ops.evaluate import infer_values
    from mnntool.runtime.plan.shapes import infer
    _squeeze_excite(tmp_path / "se.onnx")
    api.convert(tmp_path / "se.onnx", tmp_path / "se.mnn")
    s = Session(api.load_graph(tmp_path / "se.mnn"), threads=1)
    memo: dict = {}
    for hw in SE_SHAPES[:5] + [(1, 1)]:
        g = s._shaped({"x": (1, 3) + hw})
        got, want = infer(g, memo), infer_values(g)
        assert got.keys() == want.keys()
        for name, v in want.items():
            u = got[name]
            assert (u.shape, u.dtype, u.grid, u.zero) == (v.shape, v.dtype, v.grid, v.zero), (hw, name)
            assert (u.value is None) == (v.value is None) and (v.value is None or np.array_equal(u.value, v.value))


def test_new_plan_moved_to_the_oldest_generation(tmp_path, monkeypatch):
    """A plan's objects live as long as the plan and go by reference counting: after a build they are in the
    collector's oldest generation (session._promote), not walked by the young and middle passes; a build that
    fails moves nothing; with PROMOTE_PLANS off they stay young. Evicted plans leave no cyclic garbage (what
    promotion would keep until a full pass): gc.collect() finds none after MAX_PLANS + 4 new shapes."""
    import gc

    from mnntool.errors import MnnToolError
    from mnntool.runtime import session as session_module
    from mnntool.runtime.plan import shapes
    _squeeze_excite(tmp_path / "se.onnx")
    api.convert(tmp_path / "se.onnx", tmp_path / "se.mnn")
    s = Session(api.load_graph(tmp_path / "se.mnn"), threads=1)

    def oldest(obj) -> bool:
        return any(o is obj for o in gc.get_objects(generation=2))
    rng = np.random.default_rng(10)
    for k in range(session_module.MAX_PLANS + 4):
        s.run({"x": rng.standard_normal((1, 3, 20 + k, 24)).astype(np.float32)})
    gc.collect()
    plan = s.prepare({"x": (1, 3, 41, 23)})
    assert oldest(plan) and oldest(plan.steps) and gc.get_count()[0] < 100
    for k in range(session_module.MAX_PLANS + 4):
        s.run({"x": rng.standard_normal((1, 3, 50 + k, 24)).astype(np.float32)})
    assert gc.collect() == 0
    real = shapes.run
    made = []

    def failing(p):
        made.append(object.__new__(type("Marker", (), {})))
        raise MnnToolError("planning failed on purpose")
    monkeypatch.setattr(shapes, "run", failing)
    with pytest.raises(MnnToolError):
        s.prepare({"x": (1, 3, 13, 24)})
    assert not oldest(made[0])
    monkeypatch.setattr(shapes, "run", real)
    monkeypatch.setattr(session_module, "PROMOTE_PLANS", False)
    plan = s.prepare({"x": (1, 3, 43, 23)})
    assert not oldest(plan)


def test_fusions_found_by_nodes_decided_by_each_shapes_vals(tmp_path):
    """What fuse_silu, fuse_activations, fuse_channel_scale and fuse_residual_add find by the nodes alone is kept
    across shapes (match.by_nodes), what depends on the Vals is decided at each shape: the channel scale goes into
    the 1x1 convolution only where the map has at least its 16 output channels' worth of pixels (3 x 5 -> 2 x 3
    after the strided stem: not), in a session alternating small and large shapes; each output equals a fresh
    session's, bit for bit."""
    _squeeze_excite(tmp_path / "se.onnx")
    api.convert(tmp_path / "se.onnx", tmp_path / "se.mnn")
    s = Session(api.load_graph(tmp_path / "se.mnn"), threads=1)
    rng = np.random.default_rng(11)
    for hw in [(40, 56), (3, 5), (57, 33), (4, 4), (3, 5), (64, 64)]:
        x = rng.standard_normal((1, 3) + hw).astype(np.float32)
        got = s.run({"x": x})["y"]
        ops = [st.op for st in s.plan.steps]
        assert ("ScaledPointwise" in ops) == (hw[0] > 8), (hw, ops)
        assert any("(+Sigmoid_8)" in st.name for st in s.plan.steps)
        fresh = Session(api.load_graph(tmp_path / "se.mnn"), threads=1).run({"x": x})["y"]
        assert np.array_equal(got, fresh), hw
    assert s._parts.memos["by nodes"].keys() == {"fuse_silu", "fuse_activations", "fuse_channel_scale",
                                                 "fuse_residual_add"}


def test_objects_the_process_froze_stay_frozen():
    """The plans' promotion (session._promote: freeze then unfreeze) is skipped where the process froze objects
    of its own (gc.freeze before a fork): unfreeze would hand them back to the collector."""
    import gc
    from mnntool.runtime import session
    mine = [[i] for i in range(100)]
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        assert frozen > 0
        session._promote()
        # still frozen (unfreeze would leave 0; a few frozen temporaries may die meanwhile)
        assert gc.get_freeze_count() > frozen // 2
    finally:
        gc.unfreeze()
    session._promote()
    assert gc.get_freeze_count() == 0 and mine


def test_dense_pick_skips_only_depthwise_strategies():
    """conv_strategies.pick starts a dense layer's search past depthwise.py's strategies (each suits depthwise
    layers only): the strategy it picks is the first of the whole list that suits, for dense, grouped and depthwise
    layers of 1x1-7x7 windows, strides 1 and 2, maps 1x1 to 112x112, with and without AVX-512 and a fused post."""
    import itertools

    from mnntool.runtime.kernels.ops import conv_strategies as cs

    def first(g, avx512, post):
        return next((s for s in cs.STRATEGIES if (avx512 or not s.avx512) and not (post and s.no_post)
                     and not (s.post_only and not post) and s.suits(g)), None)
    checked = 0
    for cin, cout, group in [(16, 16, 16), (672, 672, 672), (16, 32, 1), (3, 16, 1), (64, 64, 4), (96, 24, 1)]:
        for k, s, (h, w) in itertools.product((1, 3, 5, 7), (1, 2), [(1, 1), (7, 7), (14, 14), (56, 56), (112, 112),
                                                                     (13, 200)]):
            p = k // 2
            oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
            if oh < 1 or ow < 1:
                continue
            g = cs.Geometry(1, cin, h, w, cout, oh, ow, k, k, s, s, 1, 1, p, p, p, p, group)
            for avx512, post in itertools.product((True, False), (True, False)):
                want = first(g, avx512, post)
                try:
                    got = cs.pick(g, avx512, post)
                except StopIteration:
                    got = None
                assert got is want, (g, avx512, post)
                checked += 1
    assert checked > 500
