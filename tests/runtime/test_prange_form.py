"""Every `prange` loop of the runtime's kernels in a form Numba can parallelize.

Numba turns `for i in prange(n)` into an OpenMP region only when the loop is in canonical form; a
conditional expression inside the range's argument (`prange(a + (b if last else 0))`) leaves it a plain
loop, with only a NumbaPerformanceWarning at compile time, which the kernel cache hides afterwards. Every
float GEMM then ran on one thread at any thread count (16-core Xeon, 4 threads: ResNet-50 1.2x its
one-thread speed instead of 3.2x), while its results stayed bit-identical to the serial twin, so no
numerical test could see it. The static check here catches that form; the compile check confirms, on the
GEMM that regressed, that Numba reports a parallel loop."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

KERNELS = Path(__file__).resolve().parents[2] / "mnntool" / "runtime" / "kernels"


def _prange_args_with_conditionals(path: Path) -> list[str]:
    bad = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.For) and isinstance(node.iter, ast.Call) \
                and getattr(node.iter.func, "id", getattr(node.iter.func, "attr", None)) == "prange":
            if any(isinstance(sub, (ast.IfExp, ast.BoolOp, ast.Compare)) for a in node.iter.args for sub in ast.walk(a)):
                bad.append(f"{path.relative_to(KERNELS.parents[2])}:{node.lineno}")
    return bad


def test_no_conditional_inside_prange():
    bad = [b for p in sorted(KERNELS.rglob("*.py")) for b in _prange_args_with_conditionals(p)]
    assert not bad, "compute the loop count before the loop (Numba does not parallelize these):\n" + "\n".join(bad)


def test_the_check_sees_the_form(tmp_path):
    f = KERNELS / "micro" / "_probe_form_tmp.py"
    try:
        f.write_text("def k(n, last):\n    for i in prange(n + (2 if last else 0)):\n        pass\n")
        assert _prange_args_with_conditionals(f)
    finally:
        f.unlink(missing_ok=True)


def test_float_gemm_compiles_to_a_parallel_loop(tmp_path):
    """A fresh compile (own Numba cache) of `gemm` reports a parallel loop and no 'no transformation' warning."""
    code = """
import warnings, numpy as np
warnings.simplefilter('always')
from mnntool.runtime.kernels.micro import float_gemm as fg
w = np.ones((16, 8), np.float32); g = fg.PackedGemm(w, np.zeros(16, np.float32), 0, (1, 0, 0, 0), 50, 2)
x = np.ones(8 * 50, np.float32); out = np.zeros(16 * 50, np.float32)
with warnings.catch_warnings(record=True) as ws:
    warnings.simplefilter('always')
    fg.gemm(x, 50, 50, g.wp, 8, g.kc, 16, g.bias, g.epf, g.grid, out, 50, g.by_block)
assert np.allclose(out, 8.0)
print('NOPAR' if any('no transformation for parallel' in str(w.message) for w in ws) else 'PAR')
"""
    env = {**__import__("os").environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=KERNELS.parents[2], timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "PAR"
