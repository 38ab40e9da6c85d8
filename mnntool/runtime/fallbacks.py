"""Fast kernels that were not prepared, and the numpy fallback that ran instead: counted and reported.

The planner asks each op's fast-kernel factory first and falls back to the definition's numpy compute
when it cannot have it. A factory may decline a case on purpose (it raises MnnToolError: an attribute
it does not implement); anything else it raises (an IndexError, a TypeError) is a defect of the kernel
that the fallback would otherwise hide: the model still runs, right but many times slower. Both are
counted per op and exception type, and `mnntool bench --json` reports them ("kernel_fallbacks"). With
MNNTOOL_STRICT_KERNELS=1 (tests/conftest.py sets it) a defect raises instead, so no test passes on the
fallback of a broken kernel.
"""
from __future__ import annotations

import os
import threading
from collections import Counter

STRICT_ENV = "MNNTOOL_STRICT_KERNELS"

_COUNTS: Counter = Counter()      # (op, "declined" | "failed", exception type) -> fallbacks
_LOCK = threading.Lock()


class KernelDefect(RuntimeError):
    """A fast-kernel factory raised an exception it does not name, under MNNTOOL_STRICT_KERNELS=1."""


def fell_back(node, error: Exception, declined: bool) -> None:
    """Record that `node` runs on its numpy compute because its factory raised `error`; `declined`: the
    factory refused the case on purpose (MnnToolError). A defect raises KernelDefect in strict mode."""
    if not declined and os.environ.get(STRICT_ENV) == "1":
        raise KernelDefect(f"{node.op} '{node.name}': its fast kernel failed to prepare "
                           f"({type(error).__name__}: {error}); {STRICT_ENV}=1 makes that an error") from error
    with _LOCK:
        _COUNTS[(node.op, "declined" if declined else "failed", type(error).__name__)] += 1


def snapshot() -> Counter:
    """The counts so far (to report only what a later piece of work adds: report(since=...))."""
    with _LOCK:
        return Counter(_COUNTS)


def report(since: Counter | None = None) -> list[dict]:
    """[{op, reason, error, count}], most frequent first: every fallback since `since` (else ever)."""
    with _LOCK:
        now = Counter(_COUNTS)
    if since is not None:
        now.subtract(since)
    return [{"op": op, "reason": reason, "error": error, "count": n}
            for (op, reason, error), n in sorted(now.items(), key=lambda kv: (-kv[1], kv[0])) if n > 0]
