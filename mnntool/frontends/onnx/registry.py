"""The ONNX converters, by ONNX op type: each module registers its own with `@converts("OpType", ...)`, and
the frontend (and `mnntool ops --where`) looks them up here. A converter is (ctx, node, attrs) -> None and
emits IR nodes through ctx."""
from __future__ import annotations

from ...registry import registrar

CONVERTERS: dict = {}

converts = registrar(CONVERTERS)
