"""tokenizer.mtok read back: encode text to ids and decode ids to text, in pure Python.

The file is MNN-LLM's "pipeline" tokenizer (mnntool/llm/tokenizer.py writes it; llmexport writes the
same sections): special, stop and prefix ids in three text lines, then normalizer, pre-tokenizer,
model, decoder, added tokens, chat template, eos/bos texts. Encoding follows MNN-LLM's reader:
prefix ids first; special tokens (non-empty text, list order) and then added tokens (leftmost,
longest) are cut out of the text; every other piece goes normalizer -> pre-tokenizer -> model.
Models read here: BPE (byte-level or with byte fallback). Decoding skips the special ids.
"""
from __future__ import annotations

import re
import struct
import unicodedata
from functools import lru_cache
from pathlib import Path

from ...errors import MnnToolError

META = "\u2581"


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict:
    """GPT-2's byte -> printable character table (the byte-level alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


@lru_cache(maxsize=1)
def unicode_to_bytes() -> dict:
    return {c: b for b, c in bytes_to_unicode().items()}


GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


class _Reader:
    def __init__(self, data: bytes, path: str):
        self.b, self.p, self.path = data, 0, path

    def take(self, fmt: str):
        try:
            v = struct.unpack_from(fmt, self.b, self.p)
        except struct.error:
            raise MnnToolError(f"{self.path}: cut short at byte {self.p}") from None
        self.p += struct.calcsize(fmt)
        return v[0] if len(v) == 1 else v

    def raw(self, n: int) -> bytes:
        if self.p + n > len(self.b):
            raise MnnToolError(f"{self.path}: cut short at byte {self.p}")
        out = self.b[self.p:self.p + n]
        self.p += n
        return out

    def s(self) -> bytes:
        return self.raw(self.take("<H"))

    def text(self) -> str:
        return self.s().decode("utf-8", "replace")

    def table(self) -> dict:
        n = self.take("<I")
        out = {}
        for _ in range(n):
            cp = self.take("<I")
            out[chr(cp)] = self.text()
        return out


# ---------------------------------------------------------------------------------------- components

def _read_normalizer(r: _Reader):
    t = r.take("<B")
    if t == 0:
        return None
    if t == 2:
        return ("prepend", r.text())
    if t == 3:
        return ("replace", r.text(), r.text())
    if t == 4:
        return ("seq", [_read_normalizer(r) for _ in range(r.take("<I"))])
    if t == 5:
        return ("bert", r.take("<4B"), None)
    if t == 6:
        return ("table", r.table())
    if t == 7:
        flags = r.take("<4B")
        return ("bert", flags, r.table() if flags[2] else None)
    if t == 8:
        return ("strip", r.take("<2B"))
    raise MnnToolError(f"{r.path}: normalizer type {t} is not read by mnntool")


def _read_pre(r: _Reader):
    t = r.take("<B")
    if t == 0:
        return None
    if t == 1:
        return ("bytelevel", r.take("<B"))
    if t == 2:
        return ("digits", r.take("<B"))
    if t == 3:
        return ("metaspace", r.text(), r.take("<B"))
    if t == 4:
        pat = r.text()
        invert, behavior = r.take("<2B")
        return ("split", pat, invert, behavior)
    if t == 5:
        return ("bert",)
    if t == 6:
        return ("seq", [_read_pre(r) for _ in range(r.take("<I"))])
    raise MnnToolError(f"{r.path}: pre-tokenizer type {t} is not read by mnntool")


def _read_decoder(r: _Reader):
    if r.p >= len(r.b):
        return None
    t = r.take("<B")
    if t == 0:
        return ("bytelevel",)
    if t == 1:
        return ("bytefallback",)
    if t == 2:
        return ("metaspace", r.text(), r.take("<B"))
    if t == 3:
        return ("wordpiece", r.text(), r.take("<B"))
    if t == 4:
        return ("fuse",)
    if t == 5:
        return ("replace", r.text(), r.text())
    if t == 6:
        return ("strip", r.text(), *r.take("<2I"))
    if t == 7:
        return ("seq", [_read_decoder(r) for _ in range(r.take("<I"))])
    return None         # MNN: an unknown byte means no decoder


def _normalize(node, text: str) -> str:
    if node is None:
        return text
    kind = node[0]
    if kind == "seq":
        for c in node[1]:
            text = _normalize(c, text)
        return text
    if kind == "prepend":
        return node[1] + text if text else text
    if kind == "replace":
        return text.replace(node[1], node[2]) if node[1] else text
    if kind == "table":
        table = node[1]
        return "".join(table.get(ch, ch) for ch in text)
    if kind == "strip":
        left, right = node[1]
        if left:
            text = text.lstrip()
        if right:
            text = text.rstrip()
        return text
    if kind == "bert":
        clean, chinese, strip, lower = node[1]
        if clean:
            text = "".join(" " if ch in "\t\n\r" or unicodedata.category(ch).startswith("Z") else ch
                           for ch in text if not (ord(ch) == 0 or ord(ch) == 0xFFFD
                                                   or (unicodedata.category(ch).startswith("C") and ch not in "\t\n\r")))
        if chinese:
            text = "".join(f" {ch} " if _is_cjk(ord(ch)) else ch for ch in text)
        if strip and node[2] is not None:
            text = "".join(node[2].get(ch, ch) for ch in text)
            text = "".join(ch for ch in text if unicodedata.category(ch) != "Mn")
        if lower:
            text = text.lower()
        return text
    return text


def _is_cjk(cp: int) -> bool:
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF or 0x2A700 <= cp <= 0x2B73F
            or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


@lru_cache(maxsize=64)
def _compile(pattern: str):
    import regex
    return regex.compile(pattern)


def _split(pattern: str, text: str, invert: bool, behavior: int) -> list:
    """tokenizers' Split: matches are delimiters (or, inverted, the content); behavior 0 isolated,
    1 removed, 2 merged with the previous piece."""
    pieces = []         # (text, is_delimiter)
    last = 0
    for m in _compile(pattern).finditer(text):
        if m.start() == m.end():
            continue
        if m.start() > last:
            pieces.append((text[last:m.start()], invert))
        pieces.append((m.group(), not invert))
        last = m.end()
    if last < len(text):
        pieces.append((text[last:], invert))
    out = []
    for piece, delim in pieces:
        if not delim or behavior == 0:
            out.append(piece)
        elif behavior == 2:
            if out:
                out[-1] += piece
            else:
                out.append(piece)
        # behavior 1: removed
    return out


def _pre(node, words: list) -> list:
    """words: [(text, byte_level_mapped)] -> the same after this pre-tokenizer."""
    if node is None:
        return words
    kind = node[0]
    if kind == "seq":
        for c in node[1]:
            words = _pre(c, words)
        return words
    out = []
    for w, mapped in words:
        if kind == "bytelevel":
            parts = _split(GPT2_PATTERN, w, False, 0) if node[1] else [w]
            table = bytes_to_unicode()
            out.extend(("".join(table[b] for b in p.encode("utf-8")), True) for p in parts)
        elif kind == "split":
            out.extend((p, mapped) for p in _split(node[1], w, bool(node[2]), int(node[3])))
        elif kind == "digits":
            pat = r"\p{N}" if node[1] else r"\p{N}+"
            out.extend((p, mapped) for p in _split(pat, w, False, 0))
        elif kind == "metaspace":
            rep, prepend = node[1], node[2]
            t = w.replace(" ", rep)
            if prepend and not t.startswith(rep):
                t = rep + t
            # split before each replacement character (MergedWithNext)
            start = 0
            for i in range(1, len(t)):
                if t[i] == rep[0] and t.startswith(rep, i):
                    out.append((t[start:i], mapped))
                    start = i
            if t:
                out.append((t[start:], mapped))
        elif kind == "bert":
            out.extend((p, mapped) for p in _split(r"\w+|[^\w\s]", w, True, 1))
        else:
            out.append((w, mapped))
    return [(w, m) for w, m in out if w]


# ----------------------------------------------------------------------------------------------- BPE

class _BPE:
    def __init__(self, r: _Reader, n: int):
        self.byte_fallback, self.byte_level = bool(r.take("<B")), bool(r.take("<B"))
        nm = r.take("<I")
        self.vocab: dict = {}
        self.table: list = [""] * n
        for _ in range(n):
            t = r.s()
            i = r.take("<I")
            text = t.decode("utf-8", "surrogateescape")
            self.vocab[text] = i
            if 0 <= i < n:
                self.table[i] = text
        raw = r.raw(12 * nm)
        self.ranks: dict = {}
        for a, b, rank in struct.iter_unpack("<III", raw):
            self.ranks[(a, b)] = rank
        self.cache: dict = {}

    def word(self, w: str, mapped: bool) -> list:
        hit = self.cache.get((w, mapped))
        if hit is not None:
            return hit
        if self.byte_level and not mapped:
            table = bytes_to_unicode()
            w = "".join(table[b] for b in w.encode("utf-8"))
        syms = []
        for ch in w:
            i = self.vocab.get(ch)
            if i is not None:
                syms.append(i)
            elif self.byte_fallback:
                for b in ch.encode("utf-8"):
                    j = self.vocab.get(f"<0x{b:02X}>")
                    if j is not None:
                        syms.append(j)
            # else: unknown character, dropped (no unk in byte-level vocabularies)
        ranks, table, vocab = self.ranks, self.table, self.vocab
        while len(syms) > 1:
            best, at = None, -1
            for k in range(len(syms) - 1):
                r_ = ranks.get((syms[k], syms[k + 1]))
                if r_ is not None and (best is None or r_ < best):
                    best, at = r_, k
            if best is None:
                break
            merged = vocab.get(table[syms[at]] + table[syms[at + 1]])
            if merged is None:
                break
            syms[at:at + 2] = [merged]
        if len(self.cache) < 100_000:
            self.cache[(w, mapped)] = syms
        return syms


# ---------------------------------------------------------------------------------------- the reader

class Tokenizer:
    def __init__(self, path):
        self.path = str(path)
        try:
            data = Path(path).read_bytes()
        except OSError as e:
            raise MnnToolError(f"{path}: cannot read the tokenizer ({e.strerror})") from None
        try:
            l1, l2, l3, body = data.split(b"\n", 3)
            magic, kind = (int(x) for x in l1.split())
            ns, nst, npf = (int(x) for x in l2.split())
            ids = [int(x) for x in l3.split()]
        except ValueError:
            raise MnnToolError(f"{path}: not a tokenizer.mtok file") from None
        if magic != 430:
            raise MnnToolError(f"{path}: magic {magic}, not a tokenizer.mtok file")
        if kind != 4:
            raise MnnToolError(f"{path}: tokenizer type {kind} is not read by mnntool (the pipeline type 4 is)")
        self.special = ids[:ns]
        self.stop = ids[ns:ns + nst]
        self.prefix = ids[ns + nst:ns + nst + npf]
        r = _Reader(body, self.path)
        self.normalizer = _read_normalizer(r)
        self.pre = _read_pre(r)
        mt, n = r.take("<B"), r.take("<I")
        if mt != 0:
            raise MnnToolError(f"{path}: tokenizer model {('BPE', 'WordPiece', 'Unigram')[mt] if mt < 3 else mt} "
                               "is not read by mnntool's engine yet (BPE is)")
        self.model = _BPE(r, n)
        self.decoder = _read_decoder(r)
        self.added = []
        for _ in range(r.take("<I")):
            i = r.take("<I")
            special, lstrip, rstrip = r.take("<3B")
            self.added.append((r.text(), i, bool(lstrip), bool(rstrip), bool(special)))
        self.chat_template = self.eos = self.bos = ""
        if r.p < len(r.b):
            n = r.take("<I")
            self.chat_template = r.raw(n).decode("utf-8", "replace")
            self.eos = r.text()
            r.take("<B")
            self.bos = r.text()
        self.table = self.model.table
        for text, i, *_ in self.added:
            if 0 <= i < len(self.table) and not self.table[i]:
                self.table[i] = text
        self.special_set = set(self.special)
        self.cut = [(self.table[i], i) for i in self.special if 0 <= i < len(self.table) and self.table[i]]
        self.added_sorted = sorted(self.added, key=lambda a: -len(a[0]))

    @property
    def vocab_size(self) -> int:
        return len(self.table)

    # -------------------------------------------------------------------------------------- encode
    def _pieces(self, text: str) -> list:
        """[(str, None) | ('', id)]: the special and added tokens cut out."""
        parts = [(text, None)]
        for tok, i in self.cut:
            nxt = []
            for p, tid in parts:
                if tid is not None or tok not in p:
                    nxt.append((p, tid))
                    continue
                chunks = p.split(tok)
                for k, c in enumerate(chunks):
                    if k:
                        nxt.append(("", i))
                    if c:
                        nxt.append((c, None))
            parts = nxt
        out = []
        for p, tid in parts:
            if tid is not None:
                out.append((p, tid))
            else:
                out.extend(self._added(p))
        return out

    def _added(self, text: str) -> list:
        if not self.added:
            return [(text, None)]
        out, pos = [], 0
        buf_start = 0
        while pos < len(text):
            best = None
            for tok, i, lstrip, rstrip, _ in self.added_sorted:
                if text.startswith(tok, pos):
                    best = (tok, i, lstrip, rstrip)
                    break
            if best is None:
                pos += 1
                continue
            tok, i, lstrip, rstrip = best
            before = text[buf_start:pos]
            if lstrip:
                before = before.rstrip()
            if before:
                out.append((before, None))
            out.append(("", i))
            pos += len(tok)
            if rstrip:
                while pos < len(text) and text[pos].isspace():
                    pos += 1
            buf_start = pos
        if buf_start < len(text):
            out.append((text[buf_start:], None))
        return out

    def encode(self, text: str, prefix: bool = True) -> list:
        ids = list(self.prefix) if prefix else []
        for piece, tid in self._pieces(text):
            if tid is not None:
                ids.append(tid)
                continue
            t = _normalize(self.normalizer, piece)
            for w, mapped in _pre(self.pre, [(t, False)]):
                ids.extend(self.model.word(w, mapped))
        return ids

    # -------------------------------------------------------------------------------------- decode
    def decode_bytes(self, ids, skip_special: bool = True) -> bytes:
        toks = [self.table[i] if 0 <= i < len(self.table) else "" for i in ids
                if not (skip_special and i in self.special_set)]
        return _decode(self.decoder, toks)

    def decode(self, ids, skip_special: bool = True) -> str:
        return self.decode_bytes(ids, skip_special).decode("utf-8", "replace")

    def is_stop(self, i: int) -> bool:
        return i in self.stop


_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _decode(node, toks: list) -> bytes:
    """The decoder chain on token texts; bytes out (byte-level and byte-fallback tokens may split a
    character across tokens)."""
    items = _apply_decoder(node, [t.encode("utf-8", "surrogateescape") for t in toks], first=True)
    return b"".join(items)


def _apply_decoder(node, items: list, first: bool) -> list:
    if node is None:
        return items
    kind = node[0]
    if kind == "seq":
        for c in node[1]:
            items = _apply_decoder(c, items, first)
        return items
    if kind == "bytelevel":
        table = unicode_to_bytes()
        out = []
        for it in items:
            s = it.decode("utf-8", "surrogateescape")
            out.append(bytes(table[ch] for ch in s if ch in table) if all(ch in table for ch in s) else it)
        return out
    if kind == "bytefallback":
        out = []
        for it in items:
            m = _BYTE_TOKEN.fullmatch(it.decode("utf-8", "replace"))
            out.append(bytes([int(m.group(1), 16)]) if m else it)
        return out
    if kind == "fuse":
        return [b"".join(items)]
    if kind == "replace":
        a, b = node[1].encode(), node[2].encode()
        return [it.replace(a, b) for it in items]
    if kind == "strip":
        content, start, stop = node[1].encode(), node[2], node[3]
        out = []
        for k, it in enumerate(items):
            s = it
            for _ in range(start):
                if s.startswith(content):
                    s = s[len(content):]
            for _ in range(stop):
                if s.endswith(content):
                    s = s[:-len(content)]
            out.append(s)
        return out
    if kind == "metaspace":
        rep, prepend = node[1].encode(), node[2]
        out = []
        for k, it in enumerate(items):
            s = it.replace(rep, b" ")
            if k == 0 and prepend and s.startswith(b" "):
                s = s[1:]
            out.append(s)
        return out
    if kind == "wordpiece":
        prefix = node[1].encode()
        out = []
        for k, it in enumerate(items):
            if it.startswith(prefix):
                out.append(it[len(prefix):])
            else:
                out.append((b" " if k else b"") + it)
        return out
    return items


class StreamDecoder:
    """Text as tokens come: each `add(id)` returns the new complete characters (a character split
    across tokens waits for its last byte)."""

    def __init__(self, tok: Tokenizer):
        self.tok, self.ids, self.sent = tok, [], 0

    def add(self, i: int) -> str:
        self.ids.append(int(i))
        data = self.tok.decode_bytes(self.ids)
        end = _complete_utf8(data)
        if end <= self.sent:
            return ""
        out = data[self.sent:end].decode("utf-8", "replace")
        self.sent = end
        return out

    def flush(self) -> str:
        data = self.tok.decode_bytes(self.ids)
        out = data[self.sent:].decode("utf-8", "replace")
        self.sent = len(data)
        return out


def _complete_utf8(b: bytes) -> int:
    """The length of b without a trailing incomplete UTF-8 sequence."""
    n = len(b)
    for back in range(1, min(4, n) + 1):
        c = b[n - back]
        if c < 0x80:
            return n
        if c >= 0xC0:
            need = 2 if c < 0xE0 else 3 if c < 0xF0 else 4
            return n if back >= need else n - back
    return n
