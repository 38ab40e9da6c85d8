"""floor_masked_softmax: a softmax whose input adds a mask constant (-100, as Swin's shifted windows) is
followed by a ReLU6 clamp to [2^-60, FLT_MAX], so MNN's attn @ v reads no denormal probabilities (x86 cores
take a microcode assist for each; MNN's softmax writes one per masked entry); an unmasked softmax is left
as it is, and mnntool's planner still fuses Softmax -> floor -> MatMul into one FusedAttention step.
Meaning kept: against onnxruntime (cosine >= 0.9999, max error <= 1e-3 of the output's scale) in
mnntool's runtime and in MNN, the floored file within 1e-6 of the output's scale of the unfloored one in
MNN, and in int8 (the two runtimes agree at cosine >= 0.9999)."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from mnntool.format import reader  # noqa: E402
from mnntool.ir.graph import Graph, Node  # noqa: E402
from mnntool.passes.floor_masked_softmax import FLOOR, FloorMaskedSoftmaxPass  # noqa: E402
from tests.passes.both_runtimes import agreement_tests, files_fixture  # noqa: E402

SHAPE = (1, 3, 16, 16)
TINY = np.finfo(np.float32).tiny


class WindowAttention(nn.Module):
    """Patch embedding to 8x8 tokens, 4x4 windows (16 tokens, 2 heads of 8): a block with a shifted-window
    style mask (0 / -100 between the two halves of each window) and a block without one; pooled head."""
    def __init__(self, c=16, heads=2):
        super().__init__()
        self.c, self.heads = c, heads
        self.embed = nn.Conv2d(3, c, 2, 2)
        self.qkv1, self.qkv2 = nn.Linear(c, 3 * c), nn.Linear(c, 3 * c)
        self.proj1, self.proj2 = nn.Linear(c, c), nn.Linear(c, c)
        self.head = nn.Linear(c, 10)
        group = torch.arange(16) // 8
        mask = torch.where(group[:, None] == group[None, :], 0.0, -100.0)
        self.register_buffer("mask", mask.reshape(1, 1, 1, 16, 16).repeat(1, 4, 1, 1, 1))

    def attend(self, t, qkv, proj, mask):
        b, n, c = t.shape         # b = 4 windows
        q, k, v = qkv(t).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        a = (q * (c // self.heads) ** -0.5) @ k.transpose(-2, -1)
        if mask is not None:
            a = (a.reshape(1, b, self.heads, n, n) + mask).reshape(b, self.heads, n, n)
        return proj((a.softmax(-1) @ v).transpose(1, 2).reshape(b, n, c))

    def forward(self, x):
        f = self.embed(x)                                       # 1, c, 8, 8
        w = f.reshape(1, self.c, 2, 4, 2, 4).permute(0, 2, 4, 3, 5, 1).reshape(4, 16, self.c)
        w = w + self.attend(w, self.qkv1, self.proj1, self.mask)
        w = w + self.attend(w, self.qkv2, self.proj2, None)
        return self.head(w.mean((0, 1)).reshape(1, self.c))


files = files_fixture(WindowAttention, SHAPE, "floor_softmax")


def _floors(g):
    readers = g.consumers()
    out = []
    for sm in (n for n in g.nodes if n.op == "Softmax"):
        users = readers.get(sm.outputs[0], [])
        out.append(len(users) == 1 and users[0].op == "ReLU6" and users[0].param["minValue"] == FLOOR)
    return out


def test_only_the_masked_softmax_is_floored(files):
    g = reader.load(files[1])
    assert sorted(_floors(g)) == [False, True], [n.op for n in g.nodes]
    relu6 = next(n for n in g.nodes if n.op == "ReLU6")
    assert float(relu6.param["maxValue"]) == float(np.finfo(np.float32).max)


def _denormals_in_mnn(path):
    """(denormals among the Softmax outputs, denormals among the inputs of every op but the floor) in
    one MNN run, read through the session's per-op callbacks."""
    MNN = pytest.importorskip("MNN")
    it = MNN.Interpreter(str(path))
    s = it.createSession({"numThread": 1, "precision": "normal", "backend": "CPU"})
    inp = it.getSessionInput(s)
    x = np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32)
    inp.copyFrom(MNN.Tensor(list(SHAPE), MNN.Halide_Type_Float, x, MNN.Tensor_DimensionType_Caffe))
    counts = {"softmax_out": 0, "read": 0}

    def denormals(t):
        if t.getDataType() != MNN.Halide_Type_Float:
            return 0
        h = MNN.Tensor(t, MNN.Tensor_DimensionType_Caffe)
        t.copyToHostTensor(h)
        a = np.abs(np.asarray(h.getNumpyData(), np.float32))
        return int(((a > 0) & (a < TINY)).sum())

    def begin(tensors, info):
        if info.getType() != "ReLU6":
            counts["read"] += sum(denormals(t) for t in tensors)
        return True

    def end(tensors, info):
        if info.getType() == "Softmax":
            counts["softmax_out"] += sum(denormals(t) for t in tensors)
        return True
    it.runSessionWithCallBackInfo(s, begin, end)
    return counts


def test_no_denormal_reaches_the_matmul_in_mnn(files, tmp_path):
    from mnntool import api
    from mnntool.passes import OPTIMIZING
    src, fp32, _ = files
    bare = tmp_path / "bare.mnn"
    api.convert(src, bare, passes=[p for p in OPTIMIZING if p != "floor_masked_softmax"])
    before, after = _denormals_in_mnn(bare), _denormals_in_mnn(fp32)
    assert before["softmax_out"] > 100 and before["read"] >= before["softmax_out"], before   # MNN writes them
    assert after["softmax_out"] == before["softmax_out"] and after["read"] == 0, after
    from tests.conftest import mnn_run
    x = np.random.default_rng(2).standard_normal(SHAPE).astype(np.float32)
    a, b = mnn_run(bare, ["x"], ["y"], {"x": x})["y"], mnn_run(fp32, ["x"], ["y"], {"x": x})["y"]
    assert np.abs(a - b).max() <= 1e-6 * np.abs(a).max()


test_fp32_means_the_same_in_both_runtimes, test_int8_means_the_same_in_both_runtimes = agreement_tests(SHAPE)


def test_runtime_fuses_attention_through_the_floor(tmp_path):
    """q k^T + a constant -1e4/0 mask -> Softmax -> floor -> @ v: mnntool's planner still makes it one
    FusedAttention step (max error 1e-5 against onnxruntime); MNN runs the file's ops (same bounds)."""
    import onnx
    from onnx import TensorProto as TP
    from onnx import helper as h

    from mnntool import api
    from mnntool.runtime.session import Session
    from tests.conftest import mnn_run
    ort = pytest.importorskip("onnxruntime")
    shapes = {"q": (1, 2, 6, 8), "k": (1, 2, 6, 8), "v": (1, 2, 6, 4)}
    mask = np.where(np.tril(np.ones((6, 6))) > 0, 0.0, -1e4).astype(np.float32).reshape(1, 1, 6, 6)
    nodes = [h.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]), h.make_node("MatMul", ["q", "kt"], ["s"]),
             h.make_node("Add", ["s", "m"], ["sm"]), h.make_node("Softmax", ["sm"], ["p"], axis=-1),
             h.make_node("MatMul", ["p", "v"], ["y"])]
    graph = h.make_graph(nodes, "attn", [h.make_tensor_value_info(n, TP.FLOAT, list(v)) for n, v in shapes.items()],
                         [h.make_tensor_value_info("y", TP.FLOAT, None)],
                         [h.make_tensor("m", TP.FLOAT, list(mask.shape), mask.ravel().tolist())])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "a.onnx"))
    api.convert(tmp_path / "a.onnx", tmp_path / "a.mnn")
    g = api.load_graph(tmp_path / "a.mnn")
    assert [n.op for n in g.nodes].count("ReLU6") == 1
    rng = np.random.RandomState(0)
    feeds = {n: rng.randn(*v).astype(np.float32) for n, v in shapes.items()}
    ref = ort.InferenceSession(str(tmp_path / "a.onnx")).run(None, feeds)[0]
    s = Session(g)
    got = s.run(feeds)["y"]
    ops = [st.op for st in s.plan.steps]
    assert ops.count("FusedAttention") == 1 and "ReLU6" not in ops, ops
    np.testing.assert_allclose(got, ref, atol=1e-5)
    pytest.importorskip("MNN")
    np.testing.assert_allclose(mnn_run(tmp_path / "a.mnn", list(shapes), ["y"], feeds)["y"].reshape(ref.shape), ref,
                               atol=1e-5)


def _graph(mask_value, reader="MatMul"):
    g = Graph()
    g.inputs, g.outputs = ["x", "v"], ["y"]
    g.constants["m"] = np.array([[0.0, mask_value]], np.float32)
    g.info("m").shape, g.info("m").dtype = (1, 2), "float32"
    for t, shape in (("x", (3, 2)), ("a", (3, 2)), ("p", (3, 2)), ("v", (2, 4)), ("y", (3, 4))):
        g.info(t).shape, g.info(t).dtype = shape, "float32"
    g.nodes = [Node("BinaryOp", ["x", "m"], ["a"], "add", {"opType": "ADD"}),
               Node("Softmax", ["a"], ["p"], "softmax", {"axis": -1}),
               Node(reader, ["p", "v"], ["y"], "pv", {})]
    return g


def test_graph_forms():
    """A -10 mask, a -inf mask and probabilities read by something else than the matmul are left alone;
    a -1e4 mask is floored once (a second run adds nothing), the matmul reading the floor's output."""
    assert not FloorMaskedSoftmaxPass()(_graph(-10.0))
    assert not FloorMaskedSoftmaxPass()(_graph(-np.inf))
    assert not FloorMaskedSoftmaxPass()(_graph(-1e4, reader="BinaryOp"))
    g = _graph(-1e4)
    assert FloorMaskedSoftmaxPass()(g)
    assert not FloorMaskedSoftmaxPass()(g)
    assert [n.op for n in g.nodes] == ["BinaryOp", "Softmax", "ReLU6", "MatMul"]
    assert g.nodes[2].outputs == ["p"] == g.nodes[3].inputs[:1] and g.nodes[2].inputs == g.nodes[1].outputs
