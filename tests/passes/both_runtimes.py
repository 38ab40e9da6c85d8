"""The checks every converter-form test of tests/passes makes on its file: the float file computes the
source (onnxruntime) in mnntool's runtime and in MNN (conftest.assert_close: cosine >= 0.9999, max abs
<= 1e-3 of the output's scale), and its int8 file (mse, 8 seeded N(0,1) samples) means the same in both
runtimes (cosine >= 0.9999 between them) and stays >= 0.99 of fp32 in MNN. One input "x", one output "y".
`exported` makes the files those tests start from, `files_fixture` the module fixture that holds them."""
from __future__ import annotations

import numpy as np
import pytest

from mnntool.compare import metrics
from mnntool.format import reader
from mnntool.runtime.session import Session
from tests.conftest import assert_close, mnn_run, ort_run


def exported(model, shape, folder):
    """`model` with its batch norms measured on 8 inputs drawn from torch's generator
    (fixtures.trained_stats, so activations keep their scale), exported by torch's legacy exporter (opset
    17, input "x" of `shape`, output "y") and converted by mnntool: (the .onnx, the .mnn) in `folder`."""
    import torch

    from fixtures.trained_stats import measure_batchnorm
    from mnntool import api
    measure_batchnorm(model, torch.randn(8, *shape[1:]))
    src, fp32 = folder / "m.onnx", folder / "m.mnn"
    torch.onnx.export(model, (torch.randn(*shape),), str(src), dynamo=False, opset_version=17, input_names=["x"],
                      output_names=["y"])
    api.convert(src, fp32)
    return src, fp32


def files_fixture(make_model, shape, folder: str):
    """A module-scoped pytest fixture `files`: (the .onnx, the .mnn, their folder) of `make_model()` built
    after torch.manual_seed(0) (the same weights every run) and `exported` into a new folder named `folder`."""
    @pytest.fixture(scope="module")
    def files(tmp_path_factory):
        import torch
        torch.manual_seed(0)
        d = tmp_path_factory.mktemp(folder)
        return (*exported(make_model(), shape, d), d)
    return files


def assert_fp32_same(src, mnn, shape) -> None:
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    ref = ort_run(src, {"x": x})["y"]
    assert_close(ref, Session(reader.load(mnn)).run({"x": x})["y"])
    pytest.importorskip("MNN")
    assert_close(ref, mnn_run(mnn, ["x"], ["y"], {"x": x})["y"])


def assert_int8_same(fp32, int8, shape) -> None:
    pytest.importorskip("MNN")
    from mnntool.quant import QuantConfig, quantize_file
    rng = np.random.default_rng(0)
    samples = [{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(8)]
    quantize_file(fp32, int8, QuantConfig(int8=True, calib=samples, method="mse"))
    feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
    ref = Session(reader.load(fp32)).run(feeds)["y"]
    ours = Session(reader.load(int8)).run(feeds)["y"]
    theirs = mnn_run(int8, ["x"], ["y"], feeds)["y"].reshape(ours.shape)
    assert metrics(ref, theirs)["cosine"] >= 0.99
    agree = metrics(theirs, ours)
    assert agree["cosine"] >= 0.9999, agree


def agreement_tests(shape):
    """The two tests each pass's model file gets, for a module with a `files` fixture (files_fixture):
    fp32 against onnxruntime in both runtimes, and the quantized file meaning the same in both. Assign
    them at module level: `test_fp32_..., test_int8_... = agreement_tests(SHAPE)`."""
    def test_fp32_means_the_same_in_both_runtimes(files):
        src, fp32, _ = files
        assert_fp32_same(src, fp32, shape)

    def test_int8_means_the_same_in_both_runtimes(files):
        _, fp32, d = files
        assert_int8_same(fp32, d / "m8.mnn", shape)
    return test_fp32_means_the_same_in_both_runtimes, test_int8_means_the_same_in_both_runtimes
