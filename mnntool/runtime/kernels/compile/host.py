"""What this CPU offers, read without LLVM: importing llvmlite's binding to ask it costs ~70 ms, a
start-up that MNN does not pay. Linux says it in /proc/cpuinfo; elsewhere LLVM is asked."""
from __future__ import annotations

import hashlib
import platform
from functools import lru_cache

# /proc/cpuinfo's names for the features the kernels ask about, where LLVM's differ
_LLVM_NAMES = {"avx512_vnni": "avx512vnni", "avx512_bf16": "avx512bf16", "avx_vnni": "avxvnni",
               "avx512_vbmi2": "avx512vbmi2", "avx512_bitalg": "avx512bitalg", "avx512_fp16": "avx512fp16",
               "avx512vbmi": "avx512vbmi", "sse4_1": "sse4.1", "sse4_2": "sse4.2"}


def _cpuinfo() -> tuple[str, str] | None:
    """(model name, flags) of the first CPU in /proc/cpuinfo, or None."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            text = f.read(1 << 16)
    except OSError:
        return None
    model = flags = None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model is None:
            model = value.strip()
        elif key == "flags" and flags is None:
            flags = value.strip()
        if model is not None and flags is not None:
            return model, flags
    return None


@lru_cache(maxsize=1)
def host_features() -> frozenset:
    """The host's CPU features under LLVM's names ("avx512f", "avx512vnni", ...)."""
    info = _cpuinfo() if platform.machine().lower() in ("x86_64", "amd64") else None
    if info is not None:
        return frozenset(_LLVM_NAMES.get(f, f) for f in info[1].split())
    try:
        import llvmlite.binding as llvm
        return frozenset(f[1:] for f in llvm.get_host_cpu_features().flatten().split(",") if f.startswith("+"))
    except Exception:
        return frozenset()


@lru_cache(maxsize=1)
def fingerprint() -> str:
    """A name for this CPU model and its features: code compiled for one runs on another with the same."""
    info = _cpuinfo()
    text = f"{platform.machine()}|{info[0]}|{info[1]}" if info else f"{platform.machine()}|{sorted(host_features())}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]
