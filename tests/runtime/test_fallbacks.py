"""A fast-kernel factory that breaks: an error under the tests (MNNTOOL_STRICT_KERNELS=1, conftest.py), and
otherwise the definition's numpy compute, counted and reported by `bench --json`. Reference for the
outputs: the op's definition (ir/ops), exactly."""
import json

import numpy as np
import pytest

from mnntool.format import writer
from mnntool.ir.graph import Graph, Node, TensorInfo
from mnntool.ir.ops import REGISTRY
from mnntool.runtime import fallbacks
from mnntool.runtime.kernels import KERNELS


def _sigmoid_graph() -> Graph:
    g = Graph(inputs=["x"], outputs=["y"], nodes=[Node("Sigmoid", ["x"], ["y"], "s")])
    g.tensors["x"] = TensorInfo("x", "float32", (2, 3))
    return g


@pytest.fixture
def broken_sigmoid(monkeypatch):
    def factory(node, ins, outs, settings):
        raise IndexError("a kernel's own bug")
    monkeypatch.setitem(KERNELS, "Sigmoid", factory)


def test_a_broken_kernel_is_an_error_under_the_tests(broken_sigmoid):
    from mnntool.runtime.session import Session
    x = np.linspace(-3, 3, 6, dtype=np.float32).reshape(2, 3)
    with pytest.raises(Exception, match="Sigmoid 's': its fast kernel failed to prepare .IndexError"):
        Session(_sigmoid_graph()).run({"x": x})


def test_otherwise_it_falls_back_and_is_counted(broken_sigmoid, monkeypatch):
    from mnntool.runtime.session import Session
    monkeypatch.delenv(fallbacks.STRICT_ENV, raising=False)
    before = fallbacks.snapshot()
    x = np.linspace(-3, 3, 6, dtype=np.float32).reshape(2, 3)
    got = Session(_sigmoid_graph()).run({"x": x})["y"]
    np.testing.assert_array_equal(got, REGISTRY["Sigmoid"].evaluate(_sigmoid_graph().nodes[0], [x])[0])
    assert fallbacks.report(since=before) == [{"op": "Sigmoid", "reason": "failed", "error": "IndexError", "count": 1}]


def test_bench_json_reports_the_fallbacks(broken_sigmoid, monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from mnntool.cli import app
    monkeypatch.delenv(fallbacks.STRICT_ENV, raising=False)
    writer.save(_sigmoid_graph(), tmp_path / "s.mnn")
    res = CliRunner().invoke(app, ["bench", str(tmp_path / "s.mnn"), "--runs", "2", "--warmup", "0", "--json"])
    assert res.exit_code == 0, res.output
    r = json.loads(res.output.strip().splitlines()[-1])
    assert r["kernel_fallbacks"] == [{"op": "Sigmoid", "reason": "failed", "error": "IndexError", "count": 1}]
