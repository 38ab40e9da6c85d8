"""Hostile and corrupt .mnn files: parameters that contradict each other, shapes no device could hold,
and byte-flipped files end in one clean error line (exit 2), never a crash or a traceback.

The fuzz part runs `benchmarks/fuzz_mnn.py` in a child process (it forks per case, which GNU OpenMP
forbids in a process whose pool has started) on 150 mutations; the long run is reported in the notes."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mnntool.format import writer
from mnntool.ir.graph import Graph, Node, TensorInfo
from tests.test_cli import assert_one_line_error, run

ROOT = Path(__file__).resolve().parents[2]


def _conv_model(path, cin=4, cout=6, group=1, weights=None, shape=(1, 4, 8, 8)):
    w = np.ones(weights if weights is not None else cout * (cin // max(group, 1)) * 9, np.float32)
    node = Node("Convolution", ["x"], ["y"], "conv",
                {"common": {"outputCount": cout, "inputCount": cin, "kernelX": 3, "kernelY": 3, "padX": 1, "padY": 1,
                            "group": group}, "weight": w, "bias": np.zeros(cout, np.float32)}, "Convolution2D")
    g = Graph(nodes=[node], inputs=["x"], outputs=["y"])
    g.tensors["x"] = TensorInfo("x", "float32", shape)
    writer.save(g, path)
    return path


def test_group_that_does_not_divide_the_channels(tmp_path):
    # cin 4, group 3: the depthwise/grouped kernels would index past the weights (heap corruption before)
    path = _conv_model(tmp_path / "g.mnn", cin=4, cout=6, group=3, weights=6 * 1 * 9)
    assert_one_line_error(*run("run", path), "conv", "group 3 does not divide")


def test_weights_of_the_wrong_size(tmp_path):
    path = _conv_model(tmp_path / "w.mnn", weights=6 * 4 * 9 - 5)
    assert_one_line_error(*run("run", path), "conv")


def test_shape_no_device_holds(tmp_path):
    path = _conv_model(tmp_path / "big.mnn")
    assert_one_line_error(*run("run", path, "--input-shape", "x:1x4x100000x100000"), "GB")
    wide = _conv_model(tmp_path / "wide.mnn", cin=4, cout=24)      # a 1 GB input fits, its 6 GB output does not
    assert_one_line_error(*run("run", wide, "--input-shape", "x:1x4x8000x8000"), "tensor 'y'", "GB")


def test_truncated_file(tmp_path):
    good = _conv_model(tmp_path / "t.mnn")
    cut = tmp_path / "cut.mnn"
    cut.write_bytes(good.read_bytes()[:200])
    for cmd in ("info", "run"):
        assert_one_line_error(*run(cmd, cut), "cut.mnn")


@pytest.mark.parametrize("target", ["mnn", "onnx"])
def test_fuzzed_files_end_cleanly(tmp_path, target):
    out = tmp_path / "fuzz.json"
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "fuzz_mnn.py"), "--cases", "150", "--seed", "7",
                        "--target", target, "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads(out.read_text())
    assert sum(r["counts"].values()) == 150
    assert not r["failures"], r["failures"][:5]


def test_invalid_parameters_are_not_hidden_behind_the_numpy_fallback():
    """A factory's InvalidModel reaches the user; the op's numpy definition does not run in its place."""
    from mnntool.errors import InvalidModel
    from mnntool.ir.ops import Val
    from mnntool.runtime.session import kernel_for
    from mnntool.runtime.settings import Settings
    node = Node("Convolution", ["x"], ["y"], "conv",
                {"common": {"outputCount": 6, "kernelX": 3, "kernelY": 3, "padX": 1, "padY": 1},
                 "weight": np.ones(6 * 4 * 9, np.float32), "bias": np.zeros(6, np.float32)})
    with pytest.raises(InvalidModel, match="reads past"):      # a 20x20 output from an 8x8 input
        kernel_for(node, [Val((1, 4, 8, 8), "float32")], [Val((1, 6, 20, 20), "float32")], Settings(1))
