"""Every numeric option is checked against its stated range before any work (issue 49, item 5): one
line naming the option and the range, exit 2, no output file; options that mean nothing in the chosen
mode are refused; image calibration without --mean/--std says that raw pixels are fed."""
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP, helper as h

from mnntool import api
from mnntool.errors import MnnToolError
from mnntool.quant import QuantConfig
from mnntool.quant.data import ImagePrep


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "mnntool", *map(str, args)], capture_output=True, text=True)


def _refused(done, *needles):
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr
    for n in needles:
        assert n in done.stderr, done.stderr


@pytest.fixture(scope="module")
def mnn(tmp_path_factory):
    d = tmp_path_factory.mktemp("ranges")
    rng = np.random.RandomState(0)
    w = onnx.numpy_helper.from_array(rng.randn(64, 64, 1, 1).astype(np.float32), "w")
    g = h.make_graph([h.make_node("Conv", ["x", "w"], ["y"])], "g",
                     [h.make_tensor_value_info("x", TP.FLOAT, [1, 64, 4, 4])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [1, 64, 4, 4])], [w])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), d / "m.onnx")
    api.convert(d / "m.onnx", d / "m.mnn")
    calib = d / "calib"
    calib.mkdir()
    np.save(calib / "a.npy", rng.randn(1, 64, 4, 4).astype(np.float32))
    return d / "m.mnn", calib


@pytest.mark.parametrize("cfg, message", [
    (QuantConfig(int8=True, calib="c", auto_skip=2.0), r"--auto-skip .*\(0, 1\].* 2"),
    (QuantConfig(int8=True, calib="c", auto_skip=0.0), r"--auto-skip .*\(0, 1\]"),
    (QuantConfig(int8=True, calib="c", auto_skip=float("nan")), r"--auto-skip .*\(0, 1\]"),
    (QuantConfig(fp16=True, auto_skip=0.99), r"--auto-skip .*--int8"),
    (QuantConfig(weight_bits=4, block_size=7), r"--block-size must be a power of two from 16 to 1024.* 7"),
    (QuantConfig(weight_bits=8, block_size=2048), r"--block-size .* 2048"),
    (QuantConfig(weight_bits=3), r"--weight-bits: only 8 and 4 are supported, got 3"),
    (QuantConfig(weight_bits=4, head_bits=2), r"--head-bits: only 8 and 4"),
    (QuantConfig(weight_bits=8, calib="c"), r"--calib .*weights only"),
    (QuantConfig(fp16=True, calib="c"), r"--calib .*--fp16"),
    (QuantConfig(int8=True, calib="c", samples=0), r"--samples must be at least 1"),
    (QuantConfig(int8=True, calib="c", prep=ImagePrep(mean=(1.0, 2.0))), r"--mean: 2 values for 3 channel"),
    (QuantConfig(int8=True, calib="c", prep=ImagePrep(normal=(1.0,) * 4)), r"--normal/--std: 4 values"),
    (QuantConfig(int8=True, calib="c", prep=ImagePrep(mean=(1.0, 2.0, 3.0), fmt="GRAY")), r"--mean: 3 values for 1"),
])
def test_config_ranges(cfg, message):
    with pytest.raises(MnnToolError, match=message):
        cfg.check()


def test_config_in_range_passes():
    QuantConfig(int8=True, calib="c", auto_skip=1.0, samples=1, prep=ImagePrep(mean=(1.0, 2.0, 3.0))).check()
    QuantConfig(weight_bits=4, block_size=32, head_bits=8).check()
    QuantConfig(int8=True, calib="c", prep=ImagePrep(mean=(5.0, 5.0, 5.0), normal=(0.5,) * 3, fmt="GRAY")).check()


@pytest.mark.parametrize("args, needles", [
    (["--int8", "--auto-skip", "2"], ["--auto-skip", "(0, 1]"]),
    (["--weight-bits", "4", "--block-size", "7"], ["--block-size", "16 to 1024"]),
    (["--int8", "--mean", "1,2"], ["--mean", "3 channel"]),
    (["--weight-bits", "8", "--calib", "CALIB"], ["--calib", "weights only"]),
])
def test_quant_cli_refuses_before_work(mnn, tmp_path, args, needles):
    src, calib = mnn
    args = [str(calib) if a == "CALIB" else a for a in args]
    if "--int8" in args and "--calib" not in args:
        args += ["--calib", str(calib)]
    out = tmp_path / "q.mnn"
    _refused(_cli("quant", src, out, *args), *needles)
    assert not out.exists()


@pytest.mark.parametrize("args, needle", [(["--min-cosine", "2"], "--min-cosine must be in [0, 1]"),
                                          (["--min-cosine", "-0.5"], "--min-cosine"),
                                          (["--max-abs", "-1"], "--max-abs must be at least 0")])
def test_verify_thresholds_in_range(mnn, tmp_path, args, needle):
    src, _ = mnn
    report = tmp_path / "r.html"
    _refused(_cli("verify", src.with_suffix(".onnx"), src, *args, "--report", report), needle)
    assert not report.exists()


def test_image_calibration_without_mean_std_prints_a_notice(tmp_path):
    pytest.importorskip("PIL")
    from PIL import Image
    rng = np.random.RandomState(1)
    w = onnx.numpy_helper.from_array(rng.randn(8, 3, 3, 3).astype(np.float32), "w")
    w2 = onnx.numpy_helper.from_array(rng.randn(8, 8, 1, 1).astype(np.float32), "w2")
    g = h.make_graph([h.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["c"], ["r"]),
                      h.make_node("Conv", ["r", "w2"], ["y"])], "g",
                     [h.make_tensor_value_info("x", TP.FLOAT, [1, 3, 8, 8])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [1, 8, 8, 8])], [w, w2])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), tmp_path / "m.onnx")
    api.convert(tmp_path / "m.onnx", tmp_path / "m.mnn")
    calib = tmp_path / "imgs"
    calib.mkdir()
    for k in range(2):
        Image.fromarray(rng.randint(0, 255, (8, 8, 3)).astype(np.uint8)).save(calib / f"{k}.png")
    done = _cli("quant", tmp_path / "m.mnn", tmp_path / "q.mnn", "--int8", "--calib", calib)
    assert done.returncode == 0, done.stderr
    assert "raw 0-255 pixel values" in done.stderr
    done = _cli("quant", tmp_path / "m.mnn", tmp_path / "q2.mnn", "--int8", "--calib", calib,
                "--mean", "127.5", "--std", "127.5")
    assert done.returncode == 0, done.stderr
    assert "raw 0-255" not in done.stderr
