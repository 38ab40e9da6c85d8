"""The quantizer's one config value and its streaming calibration data: what each setting may be,
a --config file on top, and calibration that holds one sample at a time whatever the data's size.
Reference for the int8 result: the same samples given as a folder and as an in-memory list must give
byte-identical files."""
import gc
import json
import weakref

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP, helper as h, numpy_helper as nh

from mnntool import api
from mnntool.errors import MnnToolError
from mnntool.format import reader
from mnntool.quant import CalibrationReader, ListReader, QuantConfig, quantize_file
from mnntool.quant.ptq import calibrate, targets


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    d = tmp_path_factory.mktemp("qc")
    rng = np.random.default_rng(0)
    w1 = nh.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3, "w1")
    w2 = nh.from_array(rng.standard_normal((4, 8, 1, 1)).astype(np.float32) * 0.3, "w2")
    g = h.make_graph([h.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["a"], ["r"]),
                      h.make_node("Conv", ["r", "w2"], ["y"])], "g",
                     [h.make_tensor_value_info("x", TP.FLOAT, [1, 3, 12, 12])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [1, 4, 12, 12])], [w1, w2])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), d / "m.onnx")
    api.convert(d / "m.onnx", d / "m.mnn")
    calib = d / "calib"
    calib.mkdir()
    samples = [rng.standard_normal((1, 3, 12, 12)).astype(np.float32) for _ in range(6)]
    for k, x in enumerate(samples):
        np.save(calib / f"{k}.npy", x)
    return d / "m.mnn", calib, samples


@pytest.mark.parametrize("cfg, message", [
    (QuantConfig(), "exactly one of"),
    (QuantConfig(int8=True, fp16=True, calib="x"), "exactly one of"),
    (QuantConfig(fp16=True, block_size=32), "--block-size"),
    (QuantConfig(int8=True), "--calib"),
    (QuantConfig(int8=True, calib="x", method="entropy"), "unknown calibration method 'entropy'"),
])
def test_check_refuses_contradictions(cfg, message):
    with pytest.raises(MnnToolError, match=message):
        cfg.check()


def test_config_file_on_top(tmp_path):
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"method": "kl", "skip": ["b"], "batches": 3}))
    cfg = QuantConfig(int8=True, calib="d", skip=("a",)).with_file(p)
    assert (cfg.method, cfg.skip, cfg.samples, cfg.calib) == ("kl", ("a", "b"), 3, "d")
    p.write_text(json.dumps({"methd": "kl"}))
    with pytest.raises(MnnToolError, match="unknown setting.*methd"):
        QuantConfig(int8=True).with_file(p)
    p.write_text("{")
    with pytest.raises(MnnToolError, match="not valid JSON"):
        QuantConfig(int8=True).with_file(p)


class _Stream(CalibrationReader):
    """Makes each sample when asked and counts how many are alive at once."""

    def __init__(self, n, shape):
        self.n, self.shape, self.refs, self.peak = n, shape, [], 0

    def __len__(self):
        return self.n

    def __iter__(self):
        for k in range(self.n):
            gc.collect()
            x = np.random.default_rng(k).standard_normal(self.shape).astype(np.float32)
            self.refs.append(weakref.ref(x))
            self.peak = max(self.peak, sum(r() is not None for r in self.refs))
            yield {"x": x}
            del x


def test_calibration_holds_one_sample_at_a_time(small):
    src, _, _ = small
    g = reader.load(src)
    stream = _Stream(40, (1, 3, 12, 12))
    grids, means = calibrate(g, stream, "mse", targets(g, set()))
    assert stream.peak <= 2 and grids and means


def test_folder_and_list_give_the_same_file(small, tmp_path):
    src, calib, samples = small
    a, b = tmp_path / "a.mnn", tmp_path / "b.mnn"
    ra = quantize_file(src, a, QuantConfig(int8=True, calib=calib, method="kl"))
    rb = quantize_file(src, b, QuantConfig(int8=True, calib=ListReader([{"x": x} for x in samples]), method="kl"))
    assert a.read_bytes() == b.read_bytes()
    assert (ra["calibration_samples"], ra["held_out_samples"]) == (rb["calibration_samples"], rb["held_out_samples"])
    assert ra["calibration_samples"] == 5
