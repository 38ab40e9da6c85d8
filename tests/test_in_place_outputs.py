"""No command writes over one of its own inputs (issue 49, item 4): convert, quant, info --dump-json,
run -o and verify --report each refuse, in one line with exit 2, before any work, and leave the input
as it was. A hard link or a symlink to the input is the input."""
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP, helper as h

from mnntool import api


def _onnx(path):
    w = onnx.numpy_helper.from_array(np.arange(16, dtype=np.float32).reshape(4, 4) / 10, "w")
    g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["m"]), h.make_node("Relu", ["m"], ["y"])], "g",
                     [h.make_tensor_value_info("x", TP.FLOAT, [1, 4])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [1, 4])], [w])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), path)
    return path


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "mnntool", *map(str, args)], capture_output=True, text=True)


def _refused(done, *needles):
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr
    for n in needles:
        assert n in done.stderr, done.stderr


@pytest.fixture
def mnn(tmp_path):
    dst = tmp_path / "m.mnn"
    api.convert(_onnx(tmp_path / "m.onnx"), dst)
    return dst


@pytest.mark.parametrize("how", ["same", "dot", "symlink", "hardlink"])
def test_quant_onto_its_source_is_refused(mnn, how):
    before = mnn.read_bytes()
    out = {"same": mnn, "dot": mnn.parent / "." / mnn.name, "symlink": mnn.parent / "l.mnn",
           "hardlink": mnn.parent / "h.mnn"}[how]
    if how == "symlink":
        out.symlink_to(mnn.name)
    if how == "hardlink":
        os.link(mnn, out)
    _refused(_cli("quant", mnn, out, "--fp16"), "source model", "refusing")
    assert mnn.read_bytes() == before


def test_quant_api_refuses_before_work(mnn):
    from mnntool.errors import MnnToolError
    from mnntool.quant import QuantConfig, quantize_file
    with pytest.raises(MnnToolError, match="refusing"):
        quantize_file(mnn, mnn, QuantConfig(weight_bits=8))


def test_convert_onto_a_hard_link_of_its_source_is_refused(tmp_path):
    src = _onnx(tmp_path / "m.onnx")
    os.link(src, tmp_path / "h.onnx")
    before = src.read_bytes()
    _refused(_cli("convert", src, tmp_path / "h.onnx"), "refusing")
    assert src.read_bytes() == before


def test_dump_json_onto_its_source_is_refused(mnn):
    before = mnn.read_bytes()
    _refused(_cli("info", mnn, "--dump-json", mnn), "refusing")
    assert mnn.read_bytes() == before


def test_run_output_onto_its_input_file_is_refused(mnn, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    x = out / "y.npy"        # the model's output is named y: -o out would write out/y.npy
    np.save(x, np.ones((1, 4), np.float32))
    before = x.read_bytes()
    _refused(_cli("run", mnn, "-i", f"x={x}", "-o", out), "an input", "refusing")
    assert x.read_bytes() == before
    # elsewhere it writes
    done = _cli("run", mnn, "-i", f"x={x}", "-o", tmp_path / "elsewhere")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "elsewhere" / "y.npy").exists()


@pytest.mark.parametrize("which", ["model", "source"])
def test_verify_report_onto_an_input_is_refused(mnn, tmp_path, which):
    pytest.importorskip("onnxruntime")
    target = mnn if which == "model" else tmp_path / "m.onnx"
    before = target.read_bytes()
    _refused(_cli("verify", tmp_path / "m.onnx", mnn, "--report", target), "refusing")
    assert target.read_bytes() == before


def test_quant_onto_its_config_file_is_refused(mnn, tmp_path):
    cfg = tmp_path / "q.json"
    cfg.write_text('{"method": "mse"}')
    _refused(_cli("quant", mnn, cfg, "--fp16", "--config", cfg), "an input", "refusing")
    assert cfg.read_text() == '{"method": "mse"}'
