"""Every fixture: convert with mnntool -> run in the real MNN runtime -> compare with onnxruntime.

Tolerance (from the foundation issue): cosine >= 0.9999, max abs diff <= 1e-3 x the output's scale.
"""
import numpy as np
import pytest

from mnntool import api
from mnntool.format import reader
from tests.conftest import assert_close, mnn_convert, mnn_run, ort_run

FIXTURES = ["mobilenetv2", "resnet18", "bert", "lstm"]


def _feeds(name):
    rng = np.random.default_rng(7)
    if name == "bert":
        return {"ids": rng.integers(0, 1000, (1, 128)).astype(np.int64)}
    shape = (16, 1, 32) if name == "lstm" else (1, 3, 224, 224)
    return {"input": rng.standard_normal(shape).astype(np.float32)}


@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_converts_and_matches_in_mnn(tmp_path, fixture_model, name):
    src = fixture_model(name)
    dst = tmp_path / f"{name}.mnn"
    report = api.convert(src, dst)
    assert report["size_bytes"] == dst.stat().st_size
    feeds = _feeds(name)
    ref = ort_run(src, feeds)
    g = reader.load(dst)
    got = mnn_run(dst, g.inputs, g.outputs, feeds)
    assert_close(ref["output"], got["output"])


@pytest.mark.parametrize("name", FIXTURES)
def test_mnn_made_files_read_into_the_ir(tmp_path, fixture_model, name):
    """Files from MNN's own converter read back with the op count of MNN's own JSON dump."""
    import json

    from mnntool.mnn_tools import mnnconvert
    src = fixture_model(name)
    theirs = tmp_path / f"{name}_mnn.mnn"
    mnn_convert(src, theirs)
    dump = tmp_path / "dump.json"
    mnnconvert("-f", "MNN", "--modelFile", theirs, "--JsonFile", dump)
    ops = json.loads(dump.read_text())["oplists"]
    g = reader.load(theirs)
    n_inputs_consts = sum(op["type"] in ("Input", "Const") for op in ops)
    assert len(g.nodes) + n_inputs_consts == len(ops)
    assert len(g.inputs) == sum(op["type"] == "Input" for op in ops)
    info = api.info(theirs)
    assert sum(info["op_counts"].values()) == len(ops) - n_inputs_consts
    if name in ("mobilenetv2", "resnet18"):
        assert info["outputs"][0]["shape"] == [1, 1000]
        assert info["flops"] > 3e8
