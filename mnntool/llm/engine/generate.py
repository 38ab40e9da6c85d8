"""`mnntool.llm.load(OUT_DIR)`: a bundle ready to generate, in mnntool's own runtime.

    llm = mnntool.llm.load("out", threads=1)
    r = llm.generate("def main():", max_new_tokens=64)            # greedy (temperature 0)
    r = llm.generate(ids, max_new_tokens=64, temperature=0.8, top_k=40, top_p=0.9, seed=0)
    logits = llm.forward(ids)                                      # last position's logits, fresh cache
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ...errors import MnnToolError
from .model import Model
from .tokenizer import StreamDecoder, Tokenizer


@dataclass
class Generation:
    ids: list                   # the generated ids (the prompt's not included)
    text: str
    prompt_ids: list
    prefill_s: float
    decode_s: float
    stopped: str                # "stop" (a stop token) or "length"
    logits: list = field(default_factory=list)     # per step, when asked for

    @property
    def prefill_tps(self) -> float:
        return len(self.prompt_ids) / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tps(self) -> float:
        n = max(len(self.ids) - 1, 0)       # the first token comes from the prefill's logits
        return n / self.decode_s if self.decode_s > 0 and n else 0.0

    def as_dict(self) -> dict:
        return {"prompt_ids": self.prompt_ids, "ids": self.ids, "text": self.text, "stopped": self.stopped,
                "prompt_tokens": len(self.prompt_ids), "generated_tokens": len(self.ids),
                "prefill_s": round(self.prefill_s, 6), "decode_s": round(self.decode_s, 6),
                "prefill_tokens_per_s": round(self.prefill_tps, 2), "decode_tokens_per_s": round(self.decode_tps, 2)}


class Sampler:
    """temperature 0: greedy; else softmax(logits / temperature) over the top_k (0: all) tokens whose
    cumulative probability reaches top_p, drawn from a seeded generator."""

    def __init__(self, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed=None):
        if temperature < 0 or top_k < 0 or not 0 < top_p <= 1:
            raise MnnToolError(f"sampling: temperature {temperature} >= 0, top_k {top_k} >= 0, top_p {top_p} in (0, 1]")
        self.temperature, self.top_k, self.top_p = float(temperature), int(top_k), float(top_p)
        self.rng = np.random.default_rng(seed)

    def __call__(self, logits: np.ndarray) -> int:
        if self.temperature == 0:
            return int(np.argmax(logits))
        x = np.asarray(logits, np.float64) / self.temperature
        if self.top_k and self.top_k < x.size:
            idx = np.argpartition(-x, self.top_k - 1)[:self.top_k]
        else:
            idx = np.arange(x.size)
        idx = idx[np.argsort(-x[idx], kind="stable")]
        p = np.exp(x[idx] - x[idx[0]])
        p /= p.sum()
        if self.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(p), self.top_p) + 1)
            idx, p = idx[:keep], p[:keep] / p[:keep].sum()
        return int(idx[self.rng.choice(len(idx), p=p)])


class LLM:
    def __init__(self, model: Model, tokenizer: Tokenizer | None):
        self.model, self.tokenizer = model, tokenizer

    @property
    def vocab(self) -> int:
        return self.model.vocab

    def encode(self, text: str) -> list:
        if self.tokenizer is None:
            raise MnnToolError(f"{self.model.files.root}: no tokenizer.mtok: give token ids")
        return self.tokenizer.encode(text)

    def decode(self, ids) -> str:
        if self.tokenizer is None:
            raise MnnToolError(f"{self.model.files.root}: no tokenizer.mtok to decode with")
        return self.tokenizer.decode(ids)

    def _ids(self, prompt) -> list:
        if isinstance(prompt, str):
            ids = self.encode(prompt)
        else:
            ids = [int(i) for i in np.asarray(prompt).reshape(-1)]
        if not ids:
            raise MnnToolError("the prompt has no tokens")
        return ids

    def forward(self, ids, all_logits: bool = False, reset: bool = True) -> np.ndarray:
        """Logits of the last position (vocab,), or of every position (n, vocab); from an empty cache
        unless reset=False (then after what earlier calls left)."""
        if reset:
            self.model.reset()
        return self.model.forward(self._ids(ids), all_logits=all_logits)

    def generate(self, prompt, max_new_tokens: int = 128, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, seed=None, stop: bool = True, on_text=None, on_token=None,
                 keep_logits: bool = False) -> Generation:
        """Generate after `prompt` (text or ids) from an empty cache. `on_text(str)` gets the text as it
        is produced, `on_token(id)` each id; generation ends at a stop token (unless stop=False) or
        after max_new_tokens."""
        ids = self._ids(prompt)
        m = self.model
        if len(ids) + max_new_tokens > m.context:
            raise MnnToolError(f"{len(ids)} prompt tokens + {max_new_tokens} new ones exceed the context "
                               f"({m.context}); load with a larger context")
        sample = Sampler(temperature, top_k, top_p, seed)
        stream = StreamDecoder(self.tokenizer) if (on_text is not None and self.tokenizer is not None) else None
        m.reset()
        t0 = time.perf_counter()
        logits = m.forward(ids)
        t1 = time.perf_counter()
        out, kept, stopped = [], [], "length"
        for step in range(max_new_tokens):
            if keep_logits:
                kept.append(logits.copy())
            tok = sample(logits)
            out.append(tok)
            if on_token is not None:
                on_token(tok)
            if stop and self.tokenizer is not None and self.tokenizer.is_stop(tok):
                stopped = "stop"
                break
            if stream is not None:
                piece = stream.add(tok)
                if piece:
                    on_text(piece)
            if step + 1 < max_new_tokens:
                logits = m.forward([tok])
        t2 = time.perf_counter()
        if stream is not None:
            rest = stream.flush()
            if rest:
                on_text(rest)
        text = self.tokenizer.decode(out) if self.tokenizer is not None else ""
        return Generation(out, text, ids, t1 - t0, t2 - t1, stopped, kept)


def load(folder, threads: int = 1, context: int | None = None, precision: str = "normal",
         kv_int8: bool = False) -> LLM:
    """An MNN-LLM bundle folder (what `mnntool llm export` writes, or llmexport) in mnntool's runtime.
    precision "normal" feeds the quantized layers int16 inputs (rounding 1.5e-5 of a block's largest
    value), "high" float32 (the file's layout read in place; slower). kv_int8: the KV cache in 8-bit
    codes per head and position (kv8.py; MNN-LLM's kv_quant), about a quarter of the float32 cache's bytes."""
    t0 = time.perf_counter()
    model = Model.load(folder, threads=threads, context=context, precision=precision, kv_int8=kv_int8)
    model.forward([0])          # the kernels loaded (Numba's cache) now, not in the first prompt's time
    model.reset()
    if model.threads > 1:       # and the prefill's parallel ones (chosen from 64 tokens of a 0.5B model on)
        model.forward([0] * min(64, model.context))
        model.reset()
    model.load_s = time.perf_counter() - t0
    tok = None
    if model.files.tokenizer is not None and model.files.tokenizer.is_file():
        tok = Tokenizer(model.files.tokenizer)
    return LLM(model, tok)
