"""`mnntool debug ...`: tools for finding what goes wrong in a model (debug reduce)."""
from __future__ import annotations

import json
from typing import List, Optional

import typer

from .cli_common import INPUT_SHAPE, INPUTS, JSON, Runtime, _progress, console, u

debug_app = typer.Typer(no_args_is_help=True, help="Find what goes wrong: reduce a failing model to a small repro.")


@debug_app.command("reduce")
def reduce(model: str = typer.Argument(..., help="The failing ONNX model."),
           out: str = typer.Argument(..., help="The reduced model to write (.onnx)."),
           fails: Optional[str] = typer.Option(None, "--fails", help="What failing means: mismatch (default: the "
                                               "converted model's outputs miss --min-cosine against onnxruntime) "
                                               "or convert (mnntool refuses it, with the same message)."),
           check: Optional[str] = typer.Option(None, "--check", help="Instead: a shell command, {} for the "
                                               "candidate's path; failing means it exits non-zero."),
           backend: Runtime = typer.Option("numba", "--backend", "-b", help="mismatch: the runtime that runs "
                                           "the converted model, numba (mnntool's) or mnn."),
           min_cosine: float = typer.Option(0.999, "--min-cosine", help="mismatch: an output below this fails."),
           max_abs: Optional[float] = typer.Option(None, "--max-abs", help="mismatch: an output above this fails."),
           input_shape: Optional[List[str]] = INPUT_SHAPE, inputs: Optional[List[str]] = INPUTS,
           seed: int = typer.Option(0, "--seed", help="Seed of the random inputs the source model is run on "
                                    "(those --input does not give)."),
           save_inputs: bool = typer.Option(False, "--save-inputs", help="Also write OUT.inputs.npz: the source's "
                                            "values of the reduced model's inputs."),
           as_json: bool = JSON):
    """Cut a failing ONNX model down to a small sub-graph that still fails, for a bug report: the
    first failing node found by bisection, the graph before it cut away (its tensors fed from the
    source's own values), then node by node.

    Example: mnntool debug reduce model.onnx repro.onnx --backend mnn --min-cosine 0.999

    Example: mnntool debug reduce model.onnx repro.onnx --check "my_test.sh {}"
    """
    from .api import parse_input_shapes
    from .errors import MnnToolError
    from .reduce import reduce as run_reduce, summary
    if check and fails:
        raise MnnToolError("--check and --fails are two ways to say what failing means: give one")
    if max_abs is not None and not max_abs >= 0.0:
        raise MnnToolError(f"--max-abs must be at least 0, got {max_abs}")
    criterion = "check" if check else (fails or "mismatch")
    with _progress("reducing (candidates tried)", None, shown=not as_json) as step:
        r = run_reduce(model, out, criterion, check, backend, min_cosine, max_abs, parse_input_shapes(input_shape),
                       seed, save_inputs=save_inputs, progress=step, input_specs=inputs)
    if as_json:
        print(json.dumps(r))
    else:
        console.print(u(summary(r)), highlight=False)
