"""Redirect a process-level file descriptor for a block: native libraries (MNN, TensorFlow) print
start-up lines straight to fd 1/2, past Python's sys.stdout/sys.stderr."""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager


@contextmanager
def redirected_fd(fd: int, target: int | None = None):
    """Point `fd` at the descriptor `target`, or at /dev/null when None, until the block ends."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(fd)
    null = open(os.devnull, "w") if target is None else None
    try:
        os.dup2(null.fileno() if null else target, fd)
        yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)
        if null:
            null.close()
