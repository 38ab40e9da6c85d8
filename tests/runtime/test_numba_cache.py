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
