"""TorchScript frontend: traced (and scripted) fixtures -> .mnn -> mnntool's runtime and the real MNN runtime,
compared with torch itself (cosine >= 0.9999, max abs <= 1e-3 x scale)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import mnntool  # noqa: E402
from mnntool import api  # noqa: E402
from tests.conftest import CACHE, assert_close, mnn_run  # noqa: E402
from tests.test_cli import assert_one_line_error, run  # noqa: E402

SHAPES = {"mobilenetv2": ("x", (1, 3, 224, 224)), "resnet18": ("x", (1, 3, 224, 224)), "bert": ("ids", (1, 128)),
          "lstm": ("x", (16, 1, 32))}


def _feeds(name):
    key, shape = SHAPES[name]
    rng = np.random.default_rng(4)
    x = rng.integers(0, 1000, shape) if name == "bert" else rng.standard_normal(shape).astype(np.float32)
    return key, x


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_traced_fixture_matches_torch_in_both_runtimes(tmp_path, name):
    from fixtures.models import build_torchscript
    src = build_torchscript(name, CACHE)
    key, x = _feeds(name)
    dst = tmp_path / f"{name}.mnn"
    api.convert(src, dst, input_shapes={key: x.shape})
    ref = torch.jit.load(str(src)).eval()(torch.from_numpy(x)).detach().numpy()
    ours = mnntool.load(dst).run({key: x})["output"]
    assert_close(ref, ours)
    theirs = mnn_run(dst, [key], ["output"], {key: x})["output"]
    assert_close(ref, theirs)


@pytest.mark.parametrize("name", ["resnet18", "mobilenetv2"])
def test_scripted_cnn(tmp_path, name):
    from fixtures.models import build_torchscript
    src = build_torchscript(name, CACHE, script=True)
    key, x = _feeds(name)
    dst = tmp_path / "s.mnn"
    api.convert(src, dst, input_shapes={key: x.shape})
    ref = torch.jit.load(str(src)).eval()(torch.from_numpy(x)).detach().numpy()
    assert_close(ref, mnntool.load(dst).run({key: x})["output"])


def test_missing_input_shape_and_unsupported_ops(tmp_path):
    class Odd(torch.nn.Module):
        def forward(self, x):
            return torch.cumsum(torch.fft.fft(x).real, 0)
    m = torch.jit.trace(Odd(), (torch.randn(4),))
    path = tmp_path / "odd.pt"
    m.save(str(path))
    assert_one_line_error(*run("convert", path, tmp_path / "o.mnn"), "--input-shape")
    assert_one_line_error(*run("convert", path, tmp_path / "o.mnn", "--input-shape", "x:4"), "unsupported TorchScript")
    assert not (tmp_path / "o.mnn").exists()
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a zip")
    assert_one_line_error(*run("convert", bad, tmp_path / "o.mnn", "--input-shape", "x:4"), "not a TorchScript")
