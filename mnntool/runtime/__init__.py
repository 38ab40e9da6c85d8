"""The runtime: prepare (plan) and execute. Importing it makes sure Numba can cache its kernels."""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path


def choose_numba_cache(package_dir: Path | None = None) -> str | None:
    """Numba caches compiled kernels beside their source; in a read-only install (containers, CI images)
    that fails with "cannot cache function ... no locator available". Then the cache goes to the user's
    cache directory, else the temp directory, with a one-line note. Returns the directory chosen, or
    None when the package directory works or the user set NUMBA_CACHE_DIR."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return None
    package_dir = package_dir or Path(__file__).resolve().parent / "kernels"
    if os.access(package_dir, os.W_OK):
        return None
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    for cand in (base / "mnntool" / "numba", Path(tempfile.gettempdir()) / f"mnntool-numba-{os.getuid()}"):
        try:
            cand.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(cand, os.W_OK):
            os.environ["NUMBA_CACHE_DIR"] = str(cand)
            if "numba" in sys.modules:          # read at import: tell the loaded config too
                import numba
                numba.config.CACHE_DIR = str(cand)
            print(f"mnntool: {package_dir} is read-only; compiled kernels are cached in {cand}", file=sys.stderr)
            return str(cand)
    return None


def kernels_compiled(cache: Path | None = None) -> bool:
    """Whether Numba has cached any of the runtime's kernels (in `cache`, NUMBA_CACHE_DIR or beside the
    kernels): false on the first run after an install, when every kernel compiles (~20 s)."""
    if cache is None:
        env = os.environ.get("NUMBA_CACHE_DIR")
        # beside the kernels: each sub-package's __pycache__ (ops/, micro/, compile/)
        cache = Path(env) if env else Path(__file__).resolve().parent / "kernels"
    try:
        return next(cache.rglob("*.nbi"), None) is not None
    except OSError:
        return True     # unreadable: say nothing rather than guess


_ANNOUNCED = []


def announce_first_compile(cache: Path | None = None) -> bool:
    """One line on stderr, once a process, when the kernels are about to compile for the first time."""
    if _ANNOUNCED or kernels_compiled(cache):
        return False
    _ANNOUNCED.append(True)
    print("mnntool: first run of this install: compiling the runtime's kernels for this CPU (about 20 s, "
          "cached for later runs; `mnntool compile-kernels` builds the one-thread kernels ahead of time)",
          file=sys.stderr, flush=True)
    return True


choose_numba_cache()
