"""One decorator factory for the name -> function tables (frontend converters, runtime kernels)."""
from __future__ import annotations

from typing import Callable


def registrar(table: dict) -> Callable:
    """`registrar(TABLE)` is a decorator taking names: `@deco("Relu", "Relu6")` files fn under each."""
    def names(*keys):
        def deco(fn):
            for k in keys:
                table[k] = fn
            return fn
        return deco
    return names
