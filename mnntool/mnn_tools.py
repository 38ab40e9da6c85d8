"""MNN's own converter and quantizer (the `mnn` package's `_tools` module), each run in a child process.

Never the console scripts (they install a logging SDK and send telemetry). A child process because
`_tools` aborts the interpreter when TensorFlow is already loaded (both carry their own protobuf), and
because a native crash in MNN's tools must not take the caller down with it."""
from __future__ import annotations

import subprocess
import sys

from .errors import MnnToolError
from .interrupts import deferred

# the tools' return values are not exit codes (the converter returns 1 on success): a crash or an exception is
_RUN = "import sys, _tools; getattr(_tools, sys.argv[1])(sys.argv[1:])"


def run_tool(tool: str, args: list, timeout: float = 900) -> str:
    """Run _tools.<tool>(["<tool>", *args]); returns its output, raises MnnToolError when it fails.

    The child starts with signals held (interrupts.deferred): an interrupt that arrived between the fork
    and Popen returning would leave a child nobody kills (Popen does not kill it on an exception of its
    own); from then on any exception, an interrupt included, kills and reaps it."""
    proc = None
    try:
        with deferred():
            proc = subprocess.Popen([sys.executable, "-c", _RUN, tool, *map(str, args)], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        if proc is not None:        # a held signal re-raised as `deferred` ends lands here too
            proc.kill()
            proc.communicate()
        raise
    if proc.returncode != 0:
        tail = " | ".join((out + err).strip().splitlines()[-3:])
        raise MnnToolError(f"MNN's {tool} failed (exit {proc.returncode}): {tail[:300]}")
    return out + err


def mnnconvert(*args) -> str:
    return run_tool("mnnconvert", list(args))


def mnnquant(*args) -> str:
    return run_tool("mnnquant", list(args))
