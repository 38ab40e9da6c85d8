"""`mnntool llm ...`: the language-model commands (a Typer group registered by cli.py)."""
from __future__ import annotations

import json
from typing import Optional

import typer
from rich.table import Table

from .cli import JSON, _human, _progress, console, u

llm_app = typer.Typer(no_args_is_help=True, help="Language models: export to the bundle MNN-LLM runs.")


@llm_app.command("export")
def export(model_dir: str = typer.Argument(..., help="A Hugging Face checkpoint folder: config.json, *.safetensors "
                                           "(sharded with their index too), tokenizer.json."),
           out_dir: str = typer.Argument(..., help="The bundle folder to write (MNN.llm loads OUT/config.json)."),
           bits: int = typer.Option(4, "--bits", help="Weight bits of the blocks' linear layers: 4, 8 or 16 (fp16)."),
           block: int = typer.Option(64, "--block", help="Input channels per scale: 32, 64, 128...; 0 per channel."),
           sym: bool = typer.Option(False, "--sym", help="Symmetric blocks (a scale only, no zero point)."),
           hqq: bool = typer.Option(False, "--hqq", help="HQQ: move each block's zero point to minimise the error."),
           lm_bits: Optional[int] = typer.Option(None, "--lm-bits", help="Bits of the LM head (default: --bits)."),
           lm_block: Optional[int] = typer.Option(None, "--lm-block", help="Block of the LM head (default: --block)."),
           embed_bits: Optional[int] = typer.Option(None, "--embed-bits", help="Embeddings: 16 (bf16), 8 or 4 "
                                                    "(default: the head's bits when tied, else 16)."),
           calib_text: Optional[str] = typer.Option(None, "--calib-text", help="A text file: AWQ searches per-channel "
                                                    "scales on its tokens (data-aware 4/8-bit)."),
           calib_tokens: int = typer.Option(4096, "--calib-tokens", min=16, help="Tokens of --calib-text used."),
           overwrite: bool = typer.Option(False, "--overwrite", help="Replace OUT_DIR when it exists."),
           tensors: bool = typer.Option(False, "--tensors", help="Show the per-tensor table."),
           as_json: bool = JSON):
    """Export a checkpoint to MNN-LLM's bundle, streaming tensor by tensor (peak memory ~ one tensor).

    Reads safetensors as data only: no pickle, no code from the folder, nothing downloaded."""
    from .llm.bundle import export as run_export

    bar = _progress("exporting layers", None, shown=not as_json)
    with bar as step:
        def progress(total):
            bar.prog.update(bar.prog.task_ids[0], total=total)
            return step
        r = run_export(model_dir, out_dir, bits=bits, block=block, symmetric=sym, hqq=hqq, lm_bits=lm_bits,
                       lm_block=lm_block, embed_bits=embed_bits, calib_text=calib_text,
                       calib_tokens=calib_tokens, overwrite=overwrite,
                       progress=progress if step else None)
    if as_json:
        print(json.dumps(r))
        return
    s = r["settings"]
    console.print(f"{u(r['out'])}: {r['family']} ({r['model_type']}), {r['layers']} layers, hidden {r['hidden']}, "
                  f"vocab {r['vocab']}{', tied embeddings' if r['tied'] else ''}; {s['bits']}-bit blocks of "
                  f"{s['block'] or 'a channel'}{' sym' if s['symmetric'] else ''}{' hqq' if s['hqq'] else ''}, "
                  f"head {s['lm_bits']}-bit, embeddings {s['embed_bits']}-bit{', AWQ' if r.get('awq') else ''}; "
                  f"{r['bits_per_weight']:.2f} bits per weight; {r['seconds']:.1f} s")
    t = Table(title="files")
    t.add_column("file")
    t.add_column("bytes", justify="right")
    for name, size in r["files"].items():
        t.add_row(u(name), _human(size, "B"))
    console.print(t)
    if tensors:
        t = Table(title="tensors")
        for col in ("tensor", "shape", "bits", "block", "bits/weight", "bytes"):
            t.add_column(col)
        for x in r["tensors"]:
            t.add_row(u(x["name"]), "x".join(map(str, x["shape"])), str(x["bits"]), str(x["block"]),
                      f"{x['bits_per_weight']:.2f}", _human(x["bytes"], "B"))
        console.print(t)
    for note in r["notes"]:
        console.print(f"[yellow]note:[/] {u(note)}")
