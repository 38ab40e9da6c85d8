"""The mnntool command line: parses options, calls mnntool.api, prints with rich."""
from __future__ import annotations

import json
import sys
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from . import api
from .errors import MnnToolError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Convert, optimize, quantize, check and time models in MNN's .mnn format.")
console = Console()
err = Console(stderr=True)

FRAMEWORK = typer.Option(None, "--framework", "-f", help="Force the source framework (onnx, mnn).")
INPUT_SHAPE = typer.Option(None, "--input-shape", help="Fix an input's shape: NAME:1x3x224x224 (repeatable).")
JSON = typer.Option(False, "--json", help="Print one JSON object for machines.")


def _human(n: float, unit: str = "") -> str:
    for suffix in ("", "K", "M", "G", "T"):
        if abs(n) < 1000:
            return f"{n:.1f}{suffix}{unit}" if suffix else f"{n:g}{unit}"
        n /= 1000
    return f"{n:.1f}P{unit}"


@app.command()
def convert(src: str = typer.Argument(..., help="Source model (.onnx)."),
            dst: str = typer.Argument(..., help="Output .mnn file."),
            framework: Optional[str] = FRAMEWORK, input_shape: Optional[List[str]] = INPUT_SHAPE,
            optimize: int = typer.Option(1, "--optimize", "-O", min=0, max=2, help="Optimization level 0-2."),
            biz_code: str = typer.Option("mnntool", "--biz-code", help="Free string stored in the file."),
            as_json: bool = JSON):
    """Convert a model into MNN's .mnn format."""
    r = api.convert(src, dst, framework, api.parse_input_shapes(input_shape), optimize, biz_code)
    if as_json:
        print(json.dumps(r))
    else:
        console.print(f"[green]converted[/] {src} -> {dst}: {r['ops']} ops, {_human(r['params'])} params, "
                      f"{_human(r['size_bytes'], 'B')} in {r['seconds']:.2f}s")


@app.command()
def info(path: str = typer.Argument(..., help="A .mnn or .onnx model."),
         framework: Optional[str] = FRAMEWORK, input_shape: Optional[List[str]] = INPUT_SHAPE,
         dump_json: Optional[str] = typer.Option(None, "--dump-json", help="Write the whole model as JSON."),
         as_json: bool = JSON):
    """Show inputs, outputs, op counts, parameters, FLOPs and size."""
    shapes = api.parse_input_shapes(input_shape)
    r = api.info(path, framework, shapes)
    if dump_json:
        api.dump_json(path, dump_json, framework, shapes)
    if as_json:
        print(json.dumps(r))
        return
    t = Table(title=f"{path}  ({_human(r['size_bytes'], 'B')}, {r['ops']} ops, {_human(r['params'])} params, "
                    f"{_human(r['flops'], 'FLOP')})")
    t.add_column("tensor")
    t.add_column("name")
    t.add_column("shape")
    t.add_column("dtype")
    for kind in ("inputs", "outputs"):
        for x in r[kind]:
            t.add_row(kind[:-1], x["name"], "x".join(map(str, x["shape"])) if x["shape"] is not None else "?", x["dtype"])
    console.print(t)
    ops = Table(title="op counts")
    ops.add_column("op")
    ops.add_column("count", justify="right")
    for op, n in r["op_counts"].items():
        ops.add_row(op, str(n))
    console.print(ops)


@app.command()
def verify(source: str = typer.Argument(..., help="The source model (.onnx)."),
           model: str = typer.Argument(..., help="The converted .mnn file."),
           input_shape: Optional[List[str]] = INPUT_SHAPE,
           min_cosine: float = typer.Option(0.999, "--min-cosine", help="Pass threshold per output."),
           max_abs: Optional[float] = typer.Option(None, "--max-abs", help="Optional max abs error per output."),
           as_json: bool = JSON):
    """Check a .mnn file against its source: final outputs in the real MNN runtime (exit 1 on failure)."""
    from .verify import verify_outputs
    r = verify_outputs(source, model, api.parse_input_shapes(input_shape), min_cosine=min_cosine, max_abs=max_abs)
    if as_json:
        print(json.dumps(r))
    else:
        t = Table(title=f"{model} vs {source} (MNN runtime)")
        for col in ("output", "cosine", "max_abs", "rel_l2", "snr_db", "result"):
            t.add_column(col)
        for o in r["outputs"]:
            t.add_row(o["name"], f"{o['cosine']:.6f}", f"{o['max_abs']:.3g}", f"{o['rel_l2']:.3g}",
                      f"{o['snr_db']:.1f}", "[green]pass[/]" if o["pass"] else "[red]FAIL[/]")
        console.print(t)
    if not r["pass"]:
        raise typer.Exit(1)


def main():
    try:
        rc = app(standalone_mode=False)
        sys.exit(rc if isinstance(rc, int) else 0)
    except MnnToolError as e:
        err.print(f"[red]error:[/] {e}", highlight=False, soft_wrap=True)
        sys.exit(e.code)
    except (typer.Exit, SystemExit) as e:
        sys.exit(getattr(e, "exit_code", getattr(e, "code", 0)))
    except Exception as e:  # click usage errors and the like
        import click
        if isinstance(e, click.exceptions.ClickException):
            e.show()
            sys.exit(2)
        if isinstance(e, click.exceptions.Abort):
            sys.exit(130)
        raise


if __name__ == "__main__":
    main()
