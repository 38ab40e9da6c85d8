"""`mnntool llm ...`: the language-model commands (a Typer group registered by cli.py)."""
from __future__ import annotations

import json
from typing import Optional

import typer
from rich.table import Table

from .cli_common import JSON, _human, _progress, console, u

llm_app = typer.Typer(no_args_is_help=True, help="Language models: export to the bundle MNN-LLM runs; run and bench it.")


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


@llm_app.command("run")
def run(bundle: str = typer.Argument(..., help="A bundle folder (what `mnntool llm export` or llmexport wrote)."),
        prompt: str = typer.Option(..., "--prompt", "-p", help="The prompt text (encoded with the bundle's tokenizer.mtok)."),
        n: int = typer.Option(128, "-n", "--max-new-tokens", min=1, help="Tokens to generate at most."),
        temperature: float = typer.Option(0.0, "--temperature", min=0.0, help="0: greedy; else sample at this temperature."),
        top_k: int = typer.Option(0, "--top-k", min=0, help="Sample from the k most likely tokens (0: all)."),
        top_p: float = typer.Option(1.0, "--top-p", min=0.0, max=1.0, help="Nucleus: the smallest set reaching this probability."),
        seed: Optional[int] = typer.Option(None, "--seed", help="Seed of the sampler."),
        threads: int = typer.Option(1, "--threads", "-t", min=1, help="Threads of the runtime's kernels."),
        ignore_eos: bool = typer.Option(False, "--ignore-eos", help="Go on past stop tokens."),
        precision: str = typer.Option("normal", "--precision", help="normal (int16 inputs to the quantized layers) "
                                      "or high (float32, slower)."),
        kv_int8: bool = typer.Option(False, "--kv-int8", help="The KV cache in 8-bit codes (MNN-LLM's kv_quant)."),
        as_json: bool = JSON):
    """Generate from a bundle in mnntool's own runtime, the tokens printed as they come."""
    import sys

    from .llm.engine import load

    llm = load(bundle, threads=threads, precision=precision, kv_int8=kv_int8)

    def show(text):
        sys.stdout.write(text)
        sys.stdout.flush()
    if not as_json:
        show(prompt)
    g = llm.generate(prompt, max_new_tokens=n, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                     stop=not ignore_eos, on_text=None if as_json else show)
    if as_json:
        print(json.dumps({**g.as_dict(), "threads": threads, "load_s": round(llm.model.load_s, 4)}))
        return
    sys.stdout.write("\n")
    console.print(f"[dim]{len(g.prompt_ids)} prompt tokens {g.prefill_tps:.1f} tok/s, {len(g.ids)} generated "
                  f"{g.decode_tps:.1f} tok/s ({g.stopped}), {threads} thread{'s' if threads > 1 else ''}[/]",
                  highlight=False)


def _ints_list(text: str, what: str) -> list:
    from .errors import MnnToolError
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise MnnToolError(f"{what} '{text}': expected comma-separated integers") from None
    if not out or min(out) < 1:
        raise MnnToolError(f"{what} '{text}': expected positive integers")
    return out


@llm_app.command("bench")
def bench(bundle: str = typer.Argument(..., help="A bundle folder."),
          p: int = typer.Option(512, "-p", "--n-prompt", min=0, help="Prompt tokens (the pp row; 0: none)."),
          n: int = typer.Option(128, "-n", "--n-gen", min=0, help="Generated tokens (the tg row; 0: none)."),
          pg: Optional[str] = typer.Option(None, "-pg", help="P,N: a prompt of P then N generated, timed together."),
          reps: int = typer.Option(3, "-r", "--repetitions", min=1, help="Repetitions (mean and stddev over them)."),
          threads: str = typer.Option("1", "--threads", "-t", help="Thread counts, comma-separated (e.g. 1,2,4)."),
          backend: str = typer.Option("mnntool", "--backend", help="mnntool (this runtime) or mnn (MNN-LLM, MNN.llm)."),
          exact: bool = typer.Option(False, "--exact", help="MNN-LLM with precision/memory high (default: as config.json); "
                                     "mnntool with float32 inputs (--precision high)."),
          kv_int8: bool = typer.Option(False, "--kv-int8", help="mnntool: the KV cache in 8-bit codes."),
          as_json: bool = JSON):
    """llama-bench's rows for a bundle: prompt processing (pp) and generation (tg) tokens/s, mean ± stddev,
    load time and peak RSS; each thread count in a child process of its own."""
    from .errors import MnnToolError
    from .llm.engine.bench import bandwidth, host_info, rows, run_child
    from .llm.engine.files import open_bundle

    if backend not in ("mnntool", "mnn"):
        raise MnnToolError(f"--backend {backend}: mnntool or mnn")
    open_bundle(bundle)
    counts = _ints_list(threads, "--threads")
    pair = _ints_list(pg, "-pg") if pg else None
    if pair is not None and len(pair) != 2:
        raise MnnToolError(f"-pg {pg}: expected P,N")
    if not p and not n and not pair:
        raise MnnToolError("nothing to measure: -p and -n are 0 and no -pg")
    out = []
    for t in counts:
        bw = bandwidth(t) if n else None
        out.extend(rows(run_child(backend, bundle, t, p, n, reps, pair, exact=exact, kv_int8=kv_int8), bw))
    info = host_info()
    if as_json:
        print(json.dumps([{**info, "model_filename": bundle, **r} for r in out]))
        return
    tb = Table(title=f"{u(bundle)} on {u(info['cpu_info'] or '?')}")
    for col in ("backend", "threads", "test", "t/s", "load s", "peak RSS"):
        tb.add_column(col, justify="right" if col not in ("backend", "test") else "left")
    for r in out:
        tb.add_row(r["backend"], str(r["threads"]), r["test"], f"{r['avg_ts']:.2f} ± {r['stddev_ts']:.2f}",
                   f"{r['load_s']:.2f}", _human(r["peak_rss"], "B"))
    console.print(tb)
    for r in out:
        if "bandwidth_limit_ts" in r:
            console.print(f"{r['backend']} {r['threads']}t {r['test']}: {_human(r['bytes_per_token'], 'B')} read per token, "
                          f"memory read bandwidth {r['bandwidth_read_GBps']:.1f} GB/s -> limit "
                          f"{r['bandwidth_limit_ts']:.1f} tok/s; decode at {100 * r['bandwidth_fraction']:.0f}% of it "
                          f"({r['time_over_limit']:.2f}x the limit's time per token)", highlight=False)


@llm_app.command("eval")
def eval_(bundle: str = typer.Argument(..., help="An MNN-LLM bundle folder."),
          text: str = typer.Option(..., "--text", help="A UTF-8 text file to score."),
          ref: Optional[str] = typer.Option(None, "--ref", help="Compare with: the Hugging Face checkpoint (fp32, "
                                            "transformers) or another bundle: KL divergence and same-top-1."),
          ctx: int = typer.Option(512, "--ctx", min=2, help="Window length in tokens."),
          stride: Optional[int] = typer.Option(None, "--stride", min=1, help="Window step (default ctx/2)."),
          max_tokens: int = typer.Option(0, "--max-tokens", min=0, help="Score the first N tokens (0: all)."),
          default_mode: bool = typer.Option(False, "--default-mode", help="MNN-LLM's default low/low precision "
                                            "(int kernels) instead of its exact float32 mode."),
          threads: int = typer.Option(1, "--threads", "-t", min=1, help="Threads of MNN-LLM and of the transformers "
                                      "reference (per worker)."),
          workers: int = typer.Option(1, "--workers", "-w", min=1, help="Split the windows over N local processes "
                                      "(the same numbers as one)."),
          ray: Optional[str] = typer.Option(None, "--ray", help="Split the windows over a Ray cluster (the same numbers "
                                            "as one process): local, auto, HOST:PORT or ray://HOST[:PORT]."),
          runtime: str = typer.Option("mnn", "--runtime", help="Score the bundle with mnn (MNN-LLM) or mnntool (this "
                                      "runtime's engine)."),
          kv_int8: bool = typer.Option(False, "--kv-int8", help="mnntool's engine with its 8-bit KV cache (implies "
                                       "--runtime mnntool)."),
          as_json: bool = JSON):
    """Perplexity over a text in windows; with --ref, KL divergence per token (llama.cpp's --kl-divergence)."""
    from .errors import MnnToolError
    from .llm.evaluate import evaluate
    if runtime not in ("mnn", "mnntool"):
        raise MnnToolError(f"--runtime {runtime}: mnn or mnntool")
    engine = {"kv_int8": kv_int8} if runtime == "mnntool" or kv_int8 else None
    r = evaluate(bundle, text, ref, ctx, stride, max_tokens, exact=not default_mode, threads=threads,
                 workers=workers, ray=ray, engine=engine)
    if as_json:
        print(json.dumps(r))
        return
    console.print(f"{u(r['bundle'])}: {r['text_tokens']} tokens, {r['windows']} windows of {r['ctx']} ({r['mode']} mode)")
    console.print(f"perplexity {r['ppl']:.4f} ± {r['ppl_err']:.4f}")
    if "ref" in r:
        console.print(f"reference {u(r['ref'])}: perplexity {r['ref_ppl']:.4f}; KL mean {r['kl_mean']:.6f} ± "
                      f"{r['kl_mean_err']:.6f}, p99 {r['kl_p99']:.5f}, max {r['kl_max']:.5f}; same top-1 "
                      f"{100 * r['same_top1']:.2f}%")
    if r.get("note"):
        console.print(f"[yellow]note:[/] {u(r['note'])}")


@llm_app.command("verify")
def verify(bundle: str = typer.Argument(..., help="The bundle folder to check."),
           checkpoint: str = typer.Argument(..., help="The Hugging Face checkpoint folder it was exported from."),
           prompt: Optional[str] = typer.Option(None, "--prompt", "-p", help="Run this text (the bundle's tokenizer)."),
           text: Optional[str] = typer.Option(None, "--text", help="Run a window of this UTF-8 text file."),
           offset: int = typer.Option(0, "--offset", min=0, help="--text: the window's first token."),
           tokens: int = typer.Option(64, "--tokens", "-n", min=2, help="Tokens of the window, or of the seeded "
                                      "random sequence used without --prompt/--text."),
           seed: int = typer.Option(0, "--seed", help="Seed of the random token ids."),
           ref: str = typer.Option("numpy", "--ref", help="The float32 reference: numpy (mnntool's decoder) or "
                                   "transformers."),
           min_cosine: Optional[float] = typer.Option(None, "--min-cosine", help="Pass threshold of every hidden state "
                                                      "and the logits (default by bits: 16: 0.9999, 8: 0.999, 4: 0.99)."),
           thresholds: Optional[str] = typer.Option(None, "--thresholds", help="A .json or .toml file: min_cosine, "
                                                    "[logits] min_cosine/min_top1/max_kl_mean, [[layers]] match/min_cosine."),
           no_mnn: bool = typer.Option(False, "--no-mnn", help="Skip MNN-LLM (the end-to-end logits check)."),
           default_mode: bool = typer.Option(False, "--default-mode", help="MNN-LLM in its default low/low mode "
                                             "(int kernels) instead of exact float32."),
           precision: str = typer.Option("normal", "--precision", help="The engine's: normal or high."),
           threads: int = typer.Option(1, "--threads", "-t", min=1),
           report: Optional[str] = typer.Option(None, "--report", help="Write an HTML report."),
           junit: Optional[str] = typer.Option(None, "--junit", help="Write a JUnit XML report (a case per layer)."),
           out_format: Optional[str] = typer.Option(None, "--output-format", help="text, json or github."),
           as_json: bool = JSON):
    """Per-layer comparison of a bundle with its checkpoint: each decoder layer's hidden state and the logits
    (top-1, KL), in mnntool's engine and MNN-LLM; exit 1 when one misses the thresholds, 3 when the bundle is
    not from this checkpoint, 2 on a user error."""
    from .llm.verify import load_thresholds
    from .llm.verify_report import run_command
    fmt = (out_format or ("json" if as_json else "text")).lower()
    bar = _progress("reference layers", None, shown=fmt != "json")
    with bar as step:
        def progress(total):
            bar.prog.update(bar.prog.task_ids[0], total=total)
            return step
        code = run_command(bundle, checkpoint, fmt, report, junit, print, prompt=prompt, text=text, offset=offset,
                           tokens=tokens, seed=seed, ref=ref, min_cosine=min_cosine,
                           thresholds=load_thresholds(thresholds) if thresholds else None,
                           mnn=False if no_mnn else None, mnn_exact=not default_mode, threads=threads,
                           precision=precision, progress=progress if step else None)
    if code:
        raise typer.Exit(code)
