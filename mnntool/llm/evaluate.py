"""Quality of an MNN-LLM bundle: perplexity on a text and KL divergence to the float32 transformers model.

    ids = tokenize(text, bundle=B, model_dir=HF)["ids"]        # the bundle's tokenizer (checked against HF's)
    ws = windows(ids, ctx=256)                                  # evaluation windows (sliding, stride ctx/2)
    ref = hf_logits(HF, ws)                                     # float32 transformers, every position
    got = mnn_logits(B, ws)                                     # MNN-LLM, every position, one child process
    perplexity(got, ws), perplexity(ref, ws), kl_stats(ref, got, ws)

Windows. `windows(ids, ctx, stride)` slides a `ctx`-token window by `stride` (default ctx/2) and has each
window score only the tokens the previous window did not: every token but the first (it has no context)
is scored exactly once, and each scored token sees at least ctx - stride tokens before it (all of them
in the first window). This is Hugging Face's "strided sliding window" perplexity. llama.cpp's
`perplexity` instead cuts the text into non-overlapping ctx chunks and scores only each chunk's second
half (half the tokens are never scored, each scored one sees >= ctx/2): `windows(..., style="llamacpp")`
gives those windows, for numbers comparable with llama.cpp's (which also puts a BOS at each chunk's start
for models that add one; these windows are plain slices of the token stream). The sliding default is used
because it scores the whole text, with the same minimum context and the same cost per scored token as
llama.cpp's (two tokens run per token scored, at stride ctx/2). The last sliding window is moved back to
end at the text's end, so every window has the same length (one MNN module shape; transformers batches
them). `windows(ids, seq + 1, seq)` scores non-overlapping seq-token stretches (the fixtures' training-time
perplexity).

A window is (start, ids, first): its tokens are ids = text[start:start + len], and the targets scored are
ids[first:], each predicted by the logits of the position before it (rows first-1 .. len-2).

Logits. `mnn_logits` runs MNN-LLM (the `mnn` wheel's MNN.llm) in ONE child process for all windows, as
every use of MNN-LLM here is (it crashes its process on some inputs): `all_logits: true` in the runtime
config makes the prefill graph return every position's logits ([1, n, vocab]; the graph's `logits_index`
input is 0 instead of -1; set before `load()`, or after it at the cost of a module clone), and `reset()`
before each window empties the KV cache and restarts positions at 0 (both checked on mnn 3.6.1: a window's
logits are the same, to float rounding, whether it follows other windows or runs in a fresh process; in
exact mode they equal transformers on the bundle's dequantized weights to ~1e-5). The child writes one
float32 .npy per window into a folder; the parent maps them (np.load mmap_mode="r") and deletes the folder
at once (the mappings keep the data until the arrays are released), so vocab x tokens floats never go
through a pipe or sit twice in memory.
`hf_logits` does the same from transformers in float32 (in this process: transformers is not MNN-LLM),
optionally on a fake-quantized copy (`fake_quantizer`).

Sharding. `evaluate(..., workers=N | ray=ADDRESS)` splits the windows over quant.shards' pool: each shard
runs `window_scores` (its own MNN-LLM child, and the reference) and returns per-window NLL, KL and
same-top-1 arrays; concatenated in window order they are the single process's arrays, so every number is
the same for any split (checked: MNN-LLM's logits of a window do not depend on the windows run before it in
its child, nor on 1 or 2 threads; shards start on multiples of hf_logits' batch).

Statistics, all in float64 over log-softmax:
- `perplexity` = exp(mean negative log-likelihood of the scored tokens); `nll` gives the per-token values.
- `kl_stats(ref, logits, windows)` = KL(P_ref || P) per scored position: mean (and its standard error),
  median, p90, p99, p99.9, max, and the same-top-1 rate, as llama.cpp's `--kl-divergence` reports them.
"""
from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .logit_files import mapped, workdir

ROWS = 1024             # rows per float64 chunk in the statistics (bounds temporaries to ROWS x vocab x 8 bytes)


# ---------------------------------------------------------------------------------------------- windows

@dataclass(frozen=True)
class Window:
    start: int          # offset of ids[0] in the token sequence
    ids: list           # the window's tokens
    first: int          # index (in ids) of the first scored target, >= 1

    @property
    def scored(self) -> int:
        return len(self.ids) - self.first

    def targets(self) -> np.ndarray:
        return np.asarray(self.ids[self.first:], np.int64)


def windows(ids, ctx: int, stride: int | None = None, style: str = "sliding") -> list[Window]:
    """Evaluation windows over `ids` (see the module doc).
    sliding (default): windows of `ctx` tokens every `stride` (default ctx // 2, at most ctx - 1: non-overlapping
        scoring is stride ctx - 1), the last one moved back to end at the sequence's end; each token from the
        second on is scored exactly once.
    llamacpp: non-overlapping `ctx` chunks (a shorter tail is dropped), each scoring its second half."""
    ids = [int(i) for i in ids]
    n = len(ids)
    if ctx < 2:
        raise ValueError(f"ctx {ctx}: at least 2")
    if style == "llamacpp":
        return [Window(s, ids[s:s + ctx], ctx // 2) for s in range(0, n - ctx + 1, ctx)]
    if style != "sliding":
        raise ValueError(f"style {style!r}: 'sliding' or 'llamacpp'")
    stride = ctx // 2 if stride is None else stride
    if not 1 <= stride < ctx:
        raise ValueError(f"stride {stride}: 1..ctx-1 ({ctx - 1}): consecutive windows must overlap by a token, "
                         f"or the token at each window's start goes unscored")
    if n < 2:
        return []
    if n <= ctx:
        return [Window(0, ids, 1)]
    out = [Window(0, ids[:ctx], 1)]
    done = ctx                                  # tokens [0, done) are scored (or the unscorable first)
    while done < n:
        start = min(out[-1].start + stride, n - ctx)
        out.append(Window(start, ids[start:start + ctx], done - start))
        done = start + ctx
    return out


def _scored_rows(a: np.ndarray, w: Window) -> np.ndarray:
    """The rows of a window's logits that predict its scored targets; `a` holds all len(ids) rows or
    just those (rows="scored")."""
    n = len(w.ids)
    if a.shape[0] == n:
        return a[w.first - 1:n - 1]
    if a.shape[0] == w.scored:
        return a
    raise ValueError(f"logits of {a.shape[0]} rows for a window of {n} tokens scoring {w.scored}")


# -------------------------------------------------------------------------------------------- statistics

def log_softmax(x) -> np.ndarray:
    x = np.asarray(x, np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def nll(logits_list, windows_: list[Window]) -> np.ndarray:
    """Negative log-likelihood (nats, float64) of every scored token, in text order."""
    if len(logits_list) != len(windows_):
        raise ValueError(f"{len(logits_list)} logits arrays for {len(windows_)} windows")
    out = []
    for a, w in zip(logits_list, windows_):
        rows, t = _scored_rows(a, w), w.targets()
        for r0 in range(0, len(t), ROWS):
            lp = log_softmax(rows[r0:r0 + ROWS])
            out.append(-lp[np.arange(len(lp)), t[r0:r0 + ROWS]])
    return np.concatenate(out) if out else np.zeros(0)


def perplexity(logits_list, windows_: list[Window]) -> float:
    """exp(mean NLL) over the windows' scored tokens."""
    return float(math.exp(nll(logits_list, windows_).mean()))


def perplexity_stats(logits_list, windows_: list[Window]) -> dict:
    """Perplexity with llama.cpp's uncertainty: ppl * standard error of the mean NLL."""
    return nll_summary(nll(logits_list, windows_))


def nll_summary(v: np.ndarray) -> dict:
    """perplexity_stats from the scored tokens' NLL values (in text order)."""
    ppl = math.exp(v.mean())
    err = float(ppl * v.std() / math.sqrt(max(len(v) - 1, 1)))
    return {"ppl": ppl, "ppl_err": err, "nll": float(v.mean()), "tokens": int(len(v))}


def kl_rows(ref, logits) -> tuple[np.ndarray, np.ndarray]:
    """(KL(P_ref || P) per row, same top-1 per row) of two [rows, vocab] logits arrays, float64."""
    ref, logits = np.asarray(ref), np.asarray(logits)
    if ref.shape != logits.shape:
        raise ValueError(f"reference logits {ref.shape} vs {logits.shape}")
    kl, same = [], []
    for r0 in range(0, len(ref), ROWS):
        lp, lq = log_softmax(ref[r0:r0 + ROWS]), log_softmax(logits[r0:r0 + ROWS])
        kl.append((np.exp(lp) * (lp - lq)).sum(-1))
        same.append(lp.argmax(-1) == lq.argmax(-1))
    if not kl:
        return np.zeros(0), np.zeros(0, bool)
    return np.maximum(np.concatenate(kl), 0.0), np.concatenate(same)


def kl_stats(ref_logits, logits, windows_: list[Window] | None = None) -> dict:
    """KL divergence of `logits` from the reference, per position: mean (± standard error), median, p90, p99,
    p99.9, max, and the same-top-1 rate (± standard error). Arguments are one [rows, vocab] array or lists
    of them (one per window); with `windows_`, only the rows predicting scored tokens count."""
    if isinstance(ref_logits, np.ndarray) and ref_logits.ndim == 2:
        ref_logits, logits = [ref_logits], [logits]
    if len(ref_logits) != len(logits):
        raise ValueError(f"{len(ref_logits)} reference arrays vs {len(logits)}")
    kls, sames = [], []
    for i, (r, q) in enumerate(zip(ref_logits, logits)):
        if windows_ is not None:
            r, q = _scored_rows(r, windows_[i]), _scored_rows(q, windows_[i])
        k, s = kl_rows(r, q)
        kls.append(k)
        sames.append(s)
    return kl_summary(np.concatenate(kls), np.concatenate(sames))


def kl_summary(kl: np.ndarray, same: np.ndarray) -> dict:
    """kl_stats from the per-position KL values and same-top-1 flags (in text order)."""
    n = len(kl)
    if n == 0:
        raise ValueError("no positions to compare")
    p = same.mean()
    return {"kl_mean": float(kl.mean()), "kl_mean_err": float(kl.std() / math.sqrt(max(n - 1, 1))),
            "kl_median": float(np.percentile(kl, 50)), "kl_p90": float(np.percentile(kl, 90)),
            "kl_p99": float(np.percentile(kl, 99)), "kl_p999": float(np.percentile(kl, 99.9)),
            "kl_max": float(kl.max()), "same_top1": float(p),
            "same_top1_err": float(math.sqrt(p * (1 - p) / max(n - 1, 1))), "positions": int(n)}


# ------------------------------------------------------------------------------------- logits storage

_mapped, _workdir = mapped, workdir       # (their home is logit_files: engine/score.py uses them too)


# ------------------------------------------------------------------------------------ MNN-LLM (child)

_CHILD = r'''
import json, os, sys, time
import numpy as np
work = sys.argv[1]
args = json.load(open(os.path.join(work, "args.json")))
import MNN.llm as llm
m = llm.create(args["config"])
t = time.perf_counter()
m.load()
out = {"load_s": time.perf_counter() - t}
if args["encode"] is not None:
    for i, s in enumerate(args["encode"]):
        np.save(os.path.join(work, "enc_%d.npy" % i), np.asarray(m.tokenizer_encode(s), np.int64))
wins = args["windows"]
t = time.perf_counter()
for i, ids in enumerate(wins):
    m.reset()                       # empty KV cache, positions from 0
    v = m.forward(ids)
    shape = list(v.shape)
    a = np.array(v.read(), dtype=np.float32, copy=True)
    del v
    if len(shape) != 3 or shape[1] != len(ids):
        print("\nERROR all_logits not honoured: logits shape %s for %d tokens" % (shape, len(ids)))
        sys.stdout.flush()
        os._exit(3)
    a = a.reshape(shape[1], shape[2])
    if args["rows"] == "scored":
        a = a[args["first"][i] - 1:len(ids) - 1]
    np.save(os.path.join(work, "win_%d.npy" % i), a)
out["forward_s"] = time.perf_counter() - t
out["tokens"] = sum(len(w) for w in wins)
print("\nRESULT " + json.dumps(out))
sys.stdout.flush()
os._exit(0)
'''


def _mnn_child(bundle, work: Path, wins: list[Window], exact: bool, threads: int, rows: str,
               encode: list[str] | None, timeout: float) -> dict:
    from .mnn_llm import runtime_config      # settings through config.json: MNN-LLM reads them at create()
    args = {"config": runtime_config(bundle, work, threads, exact, all_logits=True),
            "windows": [list(w.ids) for w in wins], "first": [w.first for w in wins], "rows": rows,
            "encode": encode}
    (work / "args.json").write_text(json.dumps(args))
    p = subprocess.run([sys.executable, "-c", _CHILD, str(work)], capture_output=True, text=True,
                       timeout=timeout)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    err = [ln for ln in p.stdout.splitlines() if ln.startswith("ERROR ")]
    tail = err[0][6:] if err else " | ".join((p.stdout + p.stderr).strip().splitlines()[-4:])
    raise RuntimeError(f"MNN-LLM failed on {bundle} (exit {p.returncode}): {tail[:500]}")


def mnn_logits(bundle, windows_: list[Window], exact: bool = True, threads: int = 1, rows: str = "all",
               tmp_dir=None, timeout: float = 3600, info: dict | None = None) -> list[np.ndarray]:
    """Logits of every position of each window from MNN-LLM: float32 [len(ids), vocab] arrays (rows="scored":
    only the rows predicting scored targets), memory-mapped. One child process runs all windows, resetting
    the engine before each. `exact` sets precision/memory high (float32 arithmetic; the bundle's default
    low/low uses dynamic-quantized int kernels). `info` (a dict) receives the child's timings."""
    if rows not in ("all", "scored"):
        raise ValueError(f"rows {rows!r}: 'all' or 'scored'")
    work = _workdir(tmp_dir)
    try:
        res = _mnn_child(bundle, work, windows_, exact, threads, rows, None, timeout)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    if info is not None:
        info.update(res)
    return _mapped(work, len(windows_))


def mnn_encode(bundle, texts: list[str] | str, timeout: float = 600) -> list:
    """Token ids of each text through the bundle's tokenizer (MNN-LLM's `tokenizer_encode`, in a child)."""
    single = isinstance(texts, str)
    texts = [texts] if single else list(texts)
    work = _workdir(None)
    try:
        _mnn_child(bundle, work, [], False, 1, "all", texts, timeout)
        out = [np.load(work / f"enc_{i}.npy").astype(int).tolist() for i in range(len(texts))]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out[0] if single else out


# --------------------------------------------------------------------------------------- transformers

def _transformers():
    # torchvision 0.28 is a CUDA wheel whose C ops do not load beside torch+cpu; its Python modules do:
    # skip its op registrations (as fixtures/zoo.py does) so transformers imports
    sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))
    import transformers
    return transformers


def hf_encode(model_dir, text: str) -> list[int]:
    """Token ids of `text` through the checkpoint's Hugging Face tokenizer (special tokens as it adds them:
    MNN-LLM's tokenizer prepends the same prefix ids)."""
    t = _transformers()
    tok = t.AutoTokenizer.from_pretrained(str(model_dir))
    verbosity = t.logging.get_verbosity()
    t.logging.set_verbosity_error()             # "sequence longer than model_max_length": not a model input
    try:
        return list(tok(text)["input_ids"])
    finally:
        t.logging.set_verbosity(verbosity)


def tokenize(text: str, bundle=None, model_dir=None) -> dict:
    """Token ids of `text`: {"ids", "mnn", "hf", "agree", "first_diff"}. `ids` are the bundle's (MNN-LLM's
    tokenizer) when a bundle is given, else HF's; with both, `agree` says whether they are the same and
    `first_diff` where they first differ (None when they agree)."""
    if bundle is None and model_dir is None:
        raise ValueError("tokenize: a bundle or a model folder")
    m = mnn_encode(bundle, text) if bundle is not None else None
    h = hf_encode(model_dir, text) if model_dir is not None else None
    out = {"ids": m if m is not None else h, "mnn": m, "hf": h, "agree": None, "first_diff": None}
    if m is not None and h is not None:
        out["agree"] = m == h
        if m != h:
            out["first_diff"] = next((i for i, (a, b) in enumerate(zip(m, h)) if a != b), min(len(m), len(h)))
    return out


def fake_quantizer(bits: int = 4, block: int = 64, symmetric: bool = False, hqq: bool = False,
                   lm_bits: int | None = None, lm_block: int | None = None, embed_bf16: bool = True):
    """A function that rounds a transformers causal LM's weights in place as a bundle stores them: every
    nn.Linear through mnntool's quantize/dequantize (the head at lm_bits/lm_block), the input embeddings
    to bfloat16 (untied models keep them as bf16; a tied head's table is the quantized head)."""
    import torch
    from .quantize import dequantize, quantize

    def q(w: torch.Tensor, b: int, blk: int) -> torch.Tensor:
        if b == 16:
            return w.to(torch.bfloat16).to(w.dtype)
        return torch.from_numpy(dequantize(quantize(w.detach().float().numpy(), b, blk, symmetric, hqq)))

    @torch.no_grad()
    def apply(model) -> None:
        head = model.get_output_embeddings()
        emb = model.get_input_embeddings()
        tied = head is not None and head.weight.data_ptr() == emb.weight.data_ptr()
        for mod in model.modules():
            if isinstance(mod, torch.nn.Linear) and mod is not head:
                mod.weight.copy_(q(mod.weight, bits, block))
        if head is not None:
            head.weight.copy_(q(head.weight, lm_bits or bits, block if lm_block is None else lm_block))
        if embed_bf16 and not tied:
            emb.weight.copy_(emb.weight.to(torch.bfloat16).float())
    return apply


def hf_logits(model_dir, windows_: list[Window], fake_quant=None, rows: str = "all", batch: int = 8,
              tmp_dir=None, threads: int | None = None) -> list[np.ndarray]:
    """Logits of every position of each window from transformers in float32 (no trust_remote_code),
    as mnn_logits returns them. `fake_quant(model)` (e.g. `fake_quantizer(4, 64)`) edits the weights first."""
    if rows not in ("all", "scored"):
        raise ValueError(f"rows {rows!r}: 'all' or 'scored'")
    t = _transformers()
    import torch
    if threads:
        torch.set_num_threads(threads)
    model = t.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    if fake_quant is not None:
        fake_quant(model)
    work = _workdir(tmp_dir)
    try:
        i = 0
        while i < len(windows_):
            n = len(windows_[i].ids)                # batch consecutive windows of one length
            j = i
            while j < len(windows_) and j - i < batch and len(windows_[j].ids) == n:
                j += 1
            x = torch.tensor([windows_[k].ids for k in range(i, j)], dtype=torch.long)
            with torch.no_grad():
                out = model(input_ids=x, use_cache=False).logits.float().numpy()
            for k in range(i, j):
                a = out[k - i]
                if rows == "scored":
                    a = a[windows_[k].first - 1:n - 1]
                np.save(work / f"win_{k}.npy", np.ascontiguousarray(a, np.float32))
            i = j
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return _mapped(work, len(windows_))


# ------------------------------------------------------------------------------------------- llm eval

HF_BATCH = 8            # hf_logits' batch; shards of the windows start on its multiples (the same batches)


def window_scores(bundle, windows_: list[Window], ref=None, exact: bool = True, threads: int = 1,
                  engine: dict | None = None) -> list[dict]:
    """What the statistics need of each window, computed where its logits are: {"nll"} (the scored
    tokens' NLL), and with `ref` (a checkpoint folder or a bundle) {"ref_nll", "kl", "same"} too. A shard
    of `llm eval --workers/--ray` runs this on its windows (MNN-LLM in a child process of the worker, as
    everywhere), so only these small arrays come back, never vocab x tokens logits. The single process
    runs it on all windows: the same function on the same windows gives the same values, so any split
    concatenates to the single process's arrays exactly. `engine` ({"kv_int8": bool}): the bundle's logits
    from mnntool's engine (engine/score.py) instead of MNN-LLM."""
    if engine is not None:
        from .engine.score import engine_logits
        got = engine_logits(bundle, windows_, threads=threads, **engine)
    else:
        got = mnn_logits(bundle, windows_, exact=exact, threads=threads)
    out = [{"nll": nll([a], [w])} for a, w in zip(got, windows_)]
    if ref is not None:
        ref = Path(ref)
        r = (mnn_logits(ref, windows_, exact=exact, threads=threads) if (ref / "llm.mnn").is_file()
             else hf_logits(ref, windows_, batch=HF_BATCH, threads=threads))
        for o, a, b, w in zip(out, r, got, windows_):
            o["ref_nll"] = nll([a], [w])
            o["kl"], o["same"] = kl_rows(_scored_rows(a, w), _scored_rows(b, w))
        del r
    del got
    return out


def _shard(windows_: list[Window], bundle: str, ref: str | None, exact: bool, threads: int,
           engine: dict | None = None) -> list[dict]:
    """window_scores of one shard of the windows (a pool worker or a Ray task: split_map's argument order)."""
    return window_scores(bundle, windows_, ref, exact, threads, engine)


def _scores(bundle, ws: list[Window], ref, exact: bool, threads: int, workers: int, ray: str | None,
            engine: dict | None = None) -> list[dict]:
    """window_scores of every window, in one process or split over a pool (quant.shards: local processes,
    or Ray tasks on the cluster `ray` names); shards of whole HF_BATCH groups, in window order."""
    if workers <= 1 and ray is None:
        return window_scores(bundle, ws, ref, exact, threads, engine)
    from ..quant.shards import pool, split_map
    with pool(workers, ray) as shards:
        if shards is None:
            return window_scores(bundle, ws, ref, exact, threads, engine)
        return split_map(shards, _shard, ws, str(bundle), None if ref is None else str(ref), exact, threads,
                         engine, align=HF_BATCH)


def evaluate(bundle, text_path, ref=None, ctx: int = 512, stride: int | None = None, max_tokens: int = 0,
             exact: bool = True, threads: int = 1, style: str = "sliding", workers: int = 1,
             ray: str | None = None, engine: dict | None = None) -> dict:
    """`mnntool llm eval`: perplexity of the bundle (MNN-LLM's logits) over a text in windows, and with `ref`
    (a Hugging Face checkpoint folder, run by transformers in float32 on `threads` threads, or another
    bundle) the KL divergence per token to it (mean, p99, max) and the same-top-1 rate. The text is
    tokenized by the bundle's own tokenizer. `workers` local processes, or Ray tasks on the cluster `ray`
    names, split the windows and give the single process's numbers exactly (each node needs mnntool, the
    `mnn` wheel and the bundle under the same path). `engine` ({"kv_int8": bool}): the bundle scored by
    mnntool's engine (engine/score.py) instead of MNN-LLM; the reference is run as without it."""
    from .text import read_text
    from ..errors import MnnToolError
    text = read_text(text_path)
    bundle = Path(bundle)
    if not (bundle / "config.json").is_file():
        raise MnnToolError(f"{bundle}: not an MNN-LLM bundle (no config.json)")
    ids = mnn_encode(bundle, text)
    if max_tokens:
        ids = ids[:max_tokens]
    if len(ids) < 2:
        raise MnnToolError(f"{text_path}: {len(ids)} tokens; nothing to score")
    ctx = min(ctx, len(ids))
    ws = windows(ids, ctx, stride, style)
    scores = _scores(bundle.resolve(), ws, None if ref is None else Path(ref).resolve(), exact, threads, workers, ray,
                     engine)
    joined = lambda key: np.concatenate([s[key] for s in scores])       # noqa: E731 - text order
    out = {"bundle": str(bundle), "text": str(text_path), "text_tokens": len(ids), "ctx": ctx,
           "stride": ws[1].start - ws[0].start if len(ws) > 1 else ctx, "windows": len(ws),
           "mode": "exact" if exact else "default", **nll_summary(joined("nll"))}
    if engine is not None:
        out["runtime"], out["mode"] = "mnntool", "int8 KV cache" if engine.get("kv_int8") else "float32 KV cache"
    if ref is not None:
        ref = Path(ref)
        if not (ref / "llm.mnn").is_file() and hf_encode(ref, text)[:len(ids)] != ids:
            out["note"] = "the checkpoint's tokenizer and the bundle's differ on this text; scored with the bundle's ids"
        out["ref"] = str(ref)
        out["ref_ppl"] = float(math.exp(joined("ref_nll").mean()))
        out.update(kl_summary(joined("kl"), joined("same")))
    return out
