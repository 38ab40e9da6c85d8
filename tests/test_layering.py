"""How the package's modules may depend on each other.

Imports only go down the layers docs/contributing/layout.md names: ir <- format <- runtime <- quant; a
module never imports a package above its own. No two modules import each other, directly or round a
loop, counting imports inside functions (a lazy import hides a cycle, it does not remove it); a
package's __init__ importing its own modules (to register or re-export them) is the one edge left out.
And what an op is (a convolution, a view, NC4HW4) is asked of its definition in ir/ops, never spelled
out elsewhere as a set of op names. Every check parses the modules; nothing is imported."""
import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "mnntool"
LAYERS = {"ir": 0, "format": 1, "passes": 1, "runtime": 2, "quant": 3}   # packages not listed sit on top

# Cycles present at the time of writing, each owned by other work; remove an entry when it is gone (the
# test fails on an entry that no longer matches a cycle, so the list only shrinks).
KNOWN_CYCLES: list = []     # none: a new cycle fails, and one that goes away must leave this list


def _module(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1]) if parts[-1] == "__init__" else ".".join(parts)


MODULES = {_module(p): p for p in PKG.rglob("*.py")}


def _imports(path: Path):
    tree = ast.parse(path.read_text())
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    package = parts[:-1]
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
            elif other not in LAYERS and other not in ("errors", "registry", "native_output") and (PKG / other).exists():
                bad.append(f"{path.relative_to(PKG.parent)} imports {'.'.join(target)}")
    assert not bad, "\n".join(bad)


def _edges(module: str, path: Path) -> set[str]:
    """The modules `module` imports, at the top or inside functions: `from .x import name` is an edge to x,
    or to x.name where that is a module of its own."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.split(".")[:len(package.split(".")) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mnntool"):
            target = node.module
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in MODULES}
            continue
        else:
            continue
        for alias in node.names:
            sub = f"{target}.{alias.name}"
            out.add(sub if sub in MODULES else target)
    if path.name == "__init__.py":          # a package registering or re-exporting its own modules
        out = {t for t in out if not t.startswith(module + ".")}
    return {t for t in out if t in MODULES and t != module}


def import_cycles(modules: dict[str, Path]) -> list[set[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iteratively)."""
    graph = {m: _edges(m, p) for m, p in modules.items()}
    index, low, on_stack, stack, groups, counter = {}, {}, set(), [], [], 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                group = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    group.add(w)
                    if w == v:
                        break
                if len(group) > 1:
                    groups.append(group)
    return groups


def test_no_import_cycles():
    cycles = import_cycles(MODULES)
    new = [sorted(c) for c in cycles if c not in KNOWN_CYCLES]
    assert not new, "modules that import each other (lazy imports count):\n" + "\n".join(map(" <-> ".join, new))
    gone = [sorted(c) for c in KNOWN_CYCLES if c not in cycles]
    assert not gone, "no longer a cycle, drop it from KNOWN_CYCLES: " + "; ".join(map(", ".join, gone))


def test_the_cycle_check_sees_a_lazy_cycle(tmp_path):
    """The check itself: two modules importing each other, one of them inside a function."""
    pkg = tmp_path / "mnntool" / "demo"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from . import a, b\n")
    (pkg / "a.py").write_text("from .b import g\n\ndef f():\n    return g()\n")
    (pkg / "b.py").write_text("def g():\n    from .a import f\n    return f\n")
    (pkg / "c.py").write_text("from . import a\n")
    modules = {"mnntool.demo": pkg / "__init__.py", "mnntool.demo.a": pkg / "a.py", "mnntool.demo.b": pkg / "b.py",
               "mnntool.demo.c": pkg / "c.py"}
    global MODULES
    saved, MODULES = MODULES, modules
    try:
        assert import_cycles(modules) == [{"mnntool.demo.a", "mnntool.demo.b"}]
    finally:
        MODULES = saved


def _op_names() -> set[str]:
    """The registered op names, read from the definitions' @define(...) calls."""
    names = set()
    for path in (PKG / "ir" / "ops").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "define":
                names |= {a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)}
    return names


def op_kind_sets(path: Path, ops: set[str]) -> list[int]:
    """Lines of `path` that spell out a collection of op names: a set literal, a set()/frozenset() of a
    literal, or a module-level tuple/list constant, two or more of whose strings (at least half) are op
    names. A test of one node against a few named ops (`node.op in ("Permute", "Reshape")`, `{u.op for u
    in users} == {"BinaryOp", "Select"}`) is pattern matching, not a kind, and is left alone."""
    tree = ast.parse(path.read_text())
    found = []
    compared = {id(c) for node in ast.walk(tree) if isinstance(node, ast.Compare)
                for c in [node.left, *node.comparators]}

    def names(elts):
        strs = [e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        hits = [s for s in strs if s in ops]
        return len(hits) >= 2 and 2 * len(hits) >= len(elts)
    for node in ast.walk(tree):
        if isinstance(node, ast.Set) and id(node) not in compared and names(node.elts):
            found.append(node.lineno)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("set", "frozenset") and node.args \
                and isinstance(node.args[0], (ast.Set, ast.List, ast.Tuple)) and names(node.args[0].elts):
            found.append(node.lineno)
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, (ast.Tuple, ast.List)) \
                and names(node.value.elts):
            found.append(node.lineno)
    return sorted(set(found))


def test_no_op_kind_sets_outside_ir():
    ops = _op_names()
    assert {"Convolution", "Reshape", "LRN"} <= ops
    bad = [f"{p.relative_to(PKG.parent)}:{line}" for p in sorted(PKG.rglob("*.py"))
           if p.relative_to(PKG).parts[0] != "ir" for line in op_kind_sets(p, ops)]
    assert not bad, "ask the op's definition (mnntool/ir/ops: is_view, is_convolution, layout_of, ...) " \
                    "instead of a set of op names:\n" + "\n".join(bad)


def test_the_set_check_sees_a_set(tmp_path):
    src = tmp_path / "m.py"
    src.write_text('CONVS = ("Convolution", "ConvolutionDepthwise")\nVIEWS = frozenset({"Reshape", "Flatten"})\n'
                   'def f(n, users):\n'
                   '    return n.op in ("Permute", "Reshape") or {u.op for u in users} == {"Tile", "Pack"}\n')
    assert op_kind_sets(src, _op_names()) == [1, 2]
