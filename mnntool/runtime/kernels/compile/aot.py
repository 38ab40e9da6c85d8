"""The ahead-of-time kernel library: every kernel a one-thread session needs, compiled once for this CPU
into a Python extension module (`aot_build.py`, with Numba's pycc), so that loading a model and its
first run import no Numba (~0.5 s with its cache) and compile nothing.

The library sits in the kernel cache directory, named for this CPU (`host.fingerprint`) and the kernel
sources (a hash of their text: an edited kernel is not run from an old library). Beside it a JSON table
maps each kernel name and argument-type key (`type_key`) to the module's function. MNNTOOL_AOT=0 turns
it off (every kernel through Numba, as before).
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
from pathlib import Path

import numpy as np

from .host import fingerprint

MODULE = "_mnntool_kernels"
_KERNELS = Path(__file__).resolve().parents[1]      # runtime/kernels: every kernel source is under it


def _dtype_token(dt: np.dtype) -> str:
    return dt.str[1:]       # "f4", "i8", "u1": the byte order is the host's


# tuple element types -> token, for tuples of floats and NumPy numbers (an epilogue's 9 float32s took ~10 us
# a call: every kernel of every new plan binds by its arguments' types at its first run)
_TUPLES: dict = {}


# (dtype, ndim, flags bits) -> an array's token: every kernel of a new plan binds by its arguments' types at
# its first run (~1.6 us an array from its flags, 0.4 from here; a shape of EfficientNet-B0 binds ~900)
_ARRAYS: dict = {}


def _array_token(a: np.ndarray) -> str:
    flags = a.flags
    if not flags.aligned or a.dtype.byteorder not in "=|":
        return "?"
    layout = "C" if flags.c_contiguous else "F" if flags.f_contiguous else "A"
    return f"{_dtype_token(a.dtype)}:{a.ndim}{layout}{'' if flags.writeable else 'r'}"


def _token(a) -> str:
    t = type(a)
    if t is np.ndarray:
        key = (a.dtype, a.ndim, a.flags.num)    # (flags.num: the contiguity, alignment and writeable bits)
        token = _ARRAYS.get(key)
        if token is None:
            token = _array_token(a)
            if len(_ARRAYS) < 4096:
                _ARRAYS[key] = token
        return token
    if t is bool:
        return "b"
    if t is int:
        return "i" if -(1 << 63) <= a < (1 << 63) else "?"
    if t is float:
        return "d"
    if t is tuple:
        kinds = tuple(map(type, a))
        token = _TUPLES.get(kinds)
        if token is None:
            token = "(" + ",".join(_token(x) for x in a) + ")"
            if all(k is float or k is bool or issubclass(k, (np.number, np.bool_)) for k in kinds):
                _TUPLES[kinds] = token      # these elements' tokens are their types'
        return token
    if isinstance(a, np.generic) and not isinstance(a, (np.void, np.object_)):
        return "s" + _dtype_token(a.dtype)
    if a is None:
        return "n"
    return "?"


def type_key(args: tuple) -> str:
    """The argument types as the library names them (Numba's typeof, in short): arrays "f4:3C" (dtype,
    dims, layout, "r" read-only), "i" int, "d" float, "b" bool, "sf4" a NumPy scalar, "(...)" a tuple.
    "?" marks a type the library never holds (an unaligned array, say)."""
    out = []
    for a in args:      # arrays and ints inline (~90 kernels bind at each new input shape's first run)
        t = type(a)
        if t is np.ndarray:
            token = _ARRAYS.get((a.dtype, a.ndim, a.flags.num))
            out.append(_token(a) if token is None else token)
        elif t is int and -(1 << 63) <= a < (1 << 63):
            out.append("i")
        else:
            out.append(_token(a))
    return ",".join(out)


def split_key(key: str) -> list[str]:
    """A key's argument tokens (commas inside a tuple's parentheses do not split)."""
    out, depth, cur = [], 0, ""
    for ch in key:
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
            continue
        depth += (ch == "(") - (ch == ")")
        cur += ch
    if cur:
        out.append(cur)
    return out


def enabled() -> bool:
    return os.environ.get("MNNTOOL_AOT", "1") != "0"


def source_stamp() -> str:
    """A hash of the kernel sources' text: the library is for exactly these kernels."""
    h = hashlib.sha256()
    for p in sorted(_KERNELS.rglob("*.py")):
        h.update(p.relative_to(_KERNELS).as_posix().encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def cache_dir() -> Path:
    """Where the library lives: MNNTOOL_AOT_DIR, else under NUMBA_CACHE_DIR when set (runtime/__init__
    sets it for a read-only install), else beside the kernels."""
    if os.environ.get("MNNTOOL_AOT_DIR"):
        return Path(os.environ["MNNTOOL_AOT_DIR"])
    env = os.environ.get("NUMBA_CACHE_DIR")
    return Path(env) / "mnntool-aot" if env else _KERNELS / "__pycache__" / "aot"


def library_paths() -> tuple[Path, Path]:
    """This CPU's and these sources' library, and its table."""
    base = cache_dir() / f"{MODULE}-{fingerprint()}-{source_stamp()}"
    return Path(str(base) + importlib.machinery.EXTENSION_SUFFIXES[0]), Path(str(base) + ".json")


class Library:
    """The loaded library: its table name -> key -> function."""

    def __init__(self, path: Path, table_path: Path):
        table = json.loads(table_path.read_text())
        loader = importlib.machinery.ExtensionFileLoader(MODULE, str(path))
        spec = importlib.util.spec_from_file_location(MODULE, str(path), loader=loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        self.path, self.module = path, module
        self.table = {name: {key: getattr(module, symbol) for key, symbol in keys.items()}
                      for name, keys in table["kernels"].items()}


_LOADED: list = []      # [Library or None], once a process


def library() -> Library | None:
    if not _LOADED:
        lib = None
        if enabled():
            path, table = library_paths()
            if path.exists() and table.exists():
                try:
                    lib = Library(path, table)
                except (OSError, ImportError, ValueError, KeyError, AttributeError) as e:
                    print(f"mnntool: {path}: the kernel library does not load ({e}); kernels compile with "
                          f"Numba", file=sys.stderr)
        _LOADED.append(lib)
    return _LOADED[0]


_RECORD = os.environ.get("MNNTOOL_RECORD_KERNELS")
_RECORDED: set = set()


def _save_record():
    """Adds this process's (kernel, key) pairs to the MNNTOOL_RECORD_KERNELS file (how the manifest is
    made: aot_build.py)."""
    if _RECORDED:
        with open(_RECORD, "a", encoding="utf-8") as f:
            f.writelines(f"{name} {key}\n" for name, key in sorted(_RECORDED))


if _RECORD:
    import atexit
    atexit.register(_save_record)


def lookup(kernel, key: str):
    """The library's function for `kernel` (a JitFunction; a parallel one as its serial twin) at the
    argument types `key`, or None."""
    name = kernel.serial().name
    if _RECORD and "?" not in key and len(split_key(key)) >= kernel.py_func.__code__.co_argcount:
        # (a call leaving a default out has no entry: the library's functions take every argument)
        _RECORDED.add((name, key))
    lib = library()
    if lib is None:
        return None
    keys = lib.table.get(name)
    return keys.get(key) if keys else None
