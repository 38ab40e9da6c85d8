"""Imports only go down the layers docs/contributing/layout.md names: ir <- format <- runtime <- quant; a module never
imports a package above its own (the check parses every module's imports, including function-level
ones)."""
import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "mnntool"
LAYERS = {"ir": 0, "format": 1, "passes": 1, "runtime": 2, "quant": 3}   # packages not listed sit on top


def _imports(path: Path):
    tree = ast.parse(path.read_text())
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    package = parts[:-1] if path.name != "__init__.py" else parts[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[:len(package) - node.level + 1]
            target = base + tuple((node.module or "").split(".")) if node.module else base
            names = [target + (a.name,) for a in node.names] if not node.module else [target]
            yield from (t for t in names if len(t) > 1)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mnntool."):
            yield tuple(node.module.split("."))


def test_no_upward_imports():
    bad = []
    for path in PKG.rglob("*.py"):
        own = path.relative_to(PKG).parts[0]
        if own not in LAYERS:
            continue
        for target in _imports(path):
            other = target[1]
            if other in LAYERS and LAYERS[other] > LAYERS[own]:
                bad.append(f"{path.relative_to(PKG.parent)} imports {'.'.join(target)}")
            elif other not in LAYERS and other not in ("errors", "registry", "fdio") and (PKG / other).exists():
                bad.append(f"{path.relative_to(PKG.parent)} imports {'.'.join(target)}")
    assert not bad, "\n".join(bad)
