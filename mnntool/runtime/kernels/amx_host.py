"""Whether this process may run Intel AMX tile instructions (issue 46: "use AMX where the host has it").

AMX needs three things: the CPU's `amx_tile` and `amx_int8` flags (/proc/cpuinfo), Numba compiling for
this host (not a portable NUMBA_CPU_NAME target), and Linux's permission. Linux keeps the 8 KB tile data
(XFEATURE_XTILEDATA, state component 18) out of a process's signal frames until the process asks for it
with arch_prctl(ARCH_REQ_XCOMP_PERM, 18); a tile instruction before that raises SIGILL. The request is
process-wide (every thread, OpenMP's workers included), made once here and checked with
ARCH_GET_XCOMP_PERM. MNNTOOL_AMX=0 turns the AMX kernels off (the VNNI path runs); anything else, or
unset, uses them where all three hold. `report()` says which and why (`bench --json`: "int8_kernel").
"""
from __future__ import annotations

import ctypes
import os
import platform
import threading

SYS_ARCH_PRCTL = 158            # x86-64
ARCH_GET_XCOMP_PERM = 0x1022
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18
FLAGS = ("amx_tile", "amx_int8")

_lock = threading.Lock()
_state: dict | None = None


def cpu_flags() -> frozenset:
    """/proc/cpuinfo's flags of the first CPU (empty where there is none)."""
    from .compile.host import _cpuinfo
    info = _cpuinfo()
    return frozenset(info[1].split()) if info else frozenset()


ENOSPC = 28
ALT_STACK = 1 << 18             # bytes of the signal stack put in place of a too-small one (`_grow_alt_stack`)


class _Stack(ctypes.Structure):
    _fields_ = [("ss_sp", ctypes.c_void_p), ("ss_flags", ctypes.c_int), ("ss_size", ctypes.c_size_t)]


def _grow_alt_stack(libc) -> bool:
    """Replace this thread's signal stack (faulthandler's, which pytest and `python -X faulthandler`
    install) by a larger one of the same use, when it is too small for the tile state Linux would put
    in a signal frame: the request fails with ENOSPC until then. The new stack is malloc'd and never
    freed (a signal may arrive until the process ends); faulthandler, finding another stack than its
    own at exit, leaves it. True when replaced."""
    cur = _Stack()
    if libc.sigaltstack(None, ctypes.byref(cur)) != 0 or not cur.ss_sp or cur.ss_flags & 3 or cur.ss_size >= ALT_STACK:
        return False        # none, disabled (2), in use now (1), or already large
    libc.malloc.restype = ctypes.c_void_p
    sp = libc.malloc(ctypes.c_size_t(ALT_STACK))
    if not sp:
        return False
    new = _Stack(sp, 0, ALT_STACK)
    return libc.sigaltstack(ctypes.byref(new), None) == 0


def request_tiles() -> tuple[bool, str]:
    """Ask Linux for the tile data state (arch_prctl), then read the permitted set back: (granted, why)."""
    if platform.system() != "Linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return False, f"not x86-64 Linux ({platform.system()} {platform.machine()})"
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        syscall = libc.syscall
        syscall.restype = ctypes.c_long

        def ask():
            return syscall(ctypes.c_long(SYS_ARCH_PRCTL), ctypes.c_long(ARCH_REQ_XCOMP_PERM),
                           ctypes.c_ulong(XFEATURE_XTILEDATA))
        rc = ask()
        grown = ""
        if rc != 0 and ctypes.get_errno() == ENOSPC and _grow_alt_stack(libc):
            rc, grown = ask(), f" after a {ALT_STACK >> 10} KB signal stack replaced a smaller one"
        if rc != 0:
            err = ctypes.get_errno()
            # ENOSPC: a thread's signal stack (sigaltstack: faulthandler's, pytest's) is too small for the
            # 8 KB of tile state a signal frame would then carry; Linux refuses rather than overflow it
            hint = "; a sigaltstack (faulthandler?) is too small for the tile state" if err == 28 else ""
            return False, f"arch_prctl(ARCH_REQ_XCOMP_PERM, 18) = {rc}, errno {err} ({os.strerror(err)}){hint}"
        mask = ctypes.c_uint64(0)
        rc = syscall(ctypes.c_long(SYS_ARCH_PRCTL), ctypes.c_long(ARCH_GET_XCOMP_PERM), ctypes.byref(mask))
        if rc != 0:
            err = ctypes.get_errno()
            return False, f"arch_prctl(ARCH_GET_XCOMP_PERM) = {rc}, errno {err} ({os.strerror(err)})"
        if not mask.value >> XFEATURE_XTILEDATA & 1:
            return False, f"tile data not in the permitted set ({mask.value:#x})"
        return True, f"granted (permitted xfeatures {mask.value:#x}){grown}"
    except (OSError, AttributeError) as e:
        return False, f"arch_prctl unavailable: {e}"


def _decide() -> dict:
    env = os.environ.get("MNNTOOL_AMX", "").strip()
    flags = cpu_flags()
    has = all(f in flags for f in FLAGS)
    out = {"amx": False, "cpu_flags": has, "env": env or None, "permission": None, "reason": ""}
    if env == "0":
        out["reason"] = "MNNTOOL_AMX=0"
    elif not has:
        out["reason"] = "no amx_tile/amx_int8 in /proc/cpuinfo"
    elif os.environ.get("NUMBA_CPU_NAME", "host") != "host":
        out["reason"] = "NUMBA_CPU_NAME is not host"
    else:
        granted, why = request_tiles()
        out["permission"] = why
        out["amx"] = granted
        out["reason"] = "AMX tiles" if granted else why
    return out


def state() -> dict:
    """The decision, made once per process (the env read then; `forget` to re-read in tests)."""
    global _state
    with _lock:
        if _state is None:
            _state = _decide()
        return _state


def available() -> bool:
    """Whether the int8 GEMMs may use AMX in this process (tile permission already granted)."""
    return state()["amx"]


def forget() -> None:
    """Drop the cached decision (tests that flip MNNTOOL_AMX)."""
    global _state
    with _lock:
        _state = None


def report() -> dict:
    """The int8 GEMM this process uses and why, for `bench --json`."""
    s = state()
    from .micro.llvm_ir import host_has
    kernel = "amx" if s["amx"] else "vnni" if host_has("avx512vnni") else "float"
    return {"kernel": kernel, "amx_reason": s["reason"], "amx_cpu_flags": s["cpu_flags"],
            "amx_permission": s["permission"]}
