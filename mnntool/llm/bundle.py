"""`mnntool llm export`: a Hugging Face checkpoint folder -> the bundle MNN-LLM loads.

Files (MNN-LLM's names; `MNN.llm.create(OUT/config.json)` loads the folder unchanged):
    llm.mnn            the decoder graph (decoder.py), a few hundred KB
    llm.mnn.weight     every linear layer and norm, quantized on the way (weightfile.py)
    embeddings_*.bin   the token embeddings, when the head does not hold them (untied models)
    tokenizer.mtok     the tokenizer (tokenizer.py)
    llm_config.json    the model's facts the engine needs (sizes, masks, tied embeddings, chat template)
    config.json        runtime settings (threads, precision, sampler) pointing at the files
    export.json        what was written: settings, per-tensor bits and bytes, timings
Everything is written into a temporary folder beside OUT and renamed at the end: a failure leaves
no output folder behind, and an existing OUT is only replaced with `overwrite`.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from ..errors import MnnToolError
from . import families
from .checkpoint import Checkpoint
from .decoder import Decoder, QuantPlan
from .weightfile import WeightFile
from .quantize import quantize

RUNTIME_CONFIG = {"backend_type": "cpu", "thread_num": 4, "precision": "low", "memory": "low",
                  "sampler_type": "mixed", "temperature": 0.8, "top_k": 40, "top_p": 0.9, "min_p": 0.05,
                  "tfs_z": 1.0, "typical": 0.95, "repetition_penalty": 1.0, "presence_penalty": 0.0,
                  "frequency_penalty": 0.0, "penalty_window": 0, "n_gram": 8, "ngram_factor": 1.0}


def _sampler(gen: dict) -> dict:
    """The checkpoint's own sampling defaults (generation_config.json) in MNN-LLM's terms: greedy when
    it does not sample, else its temperature, top-k, top-p and repetition penalty."""
    if gen.get("do_sample") is False:
        return {"sampler_type": "greedy"}
    out = {}
    for key, name, kind in (("temperature", "temperature", float), ("top_k", "top_k", int), ("top_p", "top_p", float),
                            ("repetition_penalty", "repetition_penalty", float)):
        v = gen.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            out[name] = kind(v)
    return out


def _check_plan(p: QuantPlan, embed_bits: int | None) -> None:
    for what, v in (("--bits", p.bits), ("--lm-bits", p.lm_bits), ("--embed-bits", embed_bits)):
        if v is not None and v not in (4, 8, 16):
            raise MnnToolError(f"{what} {v}: 4, 8 or 16")
    for what, v in (("--block", p.block), ("--lm-block", p.lm_block)):
        if v is not None and (v < 0 or (v and v & (v - 1))):
            raise MnnToolError(f"{what} {v}: 0 (per channel) or a power of two")
    if p.hqq and p.symmetric:
        raise MnnToolError("--hqq moves each block's zero point: it needs asymmetric blocks (drop --sym)")


def _out_dir(model_dir: Path, out: Path, overwrite: bool) -> None:
    if out.resolve() == model_dir.resolve() or model_dir.resolve() in out.resolve().parents:
        raise MnnToolError(f"{out}: is inside the checkpoint folder; write the bundle elsewhere")
    if out.exists() and not out.is_dir():
        raise MnnToolError(f"{out}: exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise MnnToolError(f"{out}: exists and is not empty (pass --overwrite to replace it)")
    if not out.parent.is_dir():
        raise MnnToolError(f"{out}: folder {out.parent} does not exist")


def _bf16(a: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, rounding to nearest even (as torch's .bfloat16())."""
    u = np.ascontiguousarray(a, np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _embeddings(ck: Checkpoint, spec, dec: Decoder, tmp: Path, bits: int, plan: QuantPlan):
    """Where MNN-LLM finds the embeddings: (llm_config's tie_embeddings or None, config's embedding_file,
    bytes written)."""
    head_ext, head_q = dec.head
    if spec.tied and head_q is not None and bits == head_q.bits:
        header = head_ext[1] - head_q.stored.nbytes
        return [head_ext[0] + header, head_ext[0] + head_ext[1], head_ext[2], head_q.bits, head_q.block], None, 0
    if spec.tied and head_q is None and bits == 16:      # the fp16 head: MNN-LLM reads its rows as fp16
        return [head_ext[0], head_ext[0] + head_ext[1], 0, 16, 0], None, 0
    name = spec.names["embed"]
    w = dec.tensor(name, (spec.vocab, spec.hidden))
    if bits == 16:
        path = tmp / "embeddings_bf16.bin"
        data = ck.raw(name) if ck.dtype(name) == "BF16" else _bf16(w)
        path.write_bytes(np.ascontiguousarray(data).tobytes())
        return None, None, path.stat().st_size
    q = quantize(w, bits, plan.block, plan.symmetric, plan.hqq)
    if spec.hidden % q.block:
        raise MnnToolError(f"--embed-bits {bits}: block {q.block} does not divide hidden size {spec.hidden}")
    path = tmp / f"embeddings_int{bits}.bin"
    with open(path, "wb") as f:
        f.write(q.stored.tobytes())
        f.write(q.alpha.tobytes())
    return [0, q.stored.nbytes, q.alpha.nbytes, bits, q.block], path.name, path.stat().st_size


def export(model_dir, out_dir, bits: int = 4, block: int = 64, symmetric: bool = False, hqq: bool = False,
           lm_bits: int | None = None, lm_block: int | None = None, embed_bits: int | None = None,
           calib_text=None, calib_tokens: int = 4096, overwrite: bool = False, progress=None) -> dict:
    """Write the bundle; returns the report (also saved as export.json). `calib_text` (a text file) turns
    on AWQ's scale search over its first `calib_tokens` tokens. `progress(total)` may return a function
    advanced once per layer."""
    t0 = time.perf_counter()
    model_dir, out = Path(model_dir), Path(out_dir)
    plan = QuantPlan(bits, block, symmetric, hqq, lm_bits, lm_block)
    _check_plan(plan, embed_bits)
    _out_dir(model_dir, out, overwrite)
    with Checkpoint.open(model_dir) as ck:
        spec = families.spec(ck.config)
        try:
            tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        except OSError as e:
            raise MnnToolError(f"{out}: cannot write here ({e.strerror or e})") from None
        try:
            report = _write(ck, spec, plan, embed_bits, model_dir, tmp, progress, calib_text, calib_tokens)
            report["seconds"] = round(time.perf_counter() - t0, 2)
            (tmp / "export.json").write_text(json.dumps(report, indent=1))
            os.chmod(tmp, 0o777 & ~_umask())
            if out.exists():
                shutil.rmtree(out)
            os.replace(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    report["out"] = str(out)
    return report


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m


def _calibrator(dec: Decoder, model_dir: Path, calib_text, calib_tokens: int):
    """AWQ over the calibration text, cut into sequences of 512 tokens (positions as at inference)."""
    from .awq import Calibrator
    from .reference import LayerwiseModel
    from .text import encode_file
    spec, plan = dec.s, dec.plan
    if plan.bits == 16:
        raise MnnToolError("--calib-text: AWQ searches scales for 4- and 8-bit weights; --bits is 16")
    ids = encode_file(model_dir, calib_text)[:calib_tokens]
    if len(ids) < 16:
        raise MnnToolError(f"{calib_text}: {len(ids)} tokens; AWQ needs some text (a few thousand tokens)")
    seqs = [ids[k:k + 512] for k in range(0, len(ids), 512)]
    seqs = [q for q in seqs if len(q) >= 16]
    return Calibrator(spec, LayerwiseModel(spec, dec.tensor, dec.maybe), seqs, plan.bits, plan.block, plan.symmetric)


def _write(ck: Checkpoint, spec, plan: QuantPlan, embed_bits, model_dir: Path, tmp: Path, progress,
           calib_text=None, calib_tokens: int = 4096) -> dict:
    from .tokenizer import write_mtok
    tok = write_mtok(model_dir, tmp / "tokenizer.mtok")
    advance = progress(spec.layers) if progress else None
    with open(tmp / "llm.mnn.weight", "wb") as f:
        wf = WeightFile(f)
        dec = Decoder(spec, ck, wf, plan, advance)
        if calib_text is not None:
            dec.calib = _calibrator(dec, model_dir, calib_text, calib_tokens)
        net = dec.build()
    if dec.mixed:
        net.ops[1]["main"]["dims"] = [2, 1, 1, -1, -1]
    outputs = ["logits", "hidden_states"]
    (tmp / "llm.mnn").write_bytes(net.to_bytes(outputs))
    ebits = embed_bits or (plan.head_bits if spec.tied else 16)
    tie, emb_file, emb_bytes = _embeddings(ck, spec, dec, tmp, ebits, plan)

    llm_config = {"model_type": spec.model_type, "hidden_size": spec.hidden, "layer_nums": spec.layers,
                  "attention_mask": "float", "attention_type": "mix" if dec.mixed else "full",
                  "is_mrope": False, "max_position_embeddings": spec.max_positions}
    if dec.mixed:
        llm_config["sliding_window"] = spec.sliding_window
    if tie:
        llm_config["tie_embeddings"] = tie
    llm_config.update(tok.get("llm_config") or {})
    (tmp / "llm_config.json").write_text(json.dumps(llm_config, indent=4, ensure_ascii=False))
    config = {"llm_model": "llm.mnn", "llm_weight": "llm.mnn.weight", **RUNTIME_CONFIG, **_sampler(ck.generation_config),
              "tokenizer_file": "tokenizer.mtok"}
    if emb_file:
        config["embedding_file"] = emb_file
    (tmp / "config.json").write_text(json.dumps(config, indent=4))

    recs = wf.records
    weights = sum(r.shape[0] * r.shape[1] for r in recs)
    return {"model_type": spec.model_type, "family": spec.family, "layers": spec.layers,
            "hidden": spec.hidden, "vocab": spec.vocab, "tied": spec.tied,
            "awq": dec.calib.report if dec.calib is not None else None,
            "settings": {"bits": plan.bits, "block": plan.block, "symmetric": plan.symmetric, "hqq": plan.hqq,
                         "lm_bits": plan.head_bits, "lm_block": plan.lm_block if plan.lm_block is not None
                         else plan.block, "embed_bits": ebits},
            "attention_type": llm_config["attention_type"], "notes": spec.notes, "tokenizer": {k: v for k, v in tok.items() if k not in ("llm_config", "path")},
            "files": {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()},
            "linear_weights": weights,
            "bits_per_weight": round(8.0 * sum(r.bytes for r in recs) / max(weights, 1), 3),
            "embedding_bytes": emb_bytes,
            "tensors": [{"name": r.name, "shape": list(r.shape), "bits": r.bits, "block": r.block,
                         "symmetric": r.symmetric, "bytes": r.bytes, "bits_per_weight": round(r.bits_per_weight, 3)}
                        for r in recs]}
