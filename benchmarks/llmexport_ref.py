"""Run MNN's own `llmexport` on a Hugging Face checkpoint, safely, and time it: the reference bundle and
cost that `mnntool llm export` is compared against.

    python benchmarks/llmexport_ref.py SRC_DIR OUT_DIR --bits 4 --block 64 [--sym] [--hqq] [--lm-bits 8]
        [--llmexport-dir DIR]

Prints one JSON object: the command's options, wall time (s), peak RSS (MB) and the bundle's files.

llmexport (PyPI `llmexport`) is not a project dependency. Install it, and what it needs that the venv
lacks, into a folder of its own, without touching the venv:

    .venv/bin/pip install --no-deps --target build/llmref/pkgs llmexport yaspin sentencepiece onnxslim colorama

The folder is found from --llmexport-dir, else $MNNTOOL_LLMEXPORT_DIR, else build/llmref/pkgs.

Why it runs this way:
- llmexport imports `MNN.tools.mnnconvert`, whose logger (`MNN.tools.utils.log`) pip-installs an SDK
  and sends telemetry. The child blocks `MNN.tools*` in `sys.modules` before importing llmexport and
  passes `--mnnconvert WRAPPER`, an executable script that calls `_tools.mnnconvert` (the converter's C
  entry point) directly. llmexport runs it through `os.popen`, so it is a process of its own.
- The torchvision wheel in the venv breaks transformers' model imports; the child blocks it too.
- llmexport's modules import each other as `from utils...`: its package folder goes on `sys.path` and
  `llmexport.py` runs as `__main__`. It writes `.export.log` into its working directory, so the child
  runs in a temporary folder.

Peak RSS is `ru_maxrss` over this script's children (the llmexport process and the converter processes
it waits for): the largest of them, not their sum. This script imports nothing heavy, so its own RSS,
which a forked child starts from, stays small against the figure.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DIR = ROOT / "build" / "llmref" / "pkgs"

WRAPPER = """#!{python}
import sys, _tools
sys.exit(_tools.mnnconvert(["mnnconvert", *sys.argv[1:]]) or 0)
"""

DRIVER = """import sys
for name in ("MNN.tools", "MNN.tools.mnnconvert", "MNN.tools.utils", "MNN.tools.utils.log", "torchvision"):
    sys.modules[name] = None
pkgs, args = sys.argv[1], sys.argv[2:]
sys.path[:0] = [pkgs + "/llmexport", pkgs]
sys.argv = [pkgs + "/llmexport/llmexport.py", *args]
# not runpy: it restores sys.argv[0] on exit, and llmexport leaves sys.argv empty
exec(compile(open(sys.argv[0]).read(), sys.argv[0], "exec"), {"__name__": "__main__", "__file__": sys.argv[0]})
"""


def llmexport_dir(option: str | None) -> Path:
    """The folder holding the `llmexport` package (and its extra dependencies)."""
    d = Path(option or os.environ.get("MNNTOOL_LLMEXPORT_DIR") or DEFAULT_DIR).resolve()
    if not (d / "llmexport" / "llmexport.py").is_file():
        raise RuntimeError(f"llmexport not found in {d} (set --llmexport-dir or MNNTOOL_LLMEXPORT_DIR; install with "
                 f"`pip install --no-deps --target {d} llmexport yaspin sentencepiece onnxslim colorama`)")
    return d


def run(src, out, bits: int = 4, block: int = 64, sym: bool = False, hqq: bool = False,
        lm_bits: int | None = None, pkgs: str | None = None, python: str = sys.executable) -> dict:
    """Export SRC (a Hugging Face folder) to the MNN-LLM bundle OUT in a child process; return the
    measurements as a dict. Raises RuntimeError (one line) if llmexport is missing or fails.
    peak_rss_mb is ru_maxrss over all children this process has waited for so far: for separate figures,
    call run() once per process (as the command line does)."""
    pkgs_dir = llmexport_dir(pkgs)
    src, out = Path(src).resolve(), Path(out).resolve()
    if not (src / "config.json").is_file():
        raise RuntimeError(f"{src}: not a Hugging Face checkpoint folder (no config.json)")
    args = ["--path", str(src), "--export", "mnn", "--dst_path", str(out),
            "--quant_bit", str(bits), "--quant_block", str(block)]
    if sym:
        args.append("--sym")
    if hqq:
        args.append("--hqq")
    if lm_bits is not None:
        args += ["--lm_quant_bit", str(lm_bits)]
    with tempfile.TemporaryDirectory(prefix="llmexport_ref_") as tmp:
        wrapper = Path(tmp) / "mnnconvert_wrapper.py"
        wrapper.write_text(WRAPPER.format(python=python))
        wrapper.chmod(0o755)
        cmd = [python, "-c", DRIVER, str(pkgs_dir), *args, "--mnnconvert", str(wrapper)]
        t0 = time.perf_counter()
        done = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        log = Path(tmp) / ".export.log"
        converter_log = log.read_text(errors="replace") if log.exists() else ""
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if done.returncode != 0 or not (out / "llm.mnn").is_file():
        lines = (done.stderr or done.stdout or converter_log).strip().splitlines() or [f"exit {done.returncode}"]
        raise RuntimeError(f"llmexport failed on {src}: {lines[-1]}")
    files = {p.name: p.stat().st_size for p in sorted(out.iterdir()) if p.is_file()}
    return {"src": str(src), "out": str(out), "bits": bits, "block": block, "sym": sym, "hqq": hqq,
            "lm_bits": lm_bits, "wall_s": round(wall, 2), "peak_rss_mb": round(peak_kb / 1024, 1),
            "bundle_bytes": sum(files.values()), "files": files}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", help="Hugging Face checkpoint folder (config.json, safetensors, tokenizer)")
    ap.add_argument("out", help="bundle folder to write")
    ap.add_argument("--bits", type=int, default=4, help="weight bits: 4, 8 or 16 (default 4)")
    ap.add_argument("--block", type=int, default=64, help="quantization block, 0 = per channel (default 64)")
    ap.add_argument("--sym", action="store_true", help="symmetric quantization (no zero points)")
    ap.add_argument("--hqq", action="store_true", help="HQQ-optimized quantization")
    ap.add_argument("--lm-bits", type=int, default=None, help="bits of the lm head (default: --bits)")
    ap.add_argument("--llmexport-dir", default=None,
                    help="folder holding the llmexport package (default $MNNTOOL_LLMEXPORT_DIR or build/llmref/pkgs)")
    a = ap.parse_args()
    try:
        res = run(a.src, a.out, a.bits, a.block, a.sym, a.hqq, a.lm_bits, a.llmexport_dir)
    except RuntimeError as e:
        sys.exit(str(e))
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
