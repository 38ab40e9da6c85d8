"""Quality of MNN-LLM bundles from `mnntool llm export` and from MNN's own `llmexport`, on one trained model:
perplexity of a held-out text through MNN-LLM's logits, and KL divergence to the float32 transformers model.

    python benchmarks/llm_quality.py [CHECKPOINT] [--size test|bench] [--text FILE] [--ctx N] [--stride N]
        [--max-tokens 16384] [--bits 4 8] [--block 64] [--modes exact default] [--threads 2] [--work DIR] [--json]

CHECKPOINT is a Hugging Face causal-LM folder; without it, fixtures/llm_checkpoints.build_trained builds
(or reuses) the trained Llama of --size in build/fixtures/llm-trained-SIZE. The text is CHECKPOINT/heldout.txt
(files the model and its tokenizer never saw) unless --text names another.

For each --bits (block --block, asymmetric: both tools' default) the checkpoint is exported by mnntool
(`mnntool.llm.bundle.export`) and by llmexport (benchmarks/llmexport_ref.py, in a child process), both
with the head at the same bits as the body (llmexport's --lm_quant_bit defaults to --quant_bit, mnntool's
lm_bits to bits; the report reads both back from export_args.json / export.json). Each bundle is scored
through MNN-LLM (mnntool.llm.evaluate.mnn_logits, one child process per bundle and mode):
- mode "exact": precision/memory high, float32 arithmetic on the stored weights: the bundle's own quality;
- mode "default": the bundle's low/low, int weights through dynamic-quantized kernels (what users run).
Reported per bundle: perplexity (± llama.cpp's standard error), its change against fp32, and against
float32 transformers' logits: mean KL (± s.e.), p99, max, same top-1 rate. Token ids are the Hugging Face
tokenizer's; each bundle's tokenizer (MNN-LLM's tokenizer_encode) is checked to give the same ids on the
whole text ("tok" column). With both tools, the second tool's rows also give the largest logit difference
and the mean KL between the two tools' bundles at the same settings and mode (JSON only).

Windows: evaluate.windows, sliding, ctx tokens every stride (default ctx/2): every token scored once with
at least ctx/2 tokens of context (except in the first window).
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import numpy as np  # noqa: E402

from mnntool.llm import evaluate as ev  # noqa: E402


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def bundle_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file() and not p.name.endswith(".json"))


def head_bits_of(folder: Path, tool: str):
    """(body bits, head bits, head block) as the tool recorded them."""
    if tool == "llmexport":
        a = json.loads((folder / "export_args.json").read_text())
        return a["quant_bit"], a["lm_quant_bit"], a["lm_quant_block"]
    s = json.loads((folder / "export.json").read_text())["settings"]
    return s["bits"], s["lm_bits"], s["lm_block"]


def calibration_text(src: Path, work: Path) -> Path:
    """AWQ's calibration text: ~100 KB of the stdlib files the model was trained on (recipe.json's
    train_files found in this Python's stdlib), never the held-out text."""
    import sysconfig
    recipe = json.loads((src / "recipe.json").read_text()) if (src / "recipe.json").exists() else {}
    held = set(recipe.get("heldout_files", []))
    lib = Path(sysconfig.get_paths()["stdlib"])
    names = [n for n in recipe.get("train_files", sorted(p.name for p in lib.glob("*.py"))) if n not in held]
    text, path = "", work / "calib.txt"
    for n in names:
        if (lib / n).is_file() and len(text) < 100_000:
            text += (lib / n).read_text(encoding="utf-8", errors="replace")
    path.write_text(text[:100_000], encoding="utf-8")
    return path


def export_both(src: Path, work: Path, bits: int, block: int, tools: list[str]) -> list[dict]:
    out = []
    for tool in tools:
        dst = work / f"{tool}-q{bits}-b{block}"
        t0 = time.perf_counter()
        if tool.startswith("mnntool"):
            from mnntool.llm.bundle import export
            opts = tool.split("-")[1:]          # mnntool-hqq, mnntool-awq, mnntool-awq-hqq
            export(src, dst, bits=bits, block=block, overwrite=True, hqq="hqq" in opts,
                   calib_text=calibration_text(src, work) if "awq" in opts else None)
        else:
            import shutil

            import llmexport_ref
            shutil.rmtree(dst, ignore_errors=True)
            llmexport_ref.run(src, dst, bits=bits, block=block)
        wall = time.perf_counter() - t0
        b, hb, hblk = head_bits_of(dst, tool)
        out.append({"tool": tool, "bundle": str(dst), "bits": b, "block": block, "head_bits": hb,
                    "head_block": hblk, "export_s": round(wall, 2), "bytes": bundle_bytes(dst)})
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", nargs="?", help="Hugging Face folder (default: the trained fixture of --size)")
    ap.add_argument("--size", default="bench", choices=["test", "bench"])
    ap.add_argument("--text", help="text file to score (default CHECKPOINT/heldout.txt)")
    ap.add_argument("--ctx", type=int, default=None, help="window length (default: the fixture's training "
                    "sequence length from recipe.json, else 256)")
    ap.add_argument("--stride", type=int, default=None)
    ap.add_argument("--max-tokens", type=int, default=16384, help="score the text's first N tokens (0: all)")
    ap.add_argument("--bits", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--modes", nargs="+", default=["exact", "default"], choices=["exact", "default"])
    ap.add_argument("--tools", nargs="+", default=["mnntool", "llmexport"],
                    choices=["mnntool", "llmexport", "mnntool-hqq", "mnntool-awq", "mnntool-awq-hqq"])
    ap.add_argument("--threads", type=int, default=2, help="MNN-LLM threads (quality does not depend on it)")
    ap.add_argument("--work", help="folder for the bundles (default: a temporary folder, removed)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    ap.add_argument("--table", metavar="JSON", help="print the table of an earlier --json result and exit")
    a = ap.parse_args(argv)
    if a.table:
        print(table(json.loads(Path(a.table).read_text())))
        return

    if a.checkpoint:
        src = Path(a.checkpoint)
    else:
        from fixtures.llm_checkpoints import build_trained
        src = build_trained(ROOT / "build" / "fixtures" / f"llm-trained-{a.size}", a.size)
    recipe = src / "recipe.json"
    params = json.loads(recipe.read_text()).get("params") if recipe.exists() else None
    a.ctx = a.ctx or (params or {}).get("seq") or 256
    text_path = Path(a.text) if a.text else src / "heldout.txt"
    text = text_path.read_text(encoding="utf-8")
    log = (lambda *x: print(*x, file=sys.stderr, flush=True))

    tmp = tempfile.TemporaryDirectory(prefix="llm_quality_") if not a.work else None
    work = Path(a.work or tmp.name)
    work.mkdir(parents=True, exist_ok=True)
    try:
        hf_ids = ev.hf_encode(src, text)
        ids = hf_ids[:a.max_tokens + 1] if a.max_tokens else hf_ids
        ws = ev.windows(ids, a.ctx, a.stride)
        log(f"{len(ids)} tokens of {len(hf_ids)}, {len(ws)} windows of {a.ctx}")
        t0 = time.perf_counter()
        ref = ev.hf_logits(src, ws, tmp_dir=work)
        fp32 = ev.perplexity_stats(ref, ws)
        fp32["seconds"] = round(time.perf_counter() - t0, 1)
        log(f"fp32 transformers: ppl {fp32['ppl']:.3f} ({fp32['seconds']} s)")

        rows = []
        for bits in a.bits:
            first_tool = {}
            for b in export_both(src, work, bits, a.block, a.tools):
                tok = ev.mnn_encode(b["bundle"], text)
                b["tokenizer_agrees"] = tok == hf_ids
                if tok != hf_ids:
                    b["tokenizer_first_diff"] = next((i for i, (x, y) in enumerate(zip(tok, hf_ids)) if x != y),
                                                     min(len(tok), len(hf_ids)))
                for mode in a.modes:
                    info = {}
                    got = ev.mnn_logits(b["bundle"], ws, exact=mode == "exact", threads=a.threads, tmp_dir=work,
                                        info=info)
                    r = dict(b, mode=mode, **ev.perplexity_stats(got, ws), **ev.kl_stats(ref, got, ws),
                             mnn_forward_s=round(info["forward_s"], 1))
                    r["ppl_change"] = r["ppl"] / fp32["ppl"] - 1
                    other = first_tool.get(mode)
                    if other is None:
                        first_tool[mode] = (b["tool"], got)
                    else:                   # the same settings from the other tool: how far apart are the logits
                        r["vs_tool"] = other[0]
                        r["max_abs_diff_vs_tool"] = max(float(np.abs(x - y).max()) for x, y in zip(other[1], got))
                        r["kl_vs_tool"] = ev.kl_stats(other[1], got, ws)["kl_mean"]
                    del got
                    rows.append(r)
                    log(f"{b['tool']} q{bits} {mode}: ppl {r['ppl']:.3f}, KL {r['kl_mean']:.5f}, "
                        f"top-1 {r['same_top1']:.4f} ({r['mnn_forward_s']} s)")
        del ref, first_tool
    finally:
        if tmp:
            tmp.cleanup()

    res = {"checkpoint": str(src), "recipe": params,
           "text": str(text_path), "text_tokens": len(hf_ids), "tokens": len(ids), "scored": fp32["tokens"],
           "ctx": a.ctx, "stride": a.stride or a.ctx // 2, "windows": len(ws), "cpu": cpu_model(),
           "threads": a.threads, "fp32": fp32, "bundles": rows}
    print(json.dumps(res, indent=1) if a.json else table(res))


def table(res: dict) -> str:
    """The markdown table of a result (main's JSON)."""
    fp32, rows = res["fp32"], res["bundles"]
    out = [f"{Path(res['checkpoint']).name}: {res['scored']} tokens of {Path(res['text']).name} scored "
           f"(of {res['text_tokens']}), windows of {res['ctx']}, stride {res['stride']}; CPU {res['cpu']}, "
           f"MNN-LLM {res['threads']} thread(s)", ""]
    out.append("| bundle | bits / block | head bits | size MB | MNN mode | tok | PPL | ΔPPL | mean KL | p99 KL "
          "| max KL | same top-1 |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    out.append(f"| transformers fp32 | 32 | 32 | | | | {fp32['ppl']:.3f} ± {fp32['ppl_err']:.3f} | | | | | |")
    for r in rows:
        out.append(f"| {r['tool']} | {r['bits']} / {r['block']} | {r['head_bits']} | {r['bytes'] / 1e6:.2f} "
                   f"| {r['mode']} | {'=' if r['tokenizer_agrees'] else 'DIFF'} | {r['ppl']:.3f} ± {r['ppl_err']:.3f} "
                   f"| {100 * r['ppl_change']:+.2f}% | {_g(r['kl_mean'])} ± {_g(r['kl_mean_err'])} "
                   f"| {_g(r['kl_p99'])} | {_g(r['kl_max'])} | {100 * r['same_top1']:.2f}% |")
    return "\n".join(out)


def _g(x: float) -> str:
    return f"{x:.3g}"


if __name__ == "__main__":
    main()
