"""activation_before_reshape: a transformer MLP's activation runs between its two 1x1 convolutions in
NC4HW4 with no Reshape or ConvertTensor between them, and a classifier's Flatten before its Linear layer
goes (the pooling's output feeds the convolution). Meaning kept in fp32 (against onnxruntime: cosine >=
0.9999, max error <= 1e-3 of the output's scale, in mnntool's runtime and in MNN) and in int8 (the two
runtimes agree at cosine >= 0.9999, MNN's int8 output >= 0.99 of fp32)."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from mnntool.ir.graph import Graph, Node  # noqa: E402
from mnntool.format import reader  # noqa: E402
from mnntool.passes.activation_before_reshape import ActivationBeforeReshapePass  # noqa: E402
from tests.passes.both_runtimes import agreement_tests, files_fixture  # noqa: E402

SHAPE = (1, 3, 32, 32)


class TinyViT(nn.Module):
    """Patch embedding, one pre-norm MLP block (GELU) and one with ReLU then Sigmoid (a chain of two
    activations), a pooled head through Flatten + Linear."""
    def __init__(self, c=24):
        super().__init__()
        self.embed = nn.Conv2d(3, c, 4, 4)
        self.n1, self.n2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.mlp1 = nn.Sequential(nn.Linear(c, 4 * c), nn.GELU(), nn.Linear(4 * c, c))
        self.mlp2 = nn.Sequential(nn.Linear(c, 2 * c), nn.ReLU(), nn.Sigmoid(), nn.Linear(2 * c, c))
        self.conv = nn.Conv2d(c, 16, 3, 1, 1)
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        t = self.embed(x)
        b, c, h, w = t.shape
        t = t.flatten(2).transpose(1, 2)
        t = t + self.mlp1(self.n1(t))
        t = t + self.mlp2(self.n2(t))
        f = torch.relu(self.conv(t.transpose(1, 2).reshape(b, c, h, w)))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(f, 1), 1))


files = files_fixture(TinyViT, SHAPE, "act_reshape")


def _writer(g, name):
    return next((n for n in g.nodes if name in n.outputs), None)


def test_mlp_runs_packed_between_its_convolutions(files):
    g = reader.load(files[1])
    convs = [n for n in g.nodes if n.op == "Convolution" and int(n.param["common"]["kernelX"]) == 1]
    assert len(convs) == 5, [n.op for n in g.nodes]      # two per MLP, the head
    # each MLP's second convolution reads its activations, which read the first convolution: no
    # Reshape or ConvertTensor in between
    for second in (convs[1], convs[3]):
        chain, t = [], second.inputs[0]
        while (w := _writer(g, t)).op != "Convolution":
            chain.append(w.op)
            t = w.inputs[0]
        assert chain and all(op in ("UnaryOp", "ReLU", "Sigmoid") for op in chain), chain
        assert g.info(second.inputs[0]).layout == "NC4HW4"
    assert [n.op for n in g.nodes].count("ConvertTensor") == 8, [n.op for n in g.nodes]
    # the head reads the global pooling directly (Flatten and the Reshape to N x C x 1 x 1 joined away)
    assert _writer(g, convs[4].inputs[0]).op == "Pooling"


test_fp32_means_the_same_in_both_runtimes, test_int8_means_the_same_in_both_runtimes = agreement_tests(SHAPE)


def _graph(nodes, shapes, outputs, consts=None):
    g = Graph()
    g.inputs, g.outputs = ["x"], outputs
    for name, value in (consts or {}).items():
        g.constants[name] = np.asarray(value)
        g.info(name).shape, g.info(name).dtype = tuple(np.shape(value)), str(np.asarray(value).dtype)
    for name, shape in shapes.items():
        g.info(name).shape, g.info(name).dtype = shape, "float32"
    g.nodes = nodes
    return g


def test_left_alone_where_it_saves_nothing_or_changes_meaning():
    """An activation after a Reshape of a graph input (no NC4HW4 writer), a Reshape read twice, and a
    Reshape of a Reshape whose shape has a 0 (copy the input's dim) stay as they are."""
    s = {"x": (1, 8, 2, 2), "r": (1, 32), "a": (1, 32)}
    g = _graph([Node("Reshape", ["x", "s"], ["r"], "r", {}), Node("ReLU", ["r"], ["a"], "a", {})], s, ["a"],
               {"s": np.array([1, 32], np.int32)})
    assert not ActivationBeforeReshapePass()(g)
    conv = Node("Convolution", ["x"], ["c"], "c", {})
    g = _graph([conv, Node("Reshape", ["c", "s"], ["r"], "r", {}), Node("ReLU", ["r"], ["a"], "a", {})],
               {**s, "c": (1, 8, 2, 2)}, ["a", "r"], {"s": np.array([1, 32], np.int32)})
    assert not ActivationBeforeReshapePass()(g)
    g = _graph([Node("Reshape", ["x", "s"], ["r"], "r", {}), Node("Reshape", ["r", "z"], ["q"], "q", {})],
               {**s, "q": (1, 8, 4)}, ["q"], {"s": np.array([1, 32], np.int32), "z": np.array([0, 8, 4], np.int32)})
    assert not ActivationBeforeReshapePass()(g)


def test_hoisted_activation_keeps_names_and_order():
    """conv -> Reshape -> ReLU -> Reshape back -> conv becomes conv -> ReLU -> conv; the graph output
    after it keeps its name."""
    s = {"x": (1, 8, 2, 2), "c": (4, 8, 1, 1), "r": (1, 4, 8), "a": (1, 4, 8), "b": (4, 8, 1, 1), "y": (4, 8, 1, 1)}
    nodes = [Node("Convolution", ["x"], ["c"], "c", {}), Node("Reshape", ["c", "s"], ["r"], "r", {}),
             Node("ReLU", ["r"], ["a"], "relu", {}), Node("Reshape", ["a", "t"], ["b"], "b", {}),
             Node("Convolution", ["b"], ["y"], "y", {})]
    g = _graph(nodes, s, ["y"], {"s": np.array([1, 4, 8], np.int32), "t": np.array([4, 8, 1, 1], np.int32)})
    assert ActivationBeforeReshapePass()(g)
    assert [n.op for n in g.nodes] == ["Convolution", "ReLU", "Convolution"]
    relu = g.nodes[1]
    assert relu.inputs == ["c"] and relu.name == "relu" and g.nodes[2].inputs == relu.outputs
