"""A read-only install still runs: Numba's cache moves to a writable directory (in a fresh process, with
the package's kernel directory simulated read-only through choose_numba_cache's argument)."""
import os
import subprocess
import sys


def test_read_only_package_dir_moves_the_cache(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    code = f"""
import os, pathlib
os.access = lambda p, mode, _a=os.access: False if str(p) == {str(ro)!r} else _a(p, mode)
from mnntool.runtime import choose_numba_cache
os.environ.pop("NUMBA_CACHE_DIR", None)
chosen = choose_numba_cache(pathlib.Path({str(ro)!r}))
print(chosen)
print(os.environ["NUMBA_CACHE_DIR"] == chosen)
"""
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    env.pop("NUMBA_CACHE_DIR", None)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    lines = done.stdout.strip().splitlines()
    assert lines[-2] == str(tmp_path / "cache" / "mnntool" / "numba") and lines[-1] == "True", done.stderr
    assert "read-only" in done.stderr


def test_writable_package_dir_keeps_numba_default(tmp_path):
    from mnntool.runtime import choose_numba_cache
    saved = os.environ.pop("NUMBA_CACHE_DIR", None)
    try:
        assert choose_numba_cache(tmp_path) is None
    finally:
        if saved is not None:
            os.environ["NUMBA_CACHE_DIR"] = saved


def test_first_compile_is_announced_once(tmp_path, capsys):
    """With no cached kernel (a fresh install) the first prepare says so on stderr, once a process;
    with one it says nothing."""
    from mnntool import runtime
    empty, warm = tmp_path / "empty", tmp_path / "warm"
    empty.mkdir()
    (warm / "sub").mkdir(parents=True)
    (warm / "sub" / "kernel.py311.nbi").write_bytes(b"")
    saved = list(runtime._ANNOUNCED)
    runtime._ANNOUNCED.clear()
    try:
        assert runtime.kernels_compiled(warm) and not runtime.kernels_compiled(empty)
        assert not runtime.announce_first_compile(warm)
        assert runtime.announce_first_compile(empty)
        assert not runtime.announce_first_compile(empty)
        err = capsys.readouterr().err
        assert err.count("mnntool: first run") == 1 and "compiling" in err
    finally:
        runtime._ANNOUNCED[:] = saved
