"""MNN's Unpack (Pack's inverse, TF's Unstack), which MNN's converter writes into files it makes (a grouped
convolution's pieces, FastViT's attention split): the runtime's results against torch.unbind (exact: values
only move), for every axis, negative ones too; a count of outputs that does not match the axis is one clear
error naming the op."""
import numpy as np
import pytest

from mnntool.errors import MnnToolError
from mnntool.ir.graph import Graph, Node, TensorInfo
from mnntool.runtime.session import Session

torch = pytest.importorskip("torch")


def _unpack(shape, axis, outputs):
    names = [f"y{k}" for k in range(outputs)]
    g = Graph(nodes=[Node("Unpack", ["x"], names, "unpack", {"axis": axis}, "Axis")], inputs=["x"], outputs=names)
    g.tensors["x"] = TensorInfo("x", "float32", shape)
    return g, names


@pytest.mark.parametrize("shape, axis", [((3, 4, 5), 0), ((3, 4, 5), 1), ((3, 4, 5), 2), ((2, 3, 4, 5), -1),
                                         ((2, 3, 4, 5), -3), ((1, 6), 0)])
def test_matches_torch_unbind(shape, axis):
    x = np.random.default_rng(len(shape) + axis).standard_normal(shape).astype(np.float32)
    n = shape[axis]
    g, names = _unpack(shape, axis, n)
    out = Session(g).run({"x": x})
    want = torch.unbind(torch.from_numpy(x), dim=axis)
    assert len(out) == n
    for name, w in zip(names, want):
        np.testing.assert_array_equal(out[name], w.numpy())


def test_outputs_not_matching_the_axis_is_one_error():
    g, _ = _unpack((3, 4), 0, 2)
    with pytest.raises(MnnToolError, match="Unpack 'unpack'"):
        Session(g).run({"x": np.zeros((3, 4), np.float32)})
