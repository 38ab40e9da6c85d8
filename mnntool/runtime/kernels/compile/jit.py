"""Numba, imported only when a kernel must compile.

Importing Numba and loading its cache costs ~0.5 s (the import, its type registries, parsing cached
bitcode), seven times MNN's whole load+prepare of MobileNetV2. The kernel modules therefore decorate
with this module's `njit` and `intrinsic`, which record the function and its options and build nothing:
at one thread a kernel runs from the ahead-of-time library (`aot.py`, no Numba in the process), and
only a kernel the library lacks, or a parallel run, imports Numba and compiles (or loads from Numba's
cache) as before. The functions Numba compiles see the real objects: `realize` swaps each stand-in of
their globals and closure for its Numba counterpart.
"""
from __future__ import annotations

import importlib
import os
import types as pytypes

from . import aot      # (no Numba: Bound.bind's type keys and lookups, at every kernel's first call)


class LazyModule:
    """A module imported at its first attribute read (`types`, `numba` in the kernel modules)."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr):
        return getattr(self.real(), attr)

    def real(self):
        return importlib.import_module(self._name)


types = LazyModule("numba.core.types")
numba = LazyModule("numba")


def prange(*args):
    """range; Numba's prange in the code it compiles."""
    return range(*args)


class LazyIntrinsic:
    """`numba.extending.intrinsic(fn)`, made when a kernel calling it compiles."""

    def __init__(self, fn, options: dict):
        self.fn, self.options, self._real = fn, options, None

    def real(self):
        if self._real is None:
            from numba.extending import intrinsic as make
            self._real = make(**self.options)(self.fn) if self.options else make(self.fn)
        return self._real


def intrinsic(fn=None, **options):
    if fn is None:
        return lambda f: LazyIntrinsic(f, options)
    return LazyIntrinsic(fn, options)


KERNELS_PACKAGE = "mnntool.runtime.kernels."


def module_name(fn) -> str:
    """`micro.float_gemm.gemm`: the kernel's module (dotted, under runtime/kernels; a module elsewhere by its
    full name) and function, the name the ahead-of-time library exports it by."""
    mod = fn.__module__
    return f"{mod[len(KERNELS_PACKAGE):] if mod.startswith(KERNELS_PACKAGE) else mod}.{fn.__qualname__}"


class JitFunction:
    """A Numba kernel not built yet. Called from Python it runs the ahead-of-time library's entry for the
    argument types when the calling thread runs at one thread and the library has it, else Numba's
    dispatcher; `dispatcher()` is the Numba object, made (and Numba imported) on first need."""

    def __init__(self, py_func, options: dict):
        self.py_func, self.targetoptions = py_func, dict(options)
        self.name = module_name(py_func)
        self._dispatcher = None
        self._serial = None
        self.__doc__, self.__name__ = py_func.__doc__, py_func.__name__

    def __repr__(self):
        return f"<kernel {self.name}>"

    def dispatcher(self):
        if self._dispatcher is None:
            nb = numba.real()
            from ... import settings
            settings.numba_loaded()
            module_globals, fresh = realized_globals(self.py_func.__globals__)
            self._dispatcher = nb.njit(**self.targetoptions)(realized_function(self.py_func, module_globals))
            if fresh:
                fill_globals(module_globals, self.py_func.__globals__)
        return self._dispatcher

    def serial(self) -> JitFunction:
        """The same kernel without `parallel` (prange runs as range), under a name (and Numba cache) of
        its own, with NumPy's error model: Python's (Numba's default) checks every division for zero,
        and that check kept LLVM from vectorizing the loops (GELU on 4096 floats took 11.5 us serially
        against 4.1 in the parallel kernel on one thread; 2.4 us now)."""
        if not self.targetoptions.get("parallel"):
            return self
        if self._serial is None:
            py = self.py_func
            name = py.__name__ + "_serial_np"
            code = py.__code__.replace(co_name=name, co_qualname=py.__qualname__ + "_serial_np")
            twin = pytypes.FunctionType(code, py.__globals__, name, py.__defaults__, py.__closure__)
            twin.__qualname__, twin.__module__ = py.__qualname__ + "_serial_np", py.__module__
            opts = {k: v for k, v in self.targetoptions.items() if k not in ("parallel", "nopython")}
            opts.setdefault("error_model", "numpy")
            self._serial = JitFunction(twin, opts)
        return self._serial

    def __call__(self, *args):
        """A call from Python: a serial kernel runs the library's entry for these argument types (looked
        up each call, ~1-2 us: call sites that run every inference bind one with `Bound`); a parallel
        one Numba's dispatcher, at the session's thread count."""
        if not self.targetoptions.get("parallel") or _one_thread():
            from . import aot
            found = aot.lookup(self, aot.type_key(args))
            if found is not None:
                return found(*args)
        return self.dispatcher()(*args)

    def __getattr__(self, attr):        # signatures, compile, stats, ...: the dispatcher's
        if attr.startswith("__"):
            raise AttributeError(attr)
        return getattr(self.dispatcher(), attr)


def _one_thread() -> bool:
    """Whether the calling thread runs at one thread (its session said so, or none did)."""
    from ...settings import applied_threads
    return (applied_threads() or 1) <= 1


# tests set MNNTOOL_CHECK_KERNELS: every call of a Bound kernel checks its argument types
CHECK = bool(os.environ.get("MNNTOOL_CHECK_KERNELS"))


class Bound:
    """A kernel at one call site (a one-thread session's, or a serial twin's at any count), bound at its
    first call to the compiled code for that call's argument types: the library's entry, else Numba's
    dispatcher. Later calls skip the type lookup (as Numba's `compile` entries do), so the call site must
    pass the same types every time, which holds where prepare fixed the buffers; MNNTOOL_CHECK_KERNELS
    checks it (the tests set it)."""

    __slots__ = ("kernel", "fn", "key")

    def __init__(self, kernel: JitFunction):
        self.kernel, self.fn, self.key = kernel, None, None

    def __repr__(self):
        return f"<bound {self.kernel.name}>"

    def __call__(self, *args):
        fn = self.fn
        if fn is None or CHECK:
            fn = self.bind(args)
        return fn(*args)

    def bind(self, args: tuple, compiled: bool = False):
        """The code for `args`' types (for `compiled`, Numba's compiled entry rather than its dispatcher
        when the library lacks it); a different key than the first call's is a TypeError."""
        key = aot.type_key(args)
        if self.fn is not None:
            if key != self.key:
                raise TypeError(f"kernel {self.kernel.name} bound to ({self.key}) called with ({key})")
            return self.fn
        memo = (self.kernel, key, compiled, aot.library())
        fn = _BOUND.get(memo)
        if fn is None:
            fn = aot.lookup(self.kernel, key)
            if fn is None:
                fn = compiled_entry(self.kernel.dispatcher(), args) if compiled else self.kernel.dispatcher()
            if "?" not in key:      # ("?": types the key does not tell apart)
                _BOUND[memo] = fn
        self.fn, self.key = fn, key
        return fn


# (kernel, type key, compiled, library) -> the code Bound.bind found: every plan of a new input shape binds its kernels again
# at their first call (~90 a shape of EfficientNet-B0), mostly to the same code; one entry per kernel signature
_BOUND: dict = {}


def compiled_entry(dispatcher, args: tuple):
    """Numba's compiled code for `args`' types, called without its dispatcher's type resolution."""
    import numba
    from numba.core.typing.typeof import Purpose
    return dispatcher.compile(tuple(numba.typeof(a, Purpose.argument) for a in args))


def njit(fn=None, **options):
    if fn is None:
        return lambda f: JitFunction(f, options)
    return JitFunction(fn, options)


def realize(value):
    """The object Numba should see for `value`: dispatchers, intrinsics and modules for the stand-ins."""
    if isinstance(value, JitFunction):
        return value.dispatcher()
    if isinstance(value, LazyIntrinsic):
        return value.real()
    if isinstance(value, LazyModule):
        return value.real()
    if value is prange:
        return numba.real().prange
    return value


_GLOBALS: dict = {}


def realized_globals(module_dict: dict) -> tuple[dict, bool]:
    """The copy of a module's globals that Numba reads (as a dict, when it compiles), and whether it was
    just made: then the caller fills it (`fill_globals`) once its own dispatcher exists, as filling makes
    the dispatchers of the module's other kernels, which ask for the same dict."""
    key = id(module_dict)
    if key in _GLOBALS:
        return _GLOBALS[key], False
    out = _GLOBALS[key] = {}
    return out, True


def fill_globals(out: dict, module_dict: dict) -> None:
    for name, value in list(module_dict.items()):
        if name not in out:
            out[name] = realize(value)


def realized_function(py, module_globals: dict):
    """`py` reading `module_globals`, its closure cells realized; the same code, so Numba's cache finds
    its entries."""
    cells = py.__closure__ and tuple(pytypes.CellType(realize(c.cell_contents)) for c in py.__closure__)
    fn = pytypes.FunctionType(py.__code__, module_globals, py.__name__, py.__defaults__, cells)
    fn.__qualname__, fn.__module__, fn.__doc__ = py.__qualname__, py.__module__, py.__doc__
    fn.__kwdefaults__ = py.__kwdefaults__
    return fn

