"""Where each op lives, generated from the registries: its definition (ir/ops), each frontend's converters
that emit it, its fast kernel (or "numpy fallback": the definition's compute runs), and the tests that
name it. `mnntool ops --where` prints it and the docs page docs/contributing/op-map.md is built from
it, so a gap (an op no TorchScript converter emits, an op with no kernel) shows without reading code.

Which IR ops a converter emits is read from its source: the op names in its calls (`ctx.emit("LRN",
...)`), the ONNX converter it delegates to (`emit_onnx(ctx, "Resize", ...)`), and, a few calls deep, the
frontend helpers it calls (`binary(...)` emits a BinaryOp). A converter that picks its op at run time
from a table is seen through the table's strings where they are op names.
"""
from __future__ import annotations

import ast
import inspect
import textwrap
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FRONTENDS = ("onnx", "torchscript", "tensorflow", "tflite", "caffe")
DEPTH = 3          # how many calls deep into frontend helpers a converter is followed


def _registries() -> dict[str, dict]:
    """{frontend: {source op: converter}}."""
    from .frontends.caffe.layers import LAYERS
    from .frontends.onnx.registry import CONVERTERS
    from .frontends.tensorflow.ops import OPS as TF_OPS
    from .frontends.tflite.ops import OPS as TFLITE_OPS
    from .frontends.torchscript.context import ATEN
    from .frontends import caffe, onnx, tensorflow, tflite, torchscript  # noqa: F401  (their imports register)
    return {"onnx": CONVERTERS, "torchscript": ATEN, "tensorflow": TF_OPS, "tflite": TFLITE_OPS, "caffe": LAYERS}


def _where(fn) -> str:
    """path:line of a function, relative to the repository."""
    try:
        path = Path(inspect.getsourcefile(fn)).resolve()
        line = inspect.getsourcelines(fn)[1]
    except (TypeError, OSError):
        return "?"
    try:
        path = path.relative_to(ROOT)
    except ValueError:
        pass
    return f"{path}:{line}"


@lru_cache(maxsize=None)
def _tree(fn):
    try:
        return ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (TypeError, OSError, SyntaxError):
        return None


def _emits(fn, ops: frozenset, onnx: dict, depth: int = DEPTH, seen: frozenset = frozenset()) -> set[str]:
    """The IR ops a converter (or frontend helper) emits, read from its source."""
    fn = inspect.unwrap(fn)
    if id(fn) in seen or not callable(fn):
        return set()
    seen = seen | {id(fn)}
    out = {c.cell_contents for c in (getattr(fn, "__closure__", None) or ())
           if isinstance(_cell(c), str) and _cell(c) in ops}
    tree = _tree(fn)
    if tree is None:
        return out
    scope = dict(getattr(fn, "__globals__", {}))
    delegated = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        strings = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        if name == "emit_onnx" and len(strings) >= 1 and strings[0] in onnx:
            out |= _emits(onnx[strings[0]], ops, onnx, depth, seen)
            delegated.add(id(node.args[1]) if len(node.args) > 1 else None)
            continue
        out |= {s for s in strings if s in ops}
        callee = scope.get(name) if isinstance(node.func, ast.Name) else None
        if depth > 0 and callable(callee) and getattr(callee, "__module__", "").startswith("mnntool.frontends"):
            out |= _emits(callee, ops, onnx, depth - 1, seen)
    if depth == DEPTH:      # the converter itself: an op name written anywhere in it ("A" if ... else "B")
        out |= {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in ops
                and id(n) not in delegated}
    return out


def _cell(cell):
    try:
        return cell.cell_contents
    except ValueError:
        return None


def _test_names() -> dict[str, set[str]]:
    """{string constant: test files (relative paths) that hold it}, over tests/ when it is there."""
    found: dict[str, set[str]] = {}
    tests = ROOT / "tests"
    for path in sorted(tests.rglob("test_*.py")) if tests.is_dir() else []:
        try:
            tree = ast.parse(path.read_text())
        except SyntaxError:
            continue
        rel = str(path.relative_to(ROOT))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) < 64:
                found.setdefault(node.value, set()).add(rel)
    return found


def op_map() -> list[dict]:
    """One row per IR op: {op, kind, definition, converters: {frontend: [{source, at}]}, kernel, tests}."""
    from .ir.ops import REGISTRY
    from .runtime.kernels import KERNELS, PLAN_ONLY
    ops = frozenset(REGISTRY)
    registries = _registries()
    by_op: dict[str, dict[str, list]] = {op: {fw: [] for fw in FRONTENDS} for op in ops}
    for fw, table in registries.items():
        for source, fn in sorted(table.items()):
            for op in _emits(fn, ops, registries["onnx"]):
                by_op[op][fw].append({"source": source, "at": _where(fn)})
    names = _test_names()
    rows = []
    for op in sorted(ops):
        d = REGISTRY[op]
        kernel = KERNELS.get(op) or PLAN_ONLY.get(op)
        sources = {c["source"] for convs in by_op[op].values() for c in convs}
        tests = sorted(names.get(op, set()) | {t for s in sources for t in names.get(s, set())})
        rows.append({"op": op, "kind": d.kind, "definition": d.source.replace(".", "/") + ".py",
                     "converters": by_op[op], "kernel": _where(kernel) if kernel else "numpy fallback",
                     "tests": tests})
    return rows


def _cell_text(convs: list[dict], limit: int = 4) -> str:
    names = sorted({c["source"] for c in convs})
    return ", ".join(names[:limit]) + (f" +{len(names) - limit}" if len(names) > limit else "") if names else "—"


def markdown() -> str:
    """The op map as a Markdown table (docs/contributing/op-map.md)."""
    rows = op_map()
    head = "| op | kind | definition | " + " | ".join(FRONTENDS) + " | kernel | tests |"
    lines = [head, "|" + "---|" * (len(FRONTENDS) + 5)]
    for r in rows:
        conv = " | ".join(_cell_text(r["converters"][fw]) for fw in FRONTENDS)
        kernel = r["kernel"] if r["kernel"] == "numpy fallback" else f"`{r['kernel']}`"
        lines.append(f"| {r['op']} | {r['kind']} | `{r['definition']}` | {conv} | {kernel} | {len(r['tests'])} |")
    return "\n".join(lines) + "\n"
