"""Shared test helpers: fixture models built on demand into build/fixtures, MNN and onnxruntime oracles."""
from __future__ import annotations

from mnntool.threadpool import tune_process

tune_process()      # as the CLI does, before numpy loads; child processes inherit it

import os  # noqa: E402

# a one-thread call site bound to a kernel checks its argument types at every call (kernels/jit.Bound)
os.environ.setdefault("MNNTOOL_CHECK_KERNELS", "1")
# a fast kernel that fails to prepare for a reason it does not name is an error, not a silent numpy
# fallback (runtime/fallbacks.py)
os.environ.setdefault("MNNTOOL_STRICT_KERNELS", "1")
# plans at more than one thread use the default thresholds, not ones measured on this (busy) machine:
# the same plans every run (tests/runtime/test_host_tuning.py measures)
os.environ.setdefault("MNNTOOL_HOST_TUNING", "defaults")
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CACHE = ROOT / "build" / "fixtures"

if os.environ.get("MNNTOOL_CRASH_LOG"):
    # `make test`: a native crash's Python stack goes to this file, whose test and mnntool frames the
    # Makefile prints after it (CI shows only the end of the output, where the stack's pytest frames were)
    import faulthandler  # noqa: E402
    # appended to: the suite's two worker processes (pytest-xdist) share it; the Makefile empties it first
    _CRASH_LOG = open(os.environ["MNNTOOL_CRASH_LOG"], "a")  # noqa: SIM115 - open while the session runs
    faulthandler.enable(_CRASH_LOG, all_threads=False)


# the modules that take longest (a wheel built and installed, the zoo's exports, LLM checkpoints): run first,
# so that `make test`'s two workers (pytest-xdist, whole modules each: --dist loadfile) end together instead
# of one of them starting the longest module when the other has nothing left
_LONG_FIRST = ("test_wheel_smoke.py", "test_model_zoo.py", "test_verify.py", "test_tensorflow.py",
               "test_quant_files.py", "test_torchscript.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: k for k, name in enumerate(_LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))      # stable: the rest keep their order


@pytest.fixture(scope="session")
def fixture_model():
    pytest.importorskip("torch")
    from fixtures.models import build

    def get(name: str) -> Path:
        return build(name, CACHE)
    return get


def ort_run(path, feeds):
    import onnxruntime as ort
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def mnn_run(path, inputs, outputs, feeds):
    from mnntool.runtime.mnn_backend import MnnSession
    return MnnSession(str(path), inputs, outputs).run(feeds)


def assert_close(ref, got, min_cos=0.9999, rel_abs=1e-3):
    """cosine >= min_cos and max abs diff <= rel_abs * max(|ref|) (the output's scale)."""
    from mnntool.compare import metrics
    ref = np.asarray(ref, np.float64)
    got = np.asarray(got, np.float64).reshape(ref.shape)
    m = metrics(ref, got)
    scale = max(float(np.abs(ref).max()), 1e-6)
    assert m["cosine"] >= min_cos, m
    assert m["max_abs"] <= rel_abs * scale, m
    return m


def mnn_convert(onnx_path, mnn_path):
    """Convert with MNN's own converter (in a child process: see mnntool.mnn_tools)."""
    from mnntool.mnn_tools import mnnconvert
    mnnconvert("-f", "ONNX", "--modelFile", onnx_path, "--MNNModel", mnn_path, "--bizCode", "test")


def save_onnx(graph, path, opset: int = 17, ir_version: int = 8) -> None:
    """An onnx.helper graph saved as a model at `path` (the opset and IR version every runtime here reads)."""
    import onnx
    from onnx import helper
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = ir_version
    onnx.save(m, str(path))


def one_node_files(folder, node, shape):
    """A model of one onnx.helper `node` reading float32 "x" of `shape` and writing "y" (save_onnx's opset
    17), and mnntool's conversion of it: (the .onnx, the .mnn) in `folder`."""
    from onnx import TensorProto, helper

    from mnntool import api
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    src, mnn = folder / "m.onnx", folder / "m.mnn"
    save_onnx(g, src)
    api.convert(src, mnn)
    return src, mnn
