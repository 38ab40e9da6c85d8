"""The CLI on good and bad input: one clear line, a non-zero exit, no output file left behind."""
import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP, helper as h, numpy_helper as nh


def run(*args):
    p = subprocess.run([sys.executable, "-m", "mnntool", *map(str, args)], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


@pytest.fixture
def small_onnx(tmp_path):
    w = nh.from_array(np.random.RandomState(0).randn(4, 3, 3, 3).astype(np.float32), "w")
    g = h.make_graph([h.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["c"], ["y"])],
                     "g", [h.make_tensor_value_info("x", TP.FLOAT, ["N", 3, 8, 8])],
                     [h.make_tensor_value_info("y", TP.FLOAT, None)], initializer=[w])
    path = tmp_path / "small.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), path)
    return path


def assert_one_line_error(code, out, err, *needles):
    assert code == 2, (code, out, err)
    lines = [line for line in err.strip().splitlines()      # MNN's CPU banner; the first compile's note
             if "device supports" not in line and not line.startswith("mnntool: first run")]
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    assert "Traceback" not in err
    for n in needles:
        assert n in lines[0], (n, lines[0])


def test_convert_and_info_json(tmp_path, small_onnx):
    out = tmp_path / "m.mnn"
    code, stdout, _ = run("convert", small_onnx, out, "--input-shape", "x:2x3x8x8", "--json")
    assert code == 0
    report = json.loads(stdout)
    assert report["ops"] >= 2 and report["size_bytes"] == out.stat().st_size
    code, stdout, _ = run("info", out, "--json")
    info = json.loads(stdout)
    assert info["inputs"][0]["shape"] == [2, 3, 8, 8]
    assert info["outputs"][0]["shape"] == [2, 4, 8, 8]
    assert info["op_counts"] == {"ConvertTensor": 2, "Convolution": 1} and info["params"] == 108 + 4  # + zero bias
    assert info["flops"] == 2 * 2 * 4 * 8 * 8 * 27   # conv MACs x2; the ReLU is fused into the conv
    dump = tmp_path / "m.json"
    code, _, _ = run("info", out, "--dump-json", dump)
    assert code == 0 and json.loads(dump.read_text())["oplists"][0]["type"] == "Input"


def test_missing_file(tmp_path):
    assert_one_line_error(*run("convert", tmp_path / "nope.onnx", tmp_path / "o.mnn"), "nope.onnx", "no such file")
    assert not (tmp_path / "o.mnn").exists()


@pytest.mark.parametrize("suffix", [".onnx", ".mnn"])
def test_empty_file(tmp_path, suffix):
    src = tmp_path / f"empty{suffix}"
    src.write_bytes(b"")
    cmd = ("info", src) if suffix == ".mnn" else ("convert", src, tmp_path / "o.mnn")
    assert_one_line_error(*run(*cmd), "empty")
    assert not (tmp_path / "o.mnn").exists()


def test_truncated_onnx(tmp_path, small_onnx):
    data = small_onnx.read_bytes()
    bad = tmp_path / "cut.onnx"
    bad.write_bytes(data[: len(data) // 2])
    assert_one_line_error(*run("convert", bad, tmp_path / "o.mnn"), "cut.onnx")
    assert not (tmp_path / "o.mnn").exists()


def test_truncated_mnn(tmp_path, small_onnx):
    good = tmp_path / "m.mnn"
    assert run("convert", small_onnx, good)[0] == 0
    data = good.read_bytes()
    for cut in (9, len(data) // 3, len(data) - 7):
        bad = tmp_path / "cut.mnn"
        bad.write_bytes(data[:cut])
        assert_one_line_error(*run("info", bad), "cut.mnn", "not a valid MNN model")


def test_text_file(tmp_path):
    txt = tmp_path / "notes.mnn"
    txt.write_text("this is not a model\n" * 20)
    assert_one_line_error(*run("info", txt), "notes.mnn")
    txt2 = tmp_path / "notes.onnx"
    txt2.write_text("this is not a model\n" * 20)
    assert_one_line_error(*run("convert", txt2, tmp_path / "o.mnn"), "notes.onnx")


def test_unsupported_ops_listed_all_at_once(tmp_path):
    g = h.make_graph([h.make_node("Relu", ["x"], ["a"]), h.make_node("Einsum", ["a", "a"], ["b"], name="ein1",
                                                                      equation="kij,kij->kij"),
                      h.make_node("Det", ["b"], ["c"], name="det1"), h.make_node("Einsum", ["c", "c"], ["y"],
                                                                                 name="ein2", equation="i,i->i")],
                     "g", [h.make_tensor_value_info("x", TP.FLOAT, [3, 2, 2])],
                     [h.make_tensor_value_info("y", TP.FLOAT, None)])
    src = tmp_path / "u.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), src)
    assert_one_line_error(*run("convert", src, tmp_path / "o.mnn"), "Einsum (ein1, ein2)", "Det (det1)")
    assert not (tmp_path / "o.mnn").exists()


@pytest.mark.parametrize("spec,needle", [("y:1x3x8x8", "'y'"), ("x:1x3x8", "rank"), ("x:1x4x8x8", "conflicts"),
                                         ("x:axb", "expected NAME")])
def test_wrong_input_shape(tmp_path, small_onnx, spec, needle):
    assert_one_line_error(*run("convert", small_onnx, tmp_path / "o.mnn", "--input-shape", spec), needle)
    assert not (tmp_path / "o.mnn").exists()


def test_verify_exit_codes(tmp_path, small_onnx):
    out = tmp_path / "m.mnn"
    assert run("convert", small_onnx, out, "--input-shape", "x:1x3x8x8")[0] == 0
    code, stdout, _ = run("verify", small_onnx, out, "--input-shape", "x:1x3x8x8", "--json")
    assert code == 0 and json.loads(stdout)["outputs"][0]["cosine"] > 0.9999
    half = tmp_path / "half.mnn"       # fp16 weights: outputs off by ~1e-4, above a --max-abs of 1e-30
    assert run("quant", out, half, "--fp16")[0] == 0
    code, _, _ = run("verify", small_onnx, half, "--input-shape", "x:1x3x8x8", "--max-abs", "1e-30")
    assert code == 1
    # a threshold no cosine can meet is a mistake, not a failing model (issue 49: ranges checked up front)
    assert_one_line_error(*run("verify", small_onnx, out, "--input-shape", "x:1x3x8x8", "--min-cosine", "1.01"),
                          "--min-cosine must be in [0, 1]")


def test_run_writes_outputs_and_bench_reports_json(tmp_path, small_onnx):
    out = tmp_path / "m.mnn"
    assert run("convert", small_onnx, out, "--input-shape", "x:1x3x8x8")[0] == 0
    x = np.random.RandomState(0).randn(1, 3, 8, 8).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    code, stdout, err = run("run", out, "--input", f"x={tmp_path / 'x.npy'}", "-o", tmp_path / "outs", "--json")
    assert code == 0, err
    y = np.load(tmp_path / "outs" / "y.npy")
    from tests.conftest import ort_run
    np.testing.assert_allclose(y, ort_run(small_onnx, {"x": x})["y"], rtol=1e-4, atol=1e-5)
    for backend, model in (("numba", out), ("mnn", out), ("onnxruntime", small_onnx)):
        code, stdout, err = run("bench", model, "--backend", backend, "--runs", "3", "--warmup", "1", "--json",
                                "--input-shape", "x:1x3x8x8")
        assert code == 0, err
        r = json.loads(stdout)
        for key in ("median_ms", "p90_ms", "mean_ms", "min_ms", "runs", "threads", "backend", "first_run_ms"):
            assert key in r
        assert r["backend"] == backend and r["runs"] == 3 and r["min_ms"] <= r["median_ms"] <= r["p99_ms"] + 1e-9
    code, stdout, _ = run("bench", out, "--profile", "--runs", "2", "--json")
    prof = json.loads(stdout)["profile"]
    assert {row["op"] for row in prof["op_types"]} >= {"Convolution"}
    assert abs(sum(row["percent"] for row in prof["ops"]) - 100) < 1e-6


def test_bench_and_run_bad_input(tmp_path, small_onnx):
    out = tmp_path / "m.mnn"
    assert run("convert", small_onnx, out, "--input-shape", "x:1x3x8x8")[0] == 0
    assert_one_line_error(*run("bench", out, "--backend", "onnxruntime"), "needs the source .onnx")
    code, stdout, err = run("bench", out, "--backend", "tpu", "--json")      # refused while parsing, listed
    assert code == 2 and "'tpu' is not one of" in err and "Traceback" not in err
    assert json.loads(stdout) == {"exit_code": 2, "error": "Invalid value for '--backend' / '-b': Value error, "
                                  "'tpu' is not one of 'numba', 'onnxruntime', 'openvino', 'mnn'."}
    np.save(tmp_path / "bad.npy", np.full((1, 3, 8, 8), np.nan, np.float32))
    assert_one_line_error(*run("run", out, "--input", f"x={tmp_path / 'bad.npy'}"), "NaN")
    np.save(tmp_path / "small.npy", np.zeros((1, 3, 4, 4), np.float32))
    assert_one_line_error(*run("run", out, "--input", f"x={tmp_path / 'small.npy'}"), "input 'x'")


def test_missing_output_directory_and_usage_errors(tmp_path, small_onnx):
    good = tmp_path / "m.mnn"
    assert run("convert", small_onnx, good, "--input-shape", "x:1x3x8x8")[0] == 0
    missing = tmp_path / "nope"
    assert_one_line_error(*run("convert", small_onnx, missing / "o.mnn"), "does not exist")
    assert_one_line_error(*run("quant", good, missing / "q.mnn", "--fp16"), "does not exist")
    assert_one_line_error(*run("info", good, "--dump-json", missing / "d.json"), "does not exist")
    assert not missing.exists()
    code, _, err = run("convert", small_onnx, good, "-O", "7")
    assert code == 2 and "Traceback" not in err
    code, _, err = run("no-such-command")
    assert code == 2 and "Traceback" not in err


def test_version_ops_and_pass_list_need_no_model():
    import subprocess
    import sys
    run = lambda *a: subprocess.run([sys.executable, "-m", "mnntool", *a], capture_output=True, text=True)  # noqa: E731
    v = run("--version")
    assert v.returncode == 0 and v.stdout.startswith("mnntool ")
    p = run("convert", "--passes", "list", "--json")
    assert p.returncode == 0 and "fold_batch_norm" in json.loads(p.stdout)["passes"]
    for fw, op in (("onnx", "Conv"), ("caffe", "Convolution"), ("tf", "Conv2D"), ("torch", "aten::conv2d"),
                    ("tflite", "CONV_2D")):
        o = run("ops", "--framework", fw, "--json")
        assert o.returncode == 0 and op in json.loads(o.stdout)["ops"], (fw, o.stderr)
    bad = run("ops", "--framework", "nope")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_json_errors_and_shared_options(tmp_path, small_onnx):
    """--json puts an error on stdout too; one option name per meaning; flags show no '<bool>' type."""
    code, stdout, err = run("convert", tmp_path / "none.onnx", tmp_path / "o.mnn", "--json")
    assert code == 2 and err.startswith("error:") and json.loads(stdout) == {
        "error": f"{tmp_path / 'none.onnx'}: no such file", "exit_code": 2}
    assert run("convert", tmp_path / "none.onnx", tmp_path / "o.mnn")[1] == ""      # no JSON without --json
    for cmd in ("verify", "quant"):
        helptext = run(cmd, "--help")[1]
        for opt in ("--samples", "--threads", "--input-shape", "--mean", "--std", "--normal", "--size", "--format"):
            assert opt in helptext, (cmd, opt)
        assert "<bool>" not in helptext and "--batches" not in helptext
    assert "<numba|mnn>" in run("verify", "--help")[1]


def test_install_hints_keep_their_extras():
    """Rich reads '[torch]' as markup; the CLI escapes messages so the hint prints as written."""
    code = ("import sys; from mnntool import cli; from mnntool.errors import MnnToolError\n"
            "def boom(**kw): raise MnnToolError(\"needs torch: pip install 'mnntool[torch]'\")\n"
            "cli.app = boom; cli.main()")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 2 and "pip install 'mnntool[torch]'" in p.stderr, p.stderr
