"""ONNX files that are invalid, hostile or large: each is one clean line (or a correct conversion), never a
traceback, a multi-GB allocation, a read outside the model's folder, or a .mnn that cannot run.
References: onnxruntime for the external-data model; the weights as written for the skeleton reader."""
import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

import mnntool
from mnntool import api
from mnntool.errors import MnnToolError
from mnntool.frontends.onnx.weights import read_model

ROOT = Path(__file__).resolve().parents[2]


def _save(path, nodes, inits=(), x=(1, 4), y=("a", "b")):
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, list(x))],
                     [h.make_tensor_value_info("y", TP.FLOAT, list(y))], list(inits))
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)
    return path


def _refused(tmp_path, src, pattern):
    """One line matching `pattern` (the tensor named), and no output file."""
    dst = tmp_path / "out.mnn"
    with pytest.raises(MnnToolError) as e:
        api.convert(src, dst)
    assert re.search(pattern, str(e.value)), str(e.value)
    assert "\n" not in str(e.value) and not dst.exists()


def test_initializer_shorter_than_its_shape(tmp_path):
    t = onnx.TensorProto(name="w", data_type=TP.FLOAT, dims=[4, 4], raw_data=np.zeros(3, np.float32).tobytes())
    _refused(tmp_path, _save(tmp_path / "m.onnx", [h.make_node("MatMul", ["x", "w"], ["y"])], [t]), r"\bw\b")


def test_initializer_claiming_a_terabyte_without_data(tmp_path):
    t = onnx.TensorProto(name="w", data_type=TP.FLOAT, dims=[10**6, 10**6])
    _refused(tmp_path, _save(tmp_path / "m.onnx", [h.make_node("MatMul", ["x", "w"], ["y"])], [t]), r"\bw\b")


def _limited(*args):
    """The CLI under a 4 GB address-space limit: a multi-GB allocation fails instead of passing."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    return subprocess.run([sys.executable, "-m", "mnntool", *map(str, args)], capture_output=True, text=True,
                          preexec_fn=limit, env={**os.environ, "NUMBA_THREADING_LAYER": "workqueue"})


@pytest.mark.parametrize("op", ["ConstantOfShape", "Expand"])
def test_sixteen_gigabyte_tensors_are_refused_without_allocating(tmp_path, op):
    shape = nh.from_array(np.array([2**20, 2**10, 4], np.int64), "s")
    nodes = ([h.make_node("ConstantOfShape", ["s"], ["c"]), h.make_node("Add", ["x", "c"], ["y"])]
             if op == "ConstantOfShape" else [h.make_node("Expand", ["x", "s"], ["y"])])
    src = _save(tmp_path / "m.onnx", nodes, [shape], y=("a", "b", "c"))
    done = _limited("convert", src, tmp_path / "m.mnn")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "4294967296 elements" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "m.mnn").exists()


def test_two_nodes_writing_one_tensor(tmp_path):
    src = _save(tmp_path / "m.onnx", [h.make_node("Relu", ["x"], ["y"]), h.make_node("Sigmoid", ["x"], ["y"])],
                y=(1, 4))
    _refused(tmp_path, src, r"'y'")


def test_checker_runs_before_conversion(tmp_path):
    """A type clash onnx's strict shape inference sees (Add of float and int64) is refused up front."""
    c = nh.from_array(np.ones((1, 4), np.int64), "c")
    _refused(tmp_path, _save(tmp_path / "m.onnx", [h.make_node("Add", ["x", "c"], ["y"])], [c], y=(1, 4)),
             "onnx's")


def _linear_model(tmp_path, name="m.onnx", external=True, n=256):
    rng = np.random.default_rng(0)
    w = nh.from_array(rng.standard_normal((n, n)).astype(np.float32), "w")
    b = nh.from_array(rng.standard_normal(n).astype(np.float32), "b")
    g = h.make_graph([h.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)], "g",
                     [h.make_tensor_value_info("x", TP.FLOAT, [2, n])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [2, n])], [w, b])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    path = tmp_path / name
    if external:
        onnx.save(m, path, save_as_external_data=True, location="weights.bin", size_threshold=0)
    else:
        onnx.save(m, path)
    return path


def test_external_data_converts_and_matches_onnxruntime(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    src = _linear_model(tmp_path)
    assert (tmp_path / "weights.bin").stat().st_size > 256 * 256 * 4
    api.convert(src, tmp_path / "m.mnn")
    x = np.random.default_rng(1).standard_normal((2, 256)).astype(np.float32)
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(mnntool.load(tmp_path / "m.mnn").run({"x": x})["y"], ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("where", ["parent", "absolute", "symlink"])
def test_external_data_outside_the_folder_is_refused(tmp_path, where):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    src = _linear_model(model_dir)
    secret = tmp_path / "secret.bin"
    os.replace(model_dir / "weights.bin", secret)
    m = onnx.load(src, load_external_data=False)
    location = {"parent": "../secret.bin", "absolute": str(secret), "symlink": "link.bin"}[where]
    if where == "symlink":
        os.symlink(secret, model_dir / "link.bin")
    for t in m.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = location
    onnx.save(m, src)
    dst = tmp_path / "m.mnn"
    with pytest.raises(MnnToolError) as e:
        api.convert(src, dst)
    assert ("inside the model's folder" in str(e.value) or "checker" in str(e.value)) and not dst.exists()


def test_skeleton_reads_every_weight_as_written(tmp_path):
    """The wire-format reader leaves raw data in the file and reads it back bit for bit."""
    src = _linear_model(tmp_path, external=False)
    full = {t.name: nh.to_array(t) for t in onnx.load(src).graph.initializer}
    model, weights = read_model(src)
    assert model.ByteSize() < 4096
    for t in model.graph.initializer:
        got = weights.array(t)
        assert got.dtype == full[t.name].dtype and np.array_equal(got, full[t.name])


def test_truncated_or_garbage_onnx_is_one_line(tmp_path):
    src = _linear_model(tmp_path, external=False)
    data = src.read_bytes()
    for k, blob in enumerate([data[: len(data) // 2], data[:7], b"\x0a\xff\xff\xff\xff\x0f" + data[6:100],
                              bytes(range(256)) * 4]):
        bad = tmp_path / f"bad{k}.onnx"
        bad.write_bytes(blob)
        with pytest.raises(MnnToolError) as e:
            api.convert(bad, tmp_path / "out.mnn")
        assert "\n" not in str(e.value)
    assert not (tmp_path / "out.mnn").exists()


def test_convert_holds_the_weights_about_once(tmp_path):
    """Peak RSS of a 64 MB conversion above a tiny model's is under 1.5x the model (it was 5x: onnx.load's
    bytes plus message, copies of every weight, FlatBuffers doublings); the largest single weight is
    held twice while it is copied into the file. benchmarks/convert_memory.py has larger models."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("convert_memory", ROOT / "benchmarks" / "convert_memory.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    big, small = tmp_path / "big.onnx", tmp_path / "small.onnx"
    bench.build(big, 64, external=False)          # 4 layers of 16 MB: the largest is copied while written
    bench.build(small, 1, external=False)

    def peak(src):
        code = ("import sys; from mnntool import api; api.convert(sys.argv[1], sys.argv[2]); "
                "print(open('/proc/self/status').read().split('VmHWM:')[1].split()[0])")   # not ru_maxrss:
        # that survives fork+exec, so the child would report the test process's own peak
        out = subprocess.run([sys.executable, "-c", code, str(src), str(src.with_suffix(".mnn"))],
                             capture_output=True, text=True, check=True).stdout
        return int(out.split()[-1]) * 1024

    size = big.stat().st_size
    assert size > 64 << 20
    assert peak(big) - peak(small) < 1.5 * size
