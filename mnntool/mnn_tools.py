"""MNN's own converter and quantizer (the `mnn` package's `_tools` module), each run in a child process.

Never the console scripts (they install a logging SDK and send telemetry). A child process because
`_tools` aborts the interpreter when TensorFlow is already loaded (both carry their own protobuf), and
because a native crash in MNN's tools must not take the caller down with it."""
from __future__ import annotations

import subprocess
import sys

from .errors import MnnToolError

# the tools' return values are not exit codes (the converter returns 1 on success): a crash or an exception is
_RUN = "import sys, _tools; getattr(_tools, sys.argv[1])(sys.argv[1:])"


def run_tool(tool: str, args: list, timeout: float = 900) -> str:
    """Run _tools.<tool>(["<tool>", *args]); returns its output, raises MnnToolError when it fails."""
    p = subprocess.run([sys.executable, "-c", _RUN, tool, *map(str, args)], capture_output=True, text=True,
                       timeout=timeout)
    if p.returncode != 0:
        tail = " | ".join((p.stdout + p.stderr).strip().splitlines()[-3:])
        raise MnnToolError(f"MNN's {tool} failed (exit {p.returncode}): {tail[:300]}")
    return p.stdout + p.stderr


def mnnconvert(*args) -> str:
    return run_tool("mnnconvert", list(args))


def mnnquant(*args) -> str:
    return run_tool("mnnquant", list(args))
