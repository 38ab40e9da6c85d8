"""What every command module of the CLI shares: safe printing of user strings, the consoles, the common
options and the progress bar. Its own module so the sub-apps (cli_llm, cli_debug) and cli import it
rather than each other."""
from __future__ import annotations

import re
from typing import Literal

import typer
import typer.core
from rich.console import Console
from rich.markup import escape

from .interrupts import test_point

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def u(value) -> str:
    """A user-controlled string (path, tensor or op name, error text) made safe to print: control
    characters (terminal escapes) replaced, Rich markup escaped."""
    return escape(_CONTROL.sub("?", str(value)))

_type_shown = typer.core.TyperOption.display_type_rich


def _flag_type(self, ctx):
    """A flag takes no value: show no type for it (Typer labels every option, flags as '<bool>')."""
    return None if self.is_flag else _type_shown(self, ctx)


typer.core.TyperOption.display_type_rich = _flag_type

console = Console(soft_wrap=True)      # lines are not broken at 80 columns when piped
err = Console(stderr=True, soft_wrap=True)

FRAMEWORK = typer.Option(None, "--framework", "-f", help="Force the source framework: onnx, torch.export (.pt2), "
                         "torchscript, tensorflow, tflite, caffe or mnn.")
INPUT_SHAPE = typer.Option(None, "--input-shape", help="Fix an input's shape: NAME:1x3x224x224 (repeatable).")
JSON = typer.Option(False, "--json", help="Print one JSON object for machines.")
EXTERNAL_WEIGHTS = typer.Option(False, "--external-weights",
                                help="Write the weights to OUT.weight beside OUT (MNN's --saveExternalData layout); "
                                     "automatic past 2000 MB.")
THREADS = typer.Option(1, "--threads", "-t", min=1, help="Threads for kernels and BLAS.")
SAMPLES = typer.Option(None, "--samples", "-n", min=1, help="Use at most N samples of --calib (default: verify 4, "
                       "quant all).")
Runtime = Literal["numba", "mnn"]                        # checked at parse time: Typer lists the choices
BenchBackend = Literal["numba", "onnxruntime", "openvino", "mnn"]
INPUTS = typer.Option(None, "--input", "-i", help="Input data: NAME=file.npy or a .npz of all inputs (repeatable).")
MEAN = typer.Option(None, "--mean", help="Image preprocessing: per-channel mean, e.g. 127.5,127.5,127.5.")
NORMAL = typer.Option(None, "--normal", help="Image preprocessing: per-channel multiplier after the mean (1/std).")
STD = typer.Option(None, "--std", help="Image preprocessing: per-channel std (instead of --normal).")
SIZE = typer.Option(None, "--size", help="Image preprocessing: resize to WxH (default: the model input).")
FORMAT = typer.Option("RGB", "--format", help="Image preprocessing: RGB, BGR or GRAY.")



class _progress:
    """A progress bar on stderr while `with` runs (Rich leaves it out when stderr is not a terminal);
    entering gives the function that advances it by n steps, or None when not `shown` (--json)."""

    def __init__(self, what: str, total: int | None, shown: bool = True):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn
        self.prog = Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                             TimeRemainingColumn(), console=err, transient=True, disable=not shown)
        self.what, self.total, self.shown = what, total, shown

    def __enter__(self):
        self.prog.__enter__()
        task = self.prog.add_task(self.what, total=self.total)
        if not self.shown:
            return None

        def step(n=1):
            test_point("progress")
            self.prog.advance(task, n)
        return step

    def __exit__(self, *exc):
        return self.prog.__exit__(*exc)


def _human(n: float, unit: str = "") -> str:
    for suffix in ("", "K", "M", "G", "T"):
        if abs(n) < 1000:
            return f"{n:.1f}{suffix}{unit}" if suffix else f"{n:g}{unit}"
        n /= 1000
    return f"{n:.1f}P{unit}"
