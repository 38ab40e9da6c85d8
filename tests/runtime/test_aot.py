"""The ahead-of-time kernel library (kernels/aot.py): its type keys name what Numba's typeof names, the
host's features read from /proc/cpuinfo are LLVM's, and a library built from what a model asks for
runs that model with no Numba in the process, giving the same outputs as Numba's kernels (bit for bit:
the same code, compiled once more)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mnntool.runtime.kernels.compile import aot, aot_build, jit
from mnntool.runtime.kernels.compile.host import host_features

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("value", [
    np.zeros((3, 4), np.float32), np.zeros(5, np.int64), np.zeros((2, 3, 4), np.float32)[:, 1],
    np.zeros((4, 3), np.float32).T, np.zeros((2, 2), np.uint8), 3, 2.5, True, np.float32(1.5), np.int32(2),
    (np.float32(1), np.float32(2)), (1, 2.0), (np.zeros(2, np.float32), 4), None])
def test_type_key_names_numbas_typeof(value):
    import numba
    from numba.core.typing.typeof import Purpose
    assert aot_build.numba_type(aot.type_key((value,))) == numba.typeof(value, Purpose.argument)


def test_read_only_arrays_have_their_own_key():
    import numba
    a = np.zeros(4, np.float32)
    a.flags.writeable = False
    assert aot.type_key((a,)) == "f4:1Cr"
    assert aot_build.numba_type("f4:1Cr") == numba.typeof(a)


def test_host_features_are_llvms():
    import llvmlite.binding as llvm
    llvm_has = {f[1:] for f in llvm.get_host_cpu_features().flatten().split(",") if f.startswith("+")}
    for feature in ("avx2", "fma", "avx512f", "avx512bw", "avx512vnni"):
        assert (feature in host_features()) == (feature in llvm_has), feature


def test_a_bound_call_site_refuses_other_types(monkeypatch):
    from mnntool.runtime.kernels import sized
    from mnntool.runtime.kernels.micro.conv_loops import bias_act
    from mnntool.runtime.kernels.micro.epilogue import NO_GRID, RELU6
    monkeypatch.setattr(jit, "CHECK", True)
    fn = sized(bias_act, 10, 1)
    y, b = np.ones((2, 3), np.float32), np.zeros(2, np.float32)
    fn(y, b, RELU6, NO_GRID)
    with pytest.raises(TypeError, match="bound to"):
        fn(y.astype(np.float64), b, RELU6, NO_GRID)


_RUN = """
import sys, json, numpy as np
from pathlib import Path
from mnntool.runners import backend_runner
from mnntool.inputs import random_feeds
r = backend_runner(Path(sys.argv[1]), "numba", 1, None)
outs = r.run(random_feeds(r.graph, None))
np.savez(sys.argv[2], *[np.asarray(o) for o in outs.values()])
from mnntool.runtime.kernels.compile import aot
print(json.dumps({"numba": "numba" in sys.modules, "llvmlite": "llvmlite" in sys.modules,
                  "library": aot.library() is not None}))
"""


def _run(model: Path, out: Path, **env) -> dict:
    full = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    done = subprocess.run([sys.executable, "-c", _RUN, str(model), str(out)], env=full, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="pycc needs a C compiler")
def test_a_library_runs_a_model_without_numba(tmp_path, fixture_model, monkeypatch):
    from typer.testing import CliRunner

    from mnntool.cli import app
    model = fixture_model("lstm")
    record = tmp_path / "kernels.txt"
    jit_run = _run(model, tmp_path / "jit.npz", MNNTOOL_AOT="0", MNNTOOL_RECORD_KERNELS=str(record))
    assert jit_run["numba"] and not jit_run["library"]
    assert record.read_text().strip(), "the model asked for no kernel"
    # the CLI builds what the model asked for into tmp_path
    monkeypatch.setattr(aot_build, "MANIFEST", record)
    monkeypatch.setenv("MNNTOOL_AOT_DIR", str(tmp_path / "lib"))
    result = CliRunner().invoke(app, ["compile-kernels", "--json"])
    assert result.exit_code == 0, result.output
    built = json.loads(result.output.strip().splitlines()[-1])
    assert built["built"] and built["kernels"] == len(aot_build.read_manifest(record))
    again = json.loads(CliRunner().invoke(app, ["compile-kernels", "--json"]).output.strip().splitlines()[-1])
    assert not again["built"]
    aot_run = _run(model, tmp_path / "aot.npz", MNNTOOL_AOT_DIR=str(tmp_path / "lib"))
    assert aot_run["library"] and not aot_run["numba"] and not aot_run["llvmlite"]
    a, j = np.load(tmp_path / "aot.npz"), np.load(tmp_path / "jit.npz")
    assert list(a) == list(j)
    for k in a:
        np.testing.assert_array_equal(a[k], j[k])


def test_every_manifest_entry_names_a_kernel_and_all_its_arguments():
    from mnntool.runtime.kernels.compile.aot import split_key
    entries = aot_build.read_manifest()
    assert len(entries) >= 50
    for name, key in entries:
        kern = aot_build.kernel_named(name)
        assert len(split_key(key)) == kern.py_func.__code__.co_argcount, (name, key)
        aot_build.signature(key)        # every token names a Numba type


_RECORD = """
import sys
from pathlib import Path
from mnntool.runners import backend_runner
from mnntool.inputs import random_feeds
for path in sys.argv[1:]:
    r = backend_runner(Path(path), "numba", 1, None)
    r.run(random_feeds(r.graph, None))
"""


def test_the_manifest_holds_what_the_fixtures_ask_for(tmp_path, fixture_model):
    """A kernel change that gives a kernel new argument types (or a new kernel) must reach the manifest,
    else one-thread sessions import Numba again: MNNTOOL_RECORD_KERNELS=FILE, then merge (sort -u)."""
    record = tmp_path / "asked.txt"
    models = [str(fixture_model(m)) for m in ("mobilenetv2", "resnet18", "bert", "lstm")]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MNNTOOL_AOT": "0", "MNNTOOL_RECORD_KERNELS": str(record)}
    done = subprocess.run([sys.executable, "-c", _RECORD, *models], env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    asked = set(aot_build.read_manifest(record))
    missing = asked - set(aot_build.read_manifest())
    assert asked and not missing, sorted(missing)


def test_the_library_lives_with_numbas_cache_in_a_read_only_install(monkeypatch, tmp_path):
    """runtime/__init__ moves Numba's cache (NUMBA_CACHE_DIR) when the package directory is read-only;
    the library follows it, and MNNTOOL_AOT_DIR overrides both."""
    monkeypatch.delenv("MNNTOOL_AOT_DIR", raising=False)
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "nb"))
    lib, table = aot.library_paths()
    assert lib.parent == table.parent == tmp_path / "nb" / "mnntool-aot"
    assert aot.source_stamp() in lib.name and lib.name.startswith(aot.MODULE)
    monkeypatch.setenv("MNNTOOL_AOT_DIR", str(tmp_path / "x"))
    assert aot.library_paths()[0].parent == tmp_path / "x"


def test_no_c_compiler_is_one_line_and_no_library(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CC": str(tmp_path / "no-such-cc"),
           "MNNTOOL_AOT_DIR": str(tmp_path / "lib")}
    done = subprocess.run([sys.executable, "-m", "mnntool", "compile-kernels", "--json"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert "C compiler" in json.loads(done.stdout.strip().splitlines()[-1])["error"]
    assert "Traceback" not in done.stderr and "C compiler" in done.stderr
    assert not (tmp_path / "lib").exists() or not any((tmp_path / "lib").iterdir())
