"""`mnntool llm verify BUNDLE CKPT`: which decoder layer of an exported bundle drifts from its checkpoint?

The same token ids go through
  (a) the checkpoint in float32: mnntool's numpy decoder (reference.py, layer by layer, straight from the
      safetensors) or, with ref="transformers", the transformers model (hooks on its decoder layers);
  (b) the bundle in mnntool's engine, each layer's output read through `Model.on_layer`;
  (c) the bundle in MNN-LLM (`MNN.llm`, in a child process, every position's logits: evaluate.mnn_logits),
      the end-to-end check of the file MNN-LLM itself loads.
Per layer the hidden state after the block (residual stream, T x hidden) is compared: cosine, max abs,
relative L2 (compare.metrics); the logits of every position also by top-1 agreement and KL(P_ref || P).
The errors accumulate along the residual stream, so the first failing layer is where to look.

Thresholds depend on the weights' bits (the lowest of the bundle's block linears): a 4-bit bundle of a
trained model keeps every hidden state at cosine >= 0.99 against the float model (measured 0.998 on the
fixtures' trained Llama, 0.9989 on the 10M "bench" one), 8-bit >= 0.999, 16-bit >= 0.9999. Random-weight
checkpoints do not survive 4-bit rounding (cosine 0.8-0.95): verify them at 8 or 16 bits, or loosen the
thresholds. `--min-cosine` and a thresholds file (load_thresholds) override the defaults.

Verdict (`result["exit_code"]`): 0 every layer and the logits meet the thresholds; 1 one misses them;
3 the bundle is not from this checkpoint: its sizes (hidden, layers, vocab, heads, head size, MLP width)
differ from the checkpoint's, or its embeddings of the tokens used do not match the checkpoint's
(cosine < SAME_MODEL_MIN_COSINE; a 4-bit table stays above 0.98, another model's is near 0). 2 (a user
error) is any MnnToolError.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ..compare import metrics
from ..errors import MnnToolError

SCHEMA = "mnntool.llm.verify/1"
EXIT_PASS, EXIT_FAIL, EXIT_USER, EXIT_NOT_SAME_MODEL = 0, 1, 2, 3
SAME_MODEL_MIN_COSINE = 0.5
DEFAULT_TOKENS = 64

# per bits: hidden-state cosine per layer, and the logits' cosine, top-1 agreement and mean KL (nats)
DEFAULTS = {
    16: {"min_cosine": 0.9999, "logits": {"min_cosine": 0.9999, "min_top1": 0.98, "max_kl_mean": 1e-3}},
    8: {"min_cosine": 0.999, "logits": {"min_cosine": 0.999, "min_top1": 0.95, "max_kl_mean": 5e-3}},
    4: {"min_cosine": 0.99, "logits": {"min_cosine": 0.99, "min_top1": 0.80, "max_kl_mean": 0.05}},
}
LOGIT_KEYS = ("min_cosine", "min_top1", "max_kl_mean")


# -------------------------------------------------------------------------------------------- thresholds

def load_thresholds(path) -> dict:
    """A .json or .toml file: top-level `min_cosine` (every layer), `[logits]` with min_cosine, min_top1,
    max_kl_mean, and `[[layers]]` entries {match = "layer 1*", min_cosine = ...} (fnmatch on the row's name:
    "embed", "layer 0", ...; the first match wins).

        min_cosine = 0.995
        [logits]
        min_top1 = 0.9
        [[layers]]
        match = "layer 2[0-9]"
        min_cosine = 0.98
    """
    import json
    import tomllib
    path = Path(path)
    if not path.is_file():
        raise MnnToolError(f"--thresholds {path}: no such file")
    toml = path.suffix.lower() == ".toml"
    try:
        data = tomllib.loads(path.read_text()) if toml else json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise MnnToolError(f"--thresholds {path}: not valid {'TOML' if toml else 'JSON'} "
                           f"({' '.join(str(e).split())[:120]})") from None
    if not isinstance(data, dict):
        raise MnnToolError(f"--thresholds {path}: expected an object/table at the top")

    def number(v, key, where):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (v >= 0.0) or \
                (key != "max_kl_mean" and v > 1.0):
            raise MnnToolError(f"--thresholds {path}: {where}{key} {v!r} must be "
                               f"{'at least 0' if key == 'max_kl_mean' else 'in [0, 1]'}")
        return float(v)
    bad = set(data) - {"min_cosine", "logits", "layers"}
    if bad:
        raise MnnToolError(f"--thresholds {path}: unknown key(s) {', '.join(sorted(bad))} (min_cosine, logits, layers)")
    out: dict = {"file": str(path), "layers": []}
    if "min_cosine" in data:
        out["min_cosine"] = number(data["min_cosine"], "min_cosine", "")
    lg = data.get("logits", {})
    if not isinstance(lg, dict) or set(lg) - set(LOGIT_KEYS):
        raise MnnToolError(f"--thresholds {path}: logits is a table of {', '.join(LOGIT_KEYS)}")
    out["logits"] = {k: number(v, k, "logits.") for k, v in lg.items()}
    layers = data.get("layers", [])
    if not isinstance(layers, list):
        raise MnnToolError(f"--thresholds {path}: layers is a list of {{match, min_cosine}}")
    for k, d in enumerate(layers):
        if not isinstance(d, dict) or not isinstance(d.get("match"), str) or set(d) != {"match", "min_cosine"}:
            raise MnnToolError(f"--thresholds {path}: layers[{k}] needs exactly 'match' (a pattern) and 'min_cosine'")
        out["layers"].append({"match": d["match"], "min_cosine": number(d["min_cosine"], "min_cosine", f"layers[{k}].")})
    return out


def thresholds_for(bits: int, min_cosine: float | None = None, file: dict | None = None) -> dict:
    """The limits in force: the defaults for `bits`, then the file's, then --min-cosine (layers and logits)."""
    base = DEFAULTS[16 if bits >= 16 else 8 if bits >= 8 else 4]
    t = {"bits": bits, "min_cosine": base["min_cosine"], "logits": dict(base["logits"]), "layers": [],
         "source": f"defaults for {bits}-bit weights"}
    if file:
        t["min_cosine"] = file.get("min_cosine", t["min_cosine"])
        t["logits"].update(file.get("logits", {}))
        t["layers"] = list(file.get("layers", []))
        t["source"] += f", then {file['file']}"
    if min_cosine is not None:
        if not 0.0 <= min_cosine <= 1.0:
            raise MnnToolError(f"--min-cosine must be in [0, 1], got {min_cosine}")
        t["min_cosine"] = t["logits"]["min_cosine"] = float(min_cosine)
        t["source"] += ", then --min-cosine"
    return t


def _layer_limit(t: dict, name: str) -> float:
    from fnmatch import fnmatchcase
    hit = next((r for r in t["layers"] if fnmatchcase(name, r["match"])), None)
    return hit["min_cosine"] if hit else t["min_cosine"]


# ------------------------------------------------------------------------------------------------ tokens

def _tokenizer(files):
    from .engine.tokenizer import Tokenizer
    if files.tokenizer is None or not Path(files.tokenizer).is_file():
        return None
    try:
        return Tokenizer(files.tokenizer)
    except MnnToolError:
        return None         # not a BPE tokenizer.mtok: MNN-LLM's own encoder is asked instead


def _encode(bundle, files, text: str) -> list:
    tok = _tokenizer(files)
    if tok is not None:
        return tok.encode(text)
    import importlib.util
    if importlib.util.find_spec("MNN") is None:
        raise MnnToolError(f"{files.root}: mnntool reads BPE tokenizers only and MNN is not installed to encode "
                           "the text: give no --prompt/--text (seeded random ids)")
    from .evaluate import mnn_encode
    return mnn_encode(bundle, text)


def token_ids(bundle, files, vocab: int, prompt: str | None = None, text=None, offset: int = 0,
              count: int = DEFAULT_TOKENS, seed: int = 0) -> tuple[list, dict]:
    """(ids, what the report says of them): the prompt's ids, a window of a text file's, or `count` ids drawn
    uniformly from the tokenizer's vocabulary by a generator seeded with `seed`."""
    if prompt is not None and text is not None:
        raise MnnToolError("--prompt and --text: give one")
    if count < 2:
        raise MnnToolError(f"--tokens {count}: at least 2")
    if prompt is not None:
        ids = _encode(bundle, files, prompt)
        if not ids:
            raise MnnToolError("--prompt: the text has no tokens")
        return ids, {"kind": "prompt", "text": prompt, "tokens": len(ids)}
    if text is not None:
        from .text import read_text
        all_ids = _encode(bundle, files, read_text(text))
        if offset < 0 or offset + 2 > len(all_ids):
            raise MnnToolError(f"{text}: {len(all_ids)} tokens; no window of 2 or more from --offset {offset}")
        ids = all_ids[offset:offset + count]
        return ids, {"kind": "text", "file": str(text), "offset": offset, "tokens": len(ids)}
    tok = _tokenizer(files)
    n = min(vocab, len(tok.model.table)) if tok is not None else vocab
    ids = np.random.default_rng(seed).integers(0, n, count).tolist()
    return ids, {"kind": "random", "seed": seed, "tokens": count, "range": [0, n],
                 "distribution": f"uniform token ids in [0, {n}), numpy default_rng({seed})"}


# --------------------------------------------------------------------------------------------- reference

def numpy_reference(ck, spec, ids, progress=None) -> tuple[list, np.ndarray]:
    """([embeddings, layer 0 output, ...], logits (T, vocab)) of the checkpoint in float32 numpy."""
    from .decoder import Decoder, QuantPlan
    from .reference import LayerwiseModel
    dec = Decoder(spec, ck, None, QuantPlan())
    model = LayerwiseModel(spec, dec.tensor, dec.maybe)
    hs = [model.embed(np.asarray(ids))]
    for i in range(spec.layers):
        hs.append(model.layer(i, hs[-1], dec.layer_weights(i)))
        if progress:
            progress(1)
    h = model.norm(hs[-1], spec.names["final_norm"], spec.hidden)
    name = spec.names["embed"] if spec.tied or not ck.has(spec.names["head"]) else spec.names["head"]
    logits = h @ dec.tensor(name, (spec.vocab, spec.hidden)).T
    if spec.final_softcap:
        logits = np.tanh(logits / spec.final_softcap) * spec.final_softcap
    return hs, logits.astype(np.float32)


def transformers_reference(model_dir, layers: int, ids, progress=None) -> tuple[list, np.ndarray]:
    """The same from transformers in float32: the first decoder layer's input and every layer's output
    through forward hooks (hidden_states of the output would be after the final norm for the last)."""
    from .evaluate import _transformers
    t = _transformers()
    import torch
    t.utils.logging.disable_progress_bar()        # "Loading weights" would print over the report
    model = t.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    stacks = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == layers]
    if not stacks:
        raise MnnToolError(f"{model_dir}: transformers' model has no list of {layers} decoder layers to hook")
    blocks = stacks[0]
    hs: list = [None] * (layers + 1)

    def first(i):
        def hook(mod, args, kwargs):
            x = args[0] if args else kwargs.get("hidden_states")
            if i == 0:
                hs[0] = x[0].detach().float().numpy().copy()
        return hook

    def after(i):
        def hook(mod, args, out):
            x = out[0] if isinstance(out, (tuple, list)) else out
            hs[i + 1] = x[0].detach().float().numpy().copy()
            if progress:
                progress(1)
        return hook
    handles = [blocks[0].register_forward_pre_hook(first(0), with_kwargs=True)]
    handles += [b.register_forward_hook(after(i)) for i, b in enumerate(blocks)]
    try:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([list(ids)]), use_cache=False).logits[0].float().numpy()
    finally:
        for h in handles:
            h.remove()
    if any(x is None for x in hs):
        raise MnnToolError(f"{model_dir}: transformers' decoder layers did not all run")
    return hs, logits


# -------------------------------------------------------------------------------------------------- bundle

def engine_run(model, ids) -> tuple[list, np.ndarray]:
    """([embeddings, layer 0 output, ...], logits (T, vocab)) of the bundle in mnntool's engine."""
    model.reset()
    hs = [model.embed_rows(np.asarray(ids, np.int64))]
    model.on_layer = lambda i, h: hs.append(np.array(h, np.float32, copy=True))
    try:
        logits = model.forward(ids, all_logits=True)
    finally:
        model.on_layer = None
        model.reset()
    return hs, np.asarray(logits, np.float32)


def _structure(spec, model) -> list[dict]:
    """The sizes the bundle and the checkpoint must share."""
    p = model.plan
    checks = [("layers", spec.layers, len(p.layers)), ("hidden size", spec.hidden, p.hidden),
              ("vocabulary", spec.vocab, p.vocab)]
    if len(p.layers) == spec.layers:
        for i, lp in enumerate(p.layers):
            for what, ours, theirs in (("attention heads", spec.heads, lp.heads), ("KV heads", spec.kv_heads, lp.kv_heads),
                                       ("head size", spec.head_dim, lp.head_dim),
                                       ("MLP width", spec.intermediate, lp.down.ic if lp.down is not None else None)):
                checks.append((f"layer {i} {what}", ours, theirs))
    out = [{"what": w, "checkpoint": a, "bundle": b, "pass": a == b} for w, a, b in checks]
    bad = [c for c in out if not c["pass"]]
    return bad[:8] if bad else out[:3]       # the failures, or the model-wide sizes


def _bits(model) -> int:
    return min(w.bits for L in model.layers for lin in (L.qkv, L.o, L.mlp_in, L.down) for w in lin.ws)


# ------------------------------------------------------------------------------------------------- compare

def _row(name: str, ref, got, limit: float) -> dict:
    m = metrics(ref, got)
    m.pop("shape_mismatch", None)
    m = {k: _finite(v) for k, v in m.items()}       # snr_db of equal tensors, anything of a NaN: null
    return {"name": name, **m, "min_cosine": limit, "pass": m["cosine"] is not None and m["cosine"] >= limit}


def _finite(v) -> float | None:
    return float(v) if np.isfinite(v) else None


def _logits_row(name: str, runtime: str, ref, got, t: dict) -> dict:
    from .evaluate import kl_rows
    lim = t["logits"]
    row = _row(name, ref, got, lim["min_cosine"])
    kl, same = kl_rows(ref, got)
    row.update(runtime=runtime, top1=float(same.mean()), kl_mean=_finite(kl.mean()), kl_max=_finite(kl.max()),
               min_top1=lim["min_top1"], max_kl_mean=lim["max_kl_mean"])
    row["pass"] = bool(row["pass"] and row["top1"] >= lim["min_top1"] and row["kl_mean"] is not None
                       and row["kl_mean"] <= lim["max_kl_mean"])
    return row


def verify(bundle, checkpoint, prompt: str | None = None, text=None, offset: int = 0, tokens: int = DEFAULT_TOKENS,
           seed: int = 0, ref: str = "numpy", min_cosine: float | None = None, thresholds: dict | None = None,
           mnn: bool | None = None, mnn_exact: bool = True, threads: int = 1, precision: str = "normal",
           progress=None) -> dict:
    """The report (see the module's docstring; `SCHEMA`, `JSON_SCHEMA`). `mnn`: run MNN-LLM too (None: when
    the `mnn` wheel is installed). `progress(total)` may return a function advanced once per reference layer."""
    import importlib.util

    from .. import __version__
    from . import families
    from .checkpoint import Checkpoint
    from .engine.files import open_bundle
    from .engine.model import Model
    t0 = time.perf_counter()
    if ref not in ("numpy", "transformers"):
        raise MnnToolError(f"--ref {ref}: numpy (mnntool's float decoder) or transformers")
    bundle, checkpoint = Path(bundle), Path(checkpoint)
    if not bundle.is_dir():
        raise MnnToolError(f"{bundle}: not a bundle folder")
    if not checkpoint.is_dir():
        raise MnnToolError(f"{checkpoint}: not a checkpoint folder")
    if mnn is None:
        mnn = importlib.util.find_spec("MNN") is not None
    with Checkpoint.open(checkpoint) as ck:
        spec = families.spec(ck.config)
        ids, described = token_ids(bundle, open_bundle(bundle), spec.vocab, prompt, text, offset, tokens, seed)
        model = Model.load(bundle, threads=threads, context=len(ids), precision=precision)
        bits = _bits(model)
        t = thresholds_for(bits, min_cosine, thresholds)
        r = {"schema": SCHEMA, "mnntool_version": __version__, "bundle": str(bundle), "checkpoint": str(checkpoint),
             "reference": ref, "engine_precision": precision, "family": spec.family, "model_type": spec.model_type,
             "bits": bits, "head_bits": model.head.w.bits, "inputs": described, "ids": [int(i) for i in ids],
             "thresholds": t, "layers": [], "logits": [], "notes": list(spec.notes), "first_failing": None}
        checks = _structure(spec, model)
        r["same_model"] = {"pass": all(c["pass"] for c in checks), "checks": checks,
                           "embedding_cosine": None, "min_embedding_cosine": SAME_MODEL_MIN_COSINE}
        if not r["same_model"]["pass"]:
            return _finish(r, t0)
        ours, got_logits = engine_run(model, ids)
        step = progress(spec.layers) if progress else None
        if ref == "numpy":
            theirs, ref_logits = numpy_reference(ck, spec, ids, step)
    if ref == "transformers":
        theirs, ref_logits = transformers_reference(checkpoint, spec.layers, ids, step)
    emb = _finite(metrics(theirs[0], ours[0])["cosine"])
    r["same_model"]["embedding_cosine"] = emb
    if emb is None or emb < SAME_MODEL_MIN_COSINE:
        r["same_model"]["pass"] = False
        return _finish(r, t0)
    for k, (a, b) in enumerate(zip(theirs, ours)):
        name = "embed" if k == 0 else f"layer {k - 1}"
        r["layers"].append({"index": k - 1, **_row(name, a, b, _layer_limit(t, name))})
    r["logits"].append(_logits_row("logits (mnntool engine)", "mnntool", ref_logits, got_logits, t))
    if mnn:
        r["logits"].append(_mnn_row(bundle, ids, ref_logits, got_logits, t, mnn_exact, threads))
    else:
        r["notes"].append("MNN-LLM not run (no `mnn` wheel, or --no-mnn): the end-to-end check is missing")
    return _finish(r, t0)


def _mnn_row(bundle, ids, ref_logits, got_logits, t, exact, threads) -> dict:
    from .evaluate import Window, mnn_logits
    name = "logits (MNN-LLM)"
    try:
        theirs = mnn_logits(bundle, [Window(0, list(ids), 1)], exact=exact, threads=threads)[0]
    except (RuntimeError, OSError) as e:
        return {"name": name, "runtime": "mnn", "pass": False, "error": str(e)[:500]}
    mnn = np.array(theirs, np.float32)
    del theirs
    row = _logits_row(name, "mnn", ref_logits, mnn, t)
    row["mode"] = "exact" if exact else "default"
    agree = metrics(got_logits, mnn)
    row["vs_engine"] = {"cosine": _finite(agree["cosine"]), "max_abs": _finite(agree["max_abs"]),
                        "top1": float((got_logits.argmax(-1) == mnn.argmax(-1)).mean())}
    return row


def _finish(r: dict, t0: float) -> dict:
    if not r["same_model"]["pass"]:
        r["pass"], r["exit_code"] = False, EXIT_NOT_SAME_MODEL
    else:
        bad = [m for m in r["layers"] if not m["pass"]]
        bad_logits = [m for m in r["logits"] if not m["pass"]]
        r["first_failing"] = bad[0]["name"] if bad else (bad_logits[0]["name"] if bad_logits else None)
        r["pass"] = not bad and not bad_logits
        r["exit_code"] = EXIT_PASS if r["pass"] else EXIT_FAIL
    r["seconds"] = round(time.perf_counter() - t0, 3)
    return r


def verdict_text(r: dict) -> str:
    """Why the run passed or failed, in one sentence."""
    if r["exit_code"] == EXIT_NOT_SAME_MODEL:
        bad = [c for c in r["same_model"]["checks"] if not c["pass"]]
        if bad:
            why = "; ".join(f"{c['what']}: checkpoint {c['checkpoint']}, bundle {c['bundle']}" for c in bad[:3])
        else:
            e = r["same_model"]["embedding_cosine"]
            why = (f"its embeddings of the tokens used have cosine {'nan' if e is None else format(e, '.4f')} "
                   f"with the checkpoint's (< {r['same_model']['min_embedding_cosine']})")
        return f"NOT FROM THIS CHECKPOINT: {why}"
    if r["pass"]:
        return (f"PASS: every layer's hidden state and the logits meet the thresholds "
                f"({r['thresholds']['source']})")
    bad = [m["name"] for m in r["layers"] if not m["pass"]]
    parts = [f"{len(bad)} of {len(r['layers'])} hidden state(s), the first {r['first_failing']}"] if bad else []
    parts += [m["name"] for m in r["logits"] if not m["pass"]]
    return "FAIL: " + " and ".join(parts) + " below the thresholds"


def inputs_text(inputs: dict) -> str:
    k = inputs.get("kind")
    if k == "prompt":
        return f"prompt of {inputs['tokens']} tokens: {inputs['text'][:60]!r}"
    if k == "text":
        return f"{inputs['tokens']} tokens of {inputs['file']} from token {inputs['offset']}"
    return f"{inputs['tokens']} random token ids: {inputs['distribution']}"


# ------------------------------------------------------------------------------------------ the JSON schema

_NUM = {"type": "number"}
_NUL = {"type": ["number", "null"]}         # null: not finite (a NaN in the bundle's output, an infinite SNR)
_METRICS = {"name": {"type": "string"}, "cosine": _NUL, "max_abs": _NUL, "rel_l2": _NUL, "snr_db": _NUL,
            "scale": _NUL, "min_cosine": _NUM, "pass": {"type": "boolean"}}
JSON_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": SCHEMA, "title": "mnntool llm verify report", "type": "object",
    "required": ["schema", "mnntool_version", "bundle", "checkpoint", "reference", "bits", "inputs", "ids",
                 "thresholds", "same_model", "layers", "logits", "first_failing", "pass", "exit_code", "notes"],
    "properties": {
        "schema": {"const": SCHEMA}, "mnntool_version": {"type": "string"},
        "bundle": {"type": "string"}, "checkpoint": {"type": "string"},
        "reference": {"enum": ["numpy", "transformers"]}, "engine_precision": {"enum": ["normal", "high"]},
        "family": {"type": "string"}, "model_type": {"type": "string"},
        "bits": {"enum": [4, 8, 16]}, "head_bits": {"enum": [4, 8, 16]},
        "inputs": {"type": "object", "required": ["kind", "tokens"],
                   "properties": {"kind": {"enum": ["random", "prompt", "text"]}, "tokens": {"type": "integer"},
                                  "seed": {"type": "integer"}, "file": {"type": "string"},
                                  "offset": {"type": "integer"}, "text": {"type": "string"}}},
        "ids": {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1},
        "thresholds": {"type": "object", "required": ["bits", "min_cosine", "logits", "layers", "source"],
                       "properties": {"min_cosine": _NUM, "source": {"type": "string"},
                                      "logits": {"type": "object", "required": list(LOGIT_KEYS),
                                                 "properties": {k: _NUM for k in LOGIT_KEYS}},
                                      "layers": {"type": "array", "items": {
                                          "type": "object", "required": ["match", "min_cosine"]}}}},
        "same_model": {"type": "object", "required": ["pass", "checks", "embedding_cosine"],
                       "properties": {"pass": {"type": "boolean"},
                                      "embedding_cosine": {"type": ["number", "null"]},
                                      "checks": {"type": "array", "items": {
                                          "type": "object", "required": ["what", "checkpoint", "bundle", "pass"]}}}},
        "layers": {"type": "array", "items": {
            "type": "object", "required": ["index", "name", "cosine", "max_abs", "rel_l2", "min_cosine", "pass"],
            "properties": {"index": {"type": "integer", "minimum": -1}, **_METRICS}}},
        "logits": {"type": "array", "items": {
            "type": "object", "required": ["name", "runtime", "pass"],
            "properties": {"runtime": {"enum": ["mnntool", "mnn"]}, "top1": _NUM, "kl_mean": _NUL, "kl_max": _NUL,
                           "min_top1": _NUM, "max_kl_mean": _NUM, "error": {"type": "string"},
                           "mode": {"enum": ["exact", "default"]}, "vs_engine": {"type": "object"}, **_METRICS}}},
        "first_failing": {"type": ["string", "null"]}, "pass": {"type": "boolean"},
        "exit_code": {"enum": [0, 1, 3]}, "notes": {"type": "array", "items": {"type": "string"}},
        "seconds": _NUM,
    },
}
