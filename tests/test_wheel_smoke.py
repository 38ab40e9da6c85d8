"""The package as a user gets it: `python -m build` (the sdist, then the wheel built from it), installed
into a clean venv with no extras, converts, quantizes, runs and benches a model from there.

Why: the suite runs in an editable install with every extra, which hides what only a wheel shows: a data
file the wheel lacks (package-data), a base command importing an extra, a dependency the base install
pulls without need, a version written in two places. Everything here runs the venv's own `mnntool`
from a folder outside the repository, so the checkout cannot stand in for the installed package.

Cost: ~55 s of CPU in all (AMD EPYC): the build ~4 s, the install ~4 s (from the configured index or
pip's cache: the same packages the Makefile installs), the commands the rest, most of it the fresh
install's first kernel compile.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import numpy as np
import pytest

from mnntool import MNN_FORMAT_VERSION, __version__
from tests.conftest import assert_close, mnn_run, ort_run, save_onnx

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _name(requirement: str) -> str:
    """The distribution a requirement names, normalised (PEP 503): "typer>=0.29,<1" -> "typer"."""
    from packaging.requirements import Requirement
    return Requirement(requirement).name.lower().replace("_", "-").replace(".", "-")


def _check(cmd, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, **kw)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))} -> {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """sdist and wheel, built from a copy of the sources (the build writes egg-info and build/ beside
    them, and a checkout's __pycache__ holds Numba's caches and the ahead-of-time kernel library)."""
    top = tmp_path_factory.mktemp("wheel")
    src = top / "src"
    src.mkdir()
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / f, src / f)
    shutil.copytree(ROOT / "mnntool", src / "mnntool", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    _check([sys.executable, "-m", "build", "--outdir", top / "dist", src], cwd=top)
    return top / "dist"


@pytest.fixture(scope="module")
def venv(dist, tmp_path_factory) -> Path:
    """A venv of its own (no system site-packages, no pip: this venv's pip installs into it with
    --python, so the venv holds exactly what `pip install mnntool` brings)."""
    env = tmp_path_factory.mktemp("venv") / "base"
    _check([sys.executable, "-m", "venv", "--without-pip", env])
    wheel, = dist.glob("*.whl")
    _check([sys.executable, "-m", "pip", "--python", env / "bin" / "python", "install", "--no-compile",
            "--disable-pip-version-check", "-q", wheel])
    return env


def _user_env(venv: Path) -> dict:
    """The environment a user's shell gives the venv's commands: no PYTHONPATH or VIRTUAL_ENV of the
    suite's, no Numba cache or ahead-of-time library of the checkout's (NUMBA_*, MNNTOOL_AOT*: the fresh
    install compiles its own); the strict-kernel switches the suite sets stay on (a kernel failing to
    prepare in the installed package is an error, not a silent fallback)."""
    keep = ("MNNTOOL_CHECK_KERNELS", "MNNTOOL_STRICT_KERNELS")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
           and not (k.startswith(("NUMBA_", "MNNTOOL_")) and k not in keep)}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def test_the_wheel_holds_the_package(dist):
    """One version (mnntool/_version.py) in the file names and METADATA; the base requirements are
    pyproject's; every file of the package's sources is in the wheel (a data file missing from
    package-data fails here, not on a user's machine)."""
    wheel, = dist.glob("*.whl")
    sdist, = dist.glob("*.tar.gz")
    assert wheel.name == f"mnntool-{__version__}-py3-none-any.whl" and sdist.name == f"mnntool-{__version__}.tar.gz"
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = z.read(f"mnntool-{__version__}.dist-info/METADATA").decode()
    assert f"\nVersion: {__version__}\n" in meta
    base = {_name(line.split(":", 1)[1]) for line in meta.splitlines()
            if line.startswith("Requires-Dist:") and "extra ==" not in line}
    assert base == {_name(r) for r in PYPROJECT["project"]["dependencies"]}
    src = dist.parent / "src"       # the copy it was built from (the checkout may change meanwhile)
    sources = {p.relative_to(src).as_posix() for p in (src / "mnntool").rglob("*")
               if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}
    assert sources - names == set()
    assert not [n for n in names if "__pycache__" in n or n.endswith((".nbi", ".nbc", ".so"))]


def test_base_install_pulls_no_extra(venv):
    """`pip install mnntool` brings the base requirements and what they need, none of an extra's
    packages (onnxruntime, mnn, torch, ...): the base commands run without them (next test)."""
    r = _check([venv / "bin" / "python", "-c",
                "import importlib.metadata as m; print('\\n'.join(d.metadata['Name'] for d in m.distributions()))"],
               cwd=venv)
    installed = {_name(n) for n in r.stdout.split()}
    extras = {_name(req) for reqs in PYPROJECT["project"]["optional-dependencies"].values() for req in reqs
              if not req.startswith("mnntool")}
    assert {_name(r) for r in PYPROJECT["project"]["dependencies"]} | {"mnntool"} <= installed
    assert installed & extras == set(), installed & extras


def _model(folder: Path) -> Path:
    """Three 3x3 convolutions with ReLU, a global average and a linear head: the three convolutions are
    quantized to int8 (the third writes float for the average: quant/ptq.int8_before_average), the head,
    which feeds an output, stays float."""
    from onnx import TensorProto, helper, numpy_helper
    r = np.random.RandomState(0)

    def const(name, *shape, scale):
        return numpy_helper.from_array((r.randn(*shape) * scale).astype(np.float32), name)
    inits = [const("w1", 16, 3, 3, 3, scale=0.3), const("b1", 16, scale=0.1),
             const("w2", 16, 16, 3, 3, scale=0.12), const("b2", 16, scale=0.1),
             const("w3", 16, 16, 3, 3, scale=0.12), const("b3", 16, scale=0.1),
             const("w4", 16, 10, scale=0.3), const("b4", 10, scale=0.1)]
    nodes = []
    for i, src in ((1, "x"), (2, "r1"), (3, "r2")):
        nodes += [helper.make_node("Conv", [src, f"w{i}", f"b{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
    nodes += [helper.make_node("GlobalAveragePool", ["r3"], ["p"]), helper.make_node("Flatten", ["p"], ["f"]),
              helper.make_node("MatMul", ["f", "w4"], ["m"]), helper.make_node("Add", ["m", "b4"], ["y"])]
    g = helper.make_graph(nodes, "smoke", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], initializer=inits)
    save_onnx(g, folder / "model.onnx")
    (folder / "calib").mkdir()
    for i in range(8):
        np.save(folder / "calib" / f"{i}.npy", r.rand(1, 3, 16, 16).astype(np.float32))
    np.save(folder / "x.npy", r.rand(1, 3, 16, 16).astype(np.float32))
    return folder / "model.onnx"


def test_convert_quant_run_bench_from_the_wheel(venv, tmp_path):
    """The base commands, run from the clean venv in a folder outside the repository; their outputs
    checked in this (full) venv against onnxruntime and the MNN runtime. Tolerances (max |diff| as a
    fraction of the output's largest magnitude): the float file as the converter's tests hold it (cosine
    >= 0.99999, 1e-4); against the float ONNX model the int8 file (measured cosine 0.99998, 1.1e-2 here;
    asked >= 0.999, 5e-2) and the int4 one (per-channel 4-bit weights of 27 to 144 inputs: measured
    0.981, 0.28; asked >= 0.95, 0.5); MNN running both quantized files as mnntool's runtime does
    (measured cosine 1 - 1e-14, 2e-7; asked >= 0.99999, 1e-4)."""
    onnx_path, env = _model(tmp_path), _user_env(venv)
    mnntool = venv / "bin" / "mnntool"

    def cli(*args):
        return _check([mnntool, *args], cwd=tmp_path, env=env).stdout

    v = cli("--version").strip()
    assert v == f"mnntool {__version__} (writes MNN format {MNN_FORMAT_VERSION})"
    where = _check([venv / "bin" / "python", "-c", "import mnntool; print(mnntool.__file__)"], cwd=tmp_path, env=env)
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout

    report = json.loads(cli("convert", onnx_path, "model.mnn", "--json"))
    assert report["size_bytes"] == (tmp_path / "model.mnn").stat().st_size
    q8 = json.loads(cli("quant", "model.mnn", "int8.mnn", "--int8", "--calib", "calib", "--json"))
    q4 = json.loads(cli("quant", "model.mnn", "int4.mnn", "--weight-bits", "4", "--json"))
    assert [layer["int8"] for layer in q8["layers"]] == [True, True, True, False], q8["layers"]
    assert q4["mode"] == "weight-int4"
    size = {name: (tmp_path / f"{name}.mnn").stat().st_size for name in ("model", "int8", "int4")}
    assert size["int8"] < size["model"] / 2 and size["int4"] < size["model"] / 3, size
    info = json.loads(cli("info", "int4.mnn", "--json"))
    assert info["inputs"] == [{"name": "x", "shape": [1, 3, 16, 16], "dtype": "float32"}]

    x = np.load(tmp_path / "x.npy")
    ref = ort_run(onnx_path, {"x": x})["y"]
    got = {}
    for name in ("model", "int8", "int4"):
        out = json.loads(cli("run", f"{name}.mnn", "-i", "x=x.npy", "-o", f"out_{name}", "--json"))
        assert [o["name"] for o in out["outputs"]] == ["y"]
        got[name] = np.load(tmp_path / f"out_{name}" / "y.npy")
    assert_close(ref, got["model"], min_cos=0.99999, rel_abs=1e-4)
    assert_close(ref, got["int8"], min_cos=0.999, rel_abs=0.05)
    assert_close(ref, got["int4"], min_cos=0.95, rel_abs=0.5)
    for name in ("int8", "int4"):
        assert_close(mnn_run(tmp_path / f"{name}.mnn", ["x"], ["y"], {"x": x})["y"], got[name], min_cos=0.99999,
                     rel_abs=1e-4)

    bench = json.loads(cli("bench", "int8.mnn", "--runs", "3", "--warmup", "1", "--json"))
    assert bench["backend"] == "numba" and bench["runs"] == 3 and 0 < bench["min_ms"] <= bench["median_ms"]

    # the extras' errors: one line naming the extra, exit 2
    r = subprocess.run([mnntool, "verify", onnx_path, "model.mnn"], cwd=tmp_path, env=env, capture_output=True,
                       text=True)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1] == (
        "error: running the source .onnx needs onnxruntime: pip install 'mnntool[onnxruntime]'"), r.stderr


def test_files_carry_the_format_version(tmp_path):
    """What `--version` says the writer writes is what MNN reads back as the model's version
    (Interpreter.getModelVersion, where MNN's converter stores its own release)."""
    import MNN
    import mnntool
    from onnx import TensorProto, helper
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    save_onnx(g, tmp_path / "m.onnx")
    mnntool.convert(tmp_path / "m.onnx", tmp_path / "m.mnn")
    assert MNN.Interpreter(str(tmp_path / "m.mnn")).getModelVersion() == MNN_FORMAT_VERSION
