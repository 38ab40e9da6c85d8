"""Builds the ahead-of-time kernel library (aot.py) with Numba's pycc: one exported function per
(kernel, argument types) of the manifest, each compiled with its kernel's own options (fastmath, error
model) minus `parallel` (the library is for one thread), for this CPU.

    python -m mnntool.runtime.kernels.compile.aot_build          # `mnntool compile-kernels` does the same

The manifest (aot_manifest.txt, "kernel key" lines) is what the test suite, the fixtures and the
benchmark zoo asked for at one thread, recorded with MNNTOOL_RECORD_KERNELS=FILE; a kernel at types it
lacks still runs, through Numba. pycc needs a C compiler: without one the build says so and sessions
keep compiling with Numba.
"""
from __future__ import annotations

import importlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from . import aot
from .aot import split_key
from .jit import JitFunction

MANIFEST = Path(__file__).resolve().parent / "aot_manifest.txt"


def read_manifest(path: Path | None = None) -> list[tuple[str, str]]:
    out = []
    for line in (path or MANIFEST).read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, key = line.split(" ", 1)
            out.append((name, key))
    return sorted(set(out))


def kernel_named(name: str) -> JitFunction:
    """The JitFunction `module.function` (a "_serial_np" name: the serial twin of the module's kernel)."""
    module, fn = name.rsplit(".", 1)
    mod = importlib.import_module(module if module.startswith("mnntool.") else f"mnntool.runtime.kernels.{module}")
    obj = getattr(mod, fn, None)
    if obj is None and fn.endswith("_serial_np"):
        obj = getattr(mod, fn[:-len("_serial_np")]).serial()
    if not isinstance(obj, JitFunction) or obj.serial().name != name:
        raise KeyError(f"{name}: no such kernel")
    return obj.serial()


def numba_type(token: str):
    """The Numba type a `type_key` token names."""
    import numpy as np
    from numba.core import types
    from numba.np.numpy_support import from_dtype
    if token.startswith("("):
        items = [numba_type(t) for t in split_key(token[1:-1])]
        if items and all(t == items[0] for t in items):
            return types.UniTuple(items[0], len(items))
        return types.Tuple(items)
    if ":" in token:
        dt, rest = token.split(":")
        readonly = rest.endswith("r")
        rest = rest.rstrip("r")
        return types.Array(from_dtype(np.dtype(dt)), int(rest[:-1]), rest[-1], readonly=readonly)
    if token.startswith("s"):
        return from_dtype(np.dtype(token[1:]))
    simple = {"i": types.int64, "d": types.float64, "b": types.boolean, "n": types.none}
    if token in simple:
        return simple[token]
    raise ValueError(f"type key token {token!r}")


def signature(key: str):
    """The argument types of `key`, the return type left to inference (some kernels return a flag)."""
    from numba.core.typing import signature as make
    return make(None, *(numba_type(t) for t in split_key(key)))


class BuildError(Exception):
    pass


def _remove_stale(lib_path: Path, table_path: Path) -> None:
    """This CPU's libraries for other kernel sources (an earlier version): nothing loads them again."""
    prefix = f"{aot.MODULE}-{lib_path.name.split('-')[1]}-"
    for old in lib_path.parent.glob(prefix + "*"):
        if old not in (lib_path, table_path) and not old.name.endswith(".tmp"):
            try:
                old.unlink()
            except OSError:
                pass


def build(entries: list[tuple[str, str]] | None = None, out: tuple[Path, Path] | None = None,
          quiet: bool = False, progress=None) -> dict:
    """Compiles `entries` (default: the manifest) into the library for this CPU and these sources (or
    `out`: the library's and its table's paths); written whole or not at all. progress(1) after each
    kernel compiles. Returns what it built (paths, counts, seconds)."""
    import warnings
    with warnings.catch_warnings():     # pycc is "pending deprecation" since Numba 0.57
        warnings.simplefilter("ignore")
        try:
            import numba.pycc.compiler as pycc_compiler
            from numba.pycc import CC
        except ImportError as e:
            raise BuildError(f"this Numba has no ahead-of-time compiler (numba.pycc): {e}") from None
    from numba.core.compiler import Flags

    entries = read_manifest() if entries is None else entries
    lib_path, table_path = out or aot.library_paths()
    lib_path.parent.mkdir(parents=True, exist_ok=True)
    build_dir = Path(tempfile.mkdtemp(prefix="mnntool-aot-"))
    t0 = time.perf_counter()
    try:
        try:
            cc = CC(aot.MODULE, source_module=__name__)        # checks that a C compiler works
        except RuntimeError as e:
            raise BuildError(f"pycc needs a working C compiler: {' '.join(str(e).split())[:300]}") from None
        cc.output_dir, cc.target_cpu, cc.verbose = str(build_dir), "host", False
        table: dict = {}
        kernel_of = {}      # the realized Python function pycc compiles -> its kernel (for its options)
        for i, (name, key) in enumerate(entries):
            kern = kernel_named(name)
            py = kern.dispatcher().py_func
            kernel_of[py] = kern
            symbol = f"k{i}"
            cc.export(symbol, signature(key))(py)
            table.setdefault(name, {})[key] = symbol
        original = pycc_compiler.compile_extra

        def compile_extra(typingctx, targetctx, func, args, return_type, flags, locals, **kw):
            kern = kernel_of[func]
            own = Flags()
            opts = {k: v for k, v in kern.dispatcher().targetoptions.items() if k != "parallel"}
            kern.dispatcher().targetdescr.options.parse_as_flags(own, opts)
            for attr in ("no_compile", "no_cpython_wrapper", "no_cfunc_wrapper", "nrt"):
                setattr(own, attr, getattr(flags, attr))
            result = original(typingctx, targetctx, func, args, return_type, own, locals, **kw)
            if progress:
                progress(1)
            return result

        pycc_compiler.compile_extra = compile_extra
        try:
            cc.compile()
        except Exception as e:      # the C compiler or linker pycc runs (distutils errors name no common base)
            if type(e).__module__.split(".")[0] in ("distutils", "setuptools") or isinstance(e, OSError):
                raise BuildError(f"pycc could not compile or link the library (is a C compiler installed?): "
                                 f"{' '.join(str(e).split())}") from None
            raise
        finally:
            pycc_compiler.compile_extra = original
        built = next(build_dir.glob(aot.MODULE + "*"))
        tmp_lib = lib_path.with_name(lib_path.name + f".{os.getpid()}.tmp")
        tmp_table = table_path.with_name(table_path.name + f".{os.getpid()}.tmp")
        try:
            shutil.copyfile(built, tmp_lib)
            tmp_table.write_text(json.dumps({"kernels": table, "entries": len(entries),
                                             "seconds": round(time.perf_counter() - t0, 1)}, indent=0))
            from ....interrupts import deferred
            with deferred():        # Ctrl-C waits for the pair: never a new table beside an old library
                os.replace(tmp_table, table_path)       # the table first: the library is what readers look for
                os.replace(tmp_lib, lib_path)
        finally:        # a failed copy or write leaves no partial file behind
            tmp_lib.unlink(missing_ok=True)
            tmp_table.unlink(missing_ok=True)
        _remove_stale(lib_path, table_path)
    finally:
        shutil.rmtree(build_dir, ignore_errors=True)
    seconds = time.perf_counter() - t0
    if not quiet:
        print(f"mnntool: built {len(entries)} kernels into {lib_path} in {seconds:.0f} s", file=sys.stderr)
    return {"library": str(lib_path), "table": str(table_path), "kernels": len(entries),
            "bytes": lib_path.stat().st_size, "seconds": round(seconds, 1)}


if __name__ == "__main__":
    build()
