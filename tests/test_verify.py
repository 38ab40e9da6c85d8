"""verify: per-layer metrics, the first failing layer, exit codes, reports, both backends."""
import json

import numpy as np
import pytest

from mnntool import api
from mnntool.format import reader, writer
from mnntool.verifier import verify
from tests.test_cli import assert_one_line_error, run


@pytest.fixture(scope="module")
def resnet(fixture_model, tmp_path_factory):
    src = fixture_model("resnet18")
    dst = tmp_path_factory.mktemp("verify") / "r.mnn"
    api.convert(src, dst)
    return src, dst



def _corrupt_conv(mnn_path, index, tmp_path):
    """A copy of the model with half of the index-th convolution's weights negated: (path, that node)."""
    g = reader.load(mnn_path)
    victim = [n for n in g.nodes if n.op == "Convolution"][index]
    w = np.asarray(victim.param["weight"]).copy()
    w[: w.size // 2] *= -1.0
    victim.param["weight"] = w
    bad = tmp_path / "bad.mnn"
    writer.save(g, bad)
    return bad, victim

def test_correct_conversion_passes_every_layer(resnet):
    src, dst = resnet
    r = verify(src, dst)
    assert r["pass"] and r["first_failing"] is None
    assert len(r["layers"]) >= 30
    assert min(m["cosine"] for m in r["layers"]) >= 0.9999
    # fused-away tensors (conv outputs before BatchNorm/ReLU) are listed, not silently dropped
    assert r["unmatched"] and all("name" in u for u in r["unmatched"])


def test_corrupted_weight_is_caught_at_its_layer(resnet, tmp_path):
    src, dst = resnet
    bad, victim = _corrupt_conv(dst, 7, tmp_path)
    r = verify(src, bad)
    assert not r["pass"]
    assert r["first_failing"] == victim.outputs[0]
    names = [m["name"] for m in r["layers"]]
    before = names[: names.index(victim.outputs[0])]
    assert all(m["pass"] for m in r["layers"] if m["name"] in before)
    code, out, _ = run("verify", src, bad, "--json")
    assert code == 1 and json.loads(out)["first_failing"] == victim.outputs[0]


def test_mnn_backend_compares_layers_too(resnet):
    src, dst = resnet
    r = verify(src, dst, backend="mnn")
    assert r["backend"] == "mnn" and r["pass"] and len(r["layers"]) >= 30


def test_threshold_above_achievable_exits_1_and_report_is_written(resnet, tmp_path):
    src, dst = resnet
    report = tmp_path / "r.html"
    # --min-cosine 1.0: no float conversion is exact at every layer (above 1 is refused since issue 49)
    code, _, _ = run("verify", src, dst, "--min-cosine", "1.0", "--report", report)
    assert code == 1
    text = report.read_text()
    assert "FAIL" in text and "<svg" in text and "first failing" in text


def test_calib_folder_samples(resnet, tmp_path):
    src, dst = resnet
    for k in range(3):
        np.save(tmp_path / f"s{k}.npy", np.random.default_rng(k).standard_normal((1, 3, 224, 224)).astype(np.float32))
    code, out, err = run("verify", src, dst, "--calib", tmp_path, "--samples", "2", "--json")
    assert code == 0, err
    assert json.loads(out)["samples"] == 2


def test_bad_inputs_exit_2(resnet, tmp_path):
    src, dst = resnet
    assert_one_line_error(*run("verify", tmp_path / "missing.onnx", dst), "no such file")
    assert_one_line_error(*run("verify", dst, dst), "must be the original model")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_one_line_error(*run("verify", src, dst, "--calib", empty), "no samples in the folder")
    np.save(tmp_path / "wrong.npy", np.zeros((1, 3, 10, 10), np.float32))
    assert_one_line_error(*run("verify", src, dst, "--input", f"input={tmp_path / 'wrong.npy'}"), "input 'input'")


def test_caffe_source_per_layer_and_a_broken_layer_is_found(tmp_path):
    """Caffe sources run in OpenCV with every layer exposed, so verify names the broken layer."""
    pytest.importorskip("cv2")
    from fixtures.caffe_models import build
    from tests.conftest import CACHE
    proto = build("resnet18", CACHE)
    dst = tmp_path / "r.mnn"
    api.convert(proto, dst)
    r = verify(proto, dst)
    assert r["pass"] and len(r["layers"]) >= 20 and r["outputs"][0]["name"] == "fc1000"
    bad, victim = _corrupt_conv(dst, 5, tmp_path)
    r = verify(proto, bad)
    assert not r["pass"] and r["first_failing"] == victim.outputs[0]


@pytest.mark.parametrize("kind", ["torchscript", "tensorflow"])
def test_torchscript_and_tf_sources(tmp_path, kind):
    from tests.conftest import CACHE
    if kind == "torchscript":
        pytest.importorskip("torch")
        from fixtures.models import build_torchscript
        src, shape = build_torchscript("resnet18", CACHE), ["--input-shape", "x:1x3x224x224"]
    else:
        pytest.importorskip("tensorflow")
        from fixtures.tf_models import build
        src, shape = build("op_zoo", CACHE), []
    dst = tmp_path / "m.mnn"
    assert run("convert", src, dst, *shape)[0] == 0
    code, out, err = run("verify", src, dst, "--json", *shape)
    assert code == 0, err
    r = json.loads(out)
    assert r["pass"] and all(o["cosine"] >= 0.9999 for o in r["outputs"])


def test_html_report_escapes_names_and_has_every_section():
    from mnntool.verifier import html_report
    layer = lambda name, cos: {"name": name, "op": "Conv", "mnn_op": "Convolution", "cosine": cos,  # noqa: E731
                               "max_abs": 0.1, "rel_l2": 0.01, "snr_db": 40.0, "pass": cos >= 0.999}
    r = {"source": "m.onnx", "model": "<b>m</b>.mnn", "backend": "numba", "min_cosine": 0.999, "max_abs": None,
         "samples": 2, "layers": [layer("<script>alert(1)</script>", 1.0), layer("c2", 0.5)],
         "unmatched": [{"name": "fused_bn", "op": "BatchNormalization"}],
         "outputs": [{"name": "y", "cosine": 0.5, "max_abs": 1.0, "rel_l2": 0.5, "snr_db": 3.0, "pass": False}],
         "first_failing": "c2", "pass": False}
    page = html_report(r)
    assert "<script>" not in page and "&lt;script&gt;" in page and "&lt;b&gt;m&lt;/b&gt;.mnn" in page
    assert "layer (in execution order)" in page and "cosine vs source" in page       # axis labels
    assert "Final outputs" in page and ">y<" in page and "fused_bn" in page and "BatchNormalization" in page
    assert "First layer below the threshold: <b>c2</b>" in page and "None" not in page
    r.update(first_failing=None, layers=[layer("c1", 1.0)], unmatched=[], pass_=True)
    page = html_report(r)
    assert "Every matched layer meets the threshold" in page and "None" not in page


def test_samples_over_workers_give_the_single_process_numbers(resnet, tmp_path):
    """verify --calib over 3 samples: per-layer metrics from per-sample sums equal (1e-12) the metrics of
    all samples' tensors concatenated (compare.metrics), and 2 worker processes and Ray tasks give them
    bit for bit."""
    from mnntool.compare import metrics
    from mnntool.quant import QuantConfig, quantize_file
    from mnntool.verifier import _verify_one
    src, dst = resnet
    q = tmp_path / "w4.mnn"
    quantize_file(dst, q, QuantConfig(weight_bits=4))          # cosines below 1: the sums matter
    rng = np.random.default_rng(0)
    feeds = [{"input": rng.standard_normal((1, 3, 224, 224)).astype(np.float32)} for _ in range(3)]
    one = verify(src, q, feeds)
    two = verify(src, q, feeds, workers=2)
    assert json.dumps(one, sort_keys=True) == json.dumps(two, sort_keys=True)
    pytest.importorskip("ray")      # verify --ray local: the samples as Ray tasks
    assert json.dumps(verify(src, q, feeds, ray="local"), sort_keys=True) == json.dumps(one, sort_keys=True)
    assert one["samples"] == 3 and min(m["cosine"] for m in one["layers"]) < 0.9999
    pairs = [_verify_one(src, q, f, None, "numba", 0.999, None, None, False)[1:] for f in feeds]
    for m in one["layers"][::7] + one["outputs"]:
        ref = np.concatenate([np.ravel(r[m["name"]]) for r, _ in pairs])
        got = np.concatenate([np.ravel(o[m["name"]]) for _, o in pairs])
        want = metrics(ref, got)
        for k in ("cosine", "rel_l2", "max_abs"):
            assert abs(m[k] - want[k]) <= 1e-12 * max(1.0, abs(want[k])), (m["name"], k, m[k], want[k])
