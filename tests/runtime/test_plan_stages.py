"""The planner's stages (runtime/plan): each optional stage changes the plan of a model made to need
every one of them, and switched off on its own (Session(off=...), MNNTOOL_PLAN_OFF) leaves outputs equal
to onnxruntime's (abs and relative error 1e-4 over values up to ~5: the convolutions' sums differ in
order) and to the plan with every stage on (the same: another kernel may sum in another order). Also:
the plans of every input shape share the session's arena (runtime/plan/arenas.py)."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from mnntool import api
from mnntool.errors import MnnToolError
from mnntool.ir.graph import Node
from mnntool.runtime import plan as planning
from mnntool.runtime import session as session_mod
from mnntool.runtime.session import Session
from mnntool.runtime.settings import cores

ort = pytest.importorskip("onnxruntime")
OUTPUTS = ("y_cat", "y_tok", "y_emb", "y_vec", "y_bn", "y_lab", "y_pool", "y_tdw", "y_res", "y_head")


def _every_stage_model(path):
    rng = np.random.default_rng(0)

    def w(name, *shape, s=0.2):
        return nh.from_array((rng.standard_normal(shape) * s).astype(np.float32), name)
    ints = {"split5": [1, 2, 16, 16, 16], "merge4": [1, 32, 16, 16], "minus1": [-1], "zero1": [0], "one1": [1],
            "tok2": [6, 16], "tok4": [1, 16, 2, 3], "tok3": [1, 16, 6]}
    inits = [w("w1", 16, 8, 3, 3), w("wse", 16, 16, 1, 1), w("w2", 16, 16, 1, 1), w("w3", 16, 16, 1, 1),
             w("w4", 8, 32, 3, 3), w("w5", 8, 32, 1, 1), w("wq", 16, 16), w("wk", 16, 16), w("wv", 16, 16),
             w("table", 10, 8, s=1.0), w("c", 1, 64), nh.from_array(np.ones(16, np.float32), "gamma"),
             nh.from_array(np.zeros(16, np.float32), "beta"), w("wl", 16, 16), w("bn_mu", 16),
             nh.from_array(np.linspace(0.5, 2, 16, dtype=np.float32), "bn_var"), w("w6", 4, 8, 1, 1), w("wdw", 16, 1, 3, 3),
             nh.from_array(np.array([1.5], np.float32), "s6"), nh.from_array(np.array([0.25], np.float32), "b6"),
             w("w7", 8, 8, 3, 3), w("w8", 8, 8, 1, 1)] + \
        [nh.from_array(np.array(v, np.int64), k) for k, v in ints.items()]
    n = h.make_node
    nodes = [
        # convolutions: a SiLU (fuse_silu, fuse_activations), a squeeze-excite (fuse_channel_scale)
        n("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]), n("Sigmoid", ["c1"], ["s1"]), n("Mul", ["c1", "s1"], ["a1"]),
        n("GlobalAveragePool", ["a1"], ["gp"]), n("Conv", ["gp", "wse"], ["se"]), n("Sigmoid", ["se"], ["ss"]),
        n("Mul", ["a1", "ss"], ["xs"]), n("Conv", ["xs", "w2"], ["c2"]), n("Conv", ["a1", "w3"], ["c3"]),
        # a channel shuffle (fuse_channel_shuffle)
        n("Concat", ["c2", "c3"], ["cat"], axis=1), n("Reshape", ["cat", "split5"], ["r5"]),
        n("Transpose", ["r5"], ["t5"], perm=[0, 2, 1, 3, 4]), n("Reshape", ["t5", "merge4"], ["y_conv"]),
        # a Concat of two convolutions' outputs (place_concats)
        n("Conv", ["y_conv", "w4"], ["c4"], pads=[1, 1, 1, 1]), n("Conv", ["y_conv", "w5"], ["c5"]),
        n("Concat", ["c4", "c5"], ["y_cat"], axis=1),
        # attention (fuse_attention), a residual Add and LayerNorm (fuse_add_layer_norm), a SiLU on no
        # convolution (fuse_silu), a flatten of a fixed buffer (bind_views)
        n("MatMul", ["t", "wq"], ["q"]), n("MatMul", ["t", "wk"], ["k"]), n("MatMul", ["t", "wv"], ["v"]),
        n("Transpose", ["k"], ["kt"], perm=[0, 2, 1]), n("MatMul", ["q", "kt"], ["sc"]),
        n("Softmax", ["sc"], ["p"], axis=-1), n("MatMul", ["p", "v"], ["o"]), n("Add", ["o", "t"], ["res"]),
        n("LayerNormalization", ["res", "gamma", "beta"], ["ln"], axis=-1),
        n("Sigmoid", ["ln"], ["lsig"]), n("Mul", ["ln", "lsig"], ["lsilu"]), n("Flatten", ["lsilu"], ["y_tok"], axis=2),
        # an embedding on run-time indices (fuse_index_wrap), reshaped by its own shape (constants)
        n("Gather", ["table", "ids"], ["emb"], axis=0), n("Shape", ["emb"], ["esh"]),
        n("Slice", ["esh", "zero1", "one1"], ["lead"]), n("Concat", ["lead", "minus1"], ["newsh"], axis=0),
        n("Reshape", ["emb", "newsh"], ["y_emb"]),
        # a linear layer and a BatchNorm over its tokens (fuse_linear_scale)
        n("MatMul", ["t", "wl"], ["tl"]), n("Reshape", ["tl", "tok2"], ["tl2"]),
        n("BatchNormalization", ["tl2", "gamma", "beta", "bn_mu", "bn_var"], ["y_bn"]),
        # small ops in a row (programs)
        n("Add", ["vec", "c"], ["va"]), n("Mul", ["va", "va"], ["vb"]), n("Sigmoid", ["vb"], ["vs"]),
        n("Tanh", ["vs"], ["y_vec"]),
        # a scalar affine after a convolution and ReLU (fuse_scalar_affine)
        n("Conv", ["x", "w6"], ["c6"]), n("Relu", ["c6"], ["r6"]), n("Mul", ["r6", "s6"], ["m6"]),
        n("Add", ["m6", "b6"], ["y_lab"]),
        # a pooling token mixer, pool(x) - x (fuse_pool_mixer)
        n("AveragePool", ["x"], ["ap"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=0),
        n("Sub", ["ap", "x"], ["y_pool"]),
        # a depthwise convolution between token/plane transposes (fuse_token_depthwise)
        n("Transpose", ["t"], ["tt"], perm=[0, 2, 1]), n("Reshape", ["tt", "tok4"], ["tp"]),
        n("Conv", ["tp", "wdw"], ["tdw"], pads=[1, 1, 1, 1], group=16), n("Reshape", ["tdw", "tok3"], ["tf"]),
        n("Transpose", ["tf"], ["y_tdw"], perm=[0, 2, 1]),
        # a convolution and the residual Add after it (fuse_residual_add)
        n("Relu", ["x"], ["xr"]), n("Conv", ["xr", "w7"], ["c7"], pads=[1, 1, 1, 1]), n("Conv", ["x", "w8"], ["c8"]),
        n("Add", ["c7", "c8"], ["y_res"]),
    ]
    inputs = [h.make_tensor_value_info("x", TP.FLOAT, [1, 8, 16, 16]),
              h.make_tensor_value_info("t", TP.FLOAT, [1, 6, 16]),
              h.make_tensor_value_info("ids", TP.INT64, [1, "n"]),
              h.make_tensor_value_info("vec", TP.FLOAT, [1, 64])]
    outputs = [h.make_tensor_value_info(o, TP.FLOAT, None) for o in OUTPUTS[:-1]]   # y_head: added to the .mnn
    m = h.make_model(h.make_graph(nodes, "every_stage", inputs, outputs, inits), opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))


def _effects(s: Session) -> dict:
    """What each optional stage did to the plan of the model above."""
    plan = s.plan
    ops = [st.op for st in plan.steps]
    gather = next(st for st in plan.steps if st.op == "GatherV2")
    return {"threads": plan.settings.threads == 1,
            "fuse_attention": "FusedAttention" in ops,
            "fuse_index_wrap": plan.names[gather.ins[1]] == "ids",
            "fuse_channel_shuffle": "ChannelShuffle" in ops,
            "fuse_add_layer_norm": "AddLayerNorm" in ops,
            "fuse_silu": "FusedSiLU" in ops,
            "fuse_activations": any(st.op == "Convolution" and "(+" in st.name for st in plan.steps),
            "fuse_channel_scale": "ScaledPointwise" in ops,
            "fuse_residual_add": "ResidualConvolution" in ops,
            "fuse_linear_scale": "Scale" not in ops,
            "fuse_scalar_affine": any("(scaled by" in st.name for st in plan.steps),
            "fuse_pool_mixer": "PoolMixer" in ops,
            "fuse_token_depthwise": "TokenDepthwise" in ops,
            "fuse_transposed_weights": any(st.op == "MatMul" and plan.names[st.ins[1]] == "table" for st in plan.steps),
            "constants": "Shape" not in ops,
            "programs": "Program" in ops,
            "place_concats": any(st.elided for st in plan.steps),
            "bind_views": any(st.bound for st in plan.steps)}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("stages")
    _every_stage_model(d / "e.onnx")
    api.convert(d / "e.onnx", d / "e.mnn")
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal((1, 8, 16, 16)).astype(np.float32),
             "t": rng.standard_normal((1, 6, 16)).astype(np.float32),
             "ids": np.array([[0, 3, -1, 9, -10, 5]], np.int64), "vec": rng.standard_normal((1, 64)).astype(np.float32)}
    ref = dict(zip(OUTPUTS[:-1], ort.InferenceSession(str(d / "e.onnx")).run(None, feeds)))
    g = api.load_graph(d / "e.mnn")
    # a head tied to the embedding table, read through its transpose (fuse_transposed_weights): the
    # converter folds a transpose of a table this small into the weights, so it is added to the graph
    g.nodes += [Node("Permute", ["table"], ["table_t"], "head_t", {"dims": [1, 0]}),
                Node("MatMul", ["emb", "table_t"], ["y_head"], "head", {"transposeA": False, "transposeB": False})]
    g.outputs.append("y_head")
    # the SiLUs as Sigmoid and Mul (fuse_silu): files of other converters (and mnntool's before its
    # passes/fuse_silu) hold that form; mnntool's converter now writes one UnaryOp SILU
    for node in list(g.nodes):
        if node.op == "UnaryOp" and node.param.get("opType") == "SILU":
            x, y = node.inputs[0], node.outputs[0]
            at = g.nodes.index(node)
            g.nodes[at:at + 1] = [Node("Sigmoid", [x], [y + "_sig"], node.name + "_sig", {}),
                                  Node("BinaryOp", [x, y + "_sig"], [y], node.name, {"opType": "MUL", "T": "DT_FLOAT"})]
    ref["y_head"] = ref["y_emb"].reshape(1, -1, 8) @ g.constants["table"].T
    full = Session(g, threads=2, off=())
    return g, feeds, ref, full.run(feeds), _effects(full)


def test_the_stage_list():
    names = [planning.name_of(s) for s in planning.STAGES]
    assert len(set(names)) == len(names) and all(callable(s.run) for s in planning.STAGES)
    assert set(planning.OPTIONAL) < set(names) and {"shapes", "kernels", "memory", "bind"}.isdisjoint(planning.OPTIONAL)


def test_every_optional_stage_acts_on_the_model(model):
    _, _, _, _, effects = model
    wanted = set(planning.OPTIONAL) - ({"threads"} if cores() < 2 else set())
    assert set(effects) == set(planning.OPTIONAL)
    assert {k for k, v in effects.items() if v} >= wanted, "a stage the model was made for did nothing"


@pytest.mark.parametrize("stage", planning.OPTIONAL)
def test_each_stage_off_keeps_outputs(model, stage):
    g, feeds, ref, full, _ = model
    s = Session(g, threads=2, off=[stage])
    got = s.run(feeds)
    assert not _effects(s)[stage], f"{stage} was switched off but acted"
    for name in OUTPUTS:
        np.testing.assert_allclose(got[name], ref[name], rtol=1e-4, atol=1e-4, err_msg=f"{name} with {stage} off")
        np.testing.assert_allclose(got[name], full[name], rtol=1e-4, atol=1e-4, err_msg=f"{name} with {stage} off")
    # every tensor (verify's mode) too
    every = s.run(feeds, keep_all=True)
    for name in OUTPUTS:
        np.testing.assert_allclose(every[name], ref[name], rtol=1e-4, atol=1e-4)


def test_all_optional_stages_off_from_the_environment(model, monkeypatch):
    g, feeds, ref, _, _ = model
    monkeypatch.setenv("MNNTOOL_PLAN_OFF", ",".join(planning.OPTIONAL))
    s = Session(g, threads=2)
    got = s.run(feeds)
    assert not any(_effects(s).values())
    for name in OUTPUTS:
        np.testing.assert_allclose(got[name], ref[name], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("off", [["memory"], ["no_such_stage"]])
def test_required_or_unknown_stages_are_refused(model, off):
    with pytest.raises(MnnToolError, match="optional stages"):
        Session(model[0], off=off)


def test_plans_of_every_shape_share_one_arena(model, tmp_path):
    """The plans of different input shapes lay their buffers out in the session's one arena (warm memory:
    a new shape's first run takes no page faults for it), each plan still giving onnxruntime's outputs
    (tolerances above) after the other shapes' runs overwrote the arena; a second arena only for runs at
    the same time (two threads)."""
    import threading
    g, feeds, _, _, _ = model
    _every_stage_model(tmp_path / "e.onnx")     # the same model (seeded)
    ref = ort.InferenceSession(str(tmp_path / "e.onnx"))
    s = Session(g, threads=1)
    for n in list(range(1, session_mod.MAX_PLANS + 3)) + [3, 1]:
        ids = np.arange(n, dtype=np.int64).reshape(1, n) % 10
        got, want = s.run({**feeds, "ids": ids}), dict(zip(OUTPUTS[:-1], ref.run(list(OUTPUTS[:-1]), {**feeds, "ids": ids})))
        want["y_head"] = want["y_emb"].reshape(1, -1, 8) @ g.constants["table"].T
        for name in OUTPUTS:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4, err_msg=f"{name} at {n} ids")
    arenas = {id(p.arena) for p in s._plans.values()}
    assert len(arenas) == 1 and s._arenas.count == 1, "plans of different shapes in different arenas"
    # two runs at once (another shape each) hold two arenas; each answers as alone
    held = s._arenas.take(1)        # as a run in another thread holds the arena
    ids = np.arange(5, dtype=np.int64).reshape(1, 5) % 10
    got = s.run({**feeds, "ids": ids})
    assert s._arenas.count == 2
    s._arenas.release(held)
    errors = []

    def one(n):
        try:
            x = np.arange(n, dtype=np.int64).reshape(1, n) % 10
            for _ in range(5):
                out = s.run({**feeds, "ids": x})
                want = ref.run(["y_emb"], {**feeds, "ids": x})[0]
                np.testing.assert_allclose(out["y_emb"], want, rtol=1e-4, atol=1e-4)
        except Exception as e:      # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=one, args=(n,)) for n in (2, 4, 6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
