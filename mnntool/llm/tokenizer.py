"""tokenizer.mtok: MNN-LLM's tokenizer file, written from a Hugging Face checkpoint folder.

The file MNN-LLM (the `mnn` 3.6.1 wheel, transformers/llm/engine/src/tokenizer/tokenizer.cpp) reads as its
"pipeline" tokenizer: three text lines, then a little-endian binary body.

    line 1   "430 4"                          magic number, tokenizer type 4 = pipeline
    line 2   "S T P"                          how many special, stop and prefix ids follow
    line 3   "id id id ..."                   the special ids, then the stop ids, then the prefix ids
    body     normalizer, pre-tokenizer, model (BPE / WordPiece / Unigram), decoder, added tokens,
             [u32 len] chat template, [u16 len] eos text, [u8 flags], [u16 len] bos text

Strings are [u16 byte length][UTF-8 bytes]. Vocabularies are stored sorted by their UTF-8 bytes (the
reader binary-searches them); BPE merges as (left id, right id, rank) sorted by (left, right).

What the reader does, and so what this writer must get right (all checked in MNN's source):
- The prefix ids are prepended to every `encode` (that is how a BOS reaches the model); 3.6.1 has no way
  to append ids after the text, so a post-processor's suffix (an EOS) is dropped and reported.
- Added tokens are cut out of the text first (leftmost match, longest on a tie, lstrip/rstrip honoured);
  every other piece runs normalizer -> pre-tokenizer -> model on its own.
- The special ids are skipped when a sequence is decoded, and each special id whose vocabulary text is
  non-empty is also cut out of the text (first in list order) before the added tokens are.
- The model's id -> text table is indexed by id: the ids must be 0..n-1 without holes. Added tokens that
  the model's vocabulary lacks are appended to that table so decoding them gives their text.
- An unknown component type in the binary makes the reader silently skip it (wrong tokens, no error), so
  anything the format cannot express is refused here, naming the component.

Sources read (never executed): tokenizer.json (or, without it, a SentencePiece tokenizer.model parsed
as protobuf by hand), tokenizer_config.json, special_tokens_map.json, chat_template.jinja,
generation_config.json and config.json (stop ids).
"""
from __future__ import annotations

import base64
import json
import os
import re
import struct
import tempfile
import unicodedata
from functools import lru_cache
from pathlib import Path

from ..errors import MnnToolError

MAGIC = 430
PIPELINE = 4
META = "\u2581"  # SentencePiece's visible space

# normalizer / pre-tokenizer / model / decoder type bytes of the binary body
_N_NONE, _N_PREPEND, _N_REPLACE, _N_SEQUENCE, _N_BERT, _N_TABLE, _N_BERT_NFD, _N_STRIP = 0, 2, 3, 4, 5, 6, 7, 8
_P_NONE, _P_BYTELEVEL, _P_DIGITS, _P_METASPACE, _P_SPLIT, _P_BERT, _P_SEQUENCE = 0, 1, 2, 3, 4, 5, 6
_M_BPE, _M_WORDPIECE, _M_UNIGRAM = 0, 1, 2
_D_BYTELEVEL, _D_BYTEFALLBACK, _D_METASPACE, _D_WORDPIECE, _D_FUSE, _D_REPLACE, _D_STRIP, _D_SEQUENCE = range(8)
_D_NONE = 255  # any byte the reader does not know yields "no decoder" and consumes nothing else
_BYTE_PIECE = re.compile(r"<0x[0-9A-F]{2}>")
_SPLIT_BEHAVIOR = {"Isolated": 0, "Removed": 1, "MergedWithPrevious": 2}  # all the reader can tell apart

# tokens that end a turn in common chat formats: stop ids when the vocabulary has them as one token
_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "<turn|>")
_NAMED_SPECIALS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


# --------------------------------------------------------------------------------------------------
# public entry point
# --------------------------------------------------------------------------------------------------

def write_mtok(model_dir, out_path) -> dict:
    """Write `out_path` (tokenizer.mtok) from the tokenizer files in `model_dir`.

    Returns a summary for the export report: kind, vocab_size, special/stop/prefix ids, bos/eos, notes
    (approximations worth knowing), and `llm_config`: the entries llm_config.json needs from the
    tokenizer side ({"jinja": {"chat_template", "bos"?, "eos"?}} when there is a chat template)."""
    src = _Source(Path(model_dir))
    body, info = _build(src)
    _atomic_write(Path(out_path), body)
    info["path"] = str(out_path)
    return info


# --------------------------------------------------------------------------------------------------
# reading the checkpoint folder
# --------------------------------------------------------------------------------------------------

def _read_json(path: Path, required: bool = False):
    if not path.is_file():
        if required:
            raise MnnToolError(f"{path}: not found")
        return None
    try:
        with open(path, "rb") as f:
            return json.loads(f.read().decode("utf-8"))
    except OSError as e:
        raise MnnToolError(f"{path}: cannot read ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise MnnToolError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise MnnToolError(f"{path}: malformed JSON ({e.msg} at line {e.lineno} column {e.colno})") from None


def _token_text(value):
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


class _Source:
    """The tokenizer files of one checkpoint folder, parsed and sanity-checked (nothing executed)."""

    def __init__(self, root: Path):
        if not root.is_dir():
            raise MnnToolError(f"{root}: not a folder")
        self.root = root
        self.json_path = root / "tokenizer.json"
        self.spm_path = root / "tokenizer.model"
        if self.json_path.is_file():
            self.tj = _read_json(self.json_path)
            self.origin = self.json_path
            if not isinstance(self.tj, dict) or not isinstance(self.tj.get("model"), dict):
                raise MnnToolError(f"{self.json_path}: no 'model' object: not a Hugging Face tokenizers file")
        elif self.spm_path.is_file():
            self.tj = _spm_to_tokenizer_json(self.spm_path)
            self.origin = self.spm_path
        else:
            raise MnnToolError(f"{root}: no tokenizer.json or tokenizer.model (the tokenizer is missing)")
        cfg = self.config = {}
        stm = _read_json(root / "special_tokens_map.json")
        if isinstance(stm, dict):
            cfg.update(stm)
        tc = _read_json(root / "tokenizer_config.json")
        if tc is not None and not isinstance(tc, dict):
            raise MnnToolError(f"{root / 'tokenizer_config.json'}: expected a JSON object")
        self.tokenizer_config = tc or {}
        cfg.update(self.tokenizer_config)
        self.generation_config = _read_json(root / "generation_config.json")
        self.model_config = _read_json(root / "config.json")
        self.chat_template = self._chat_template()

    def _chat_template(self):
        """What transformers' get_chat_template() returns: chat_template.jinja wins over the config."""
        jinja = self.root / "chat_template.jinja"
        if jinja.is_file():
            try:
                return jinja.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                raise MnnToolError(f"{jinja}: not UTF-8 text") from None
        tpl = self.config.get("chat_template")
        if tpl is None:
            ct = _read_json(self.root / "chat_template.json")
            tpl = ct.get("chat_template") if isinstance(ct, dict) else None
        if isinstance(tpl, list):  # [{"name": ..., "template": ...}]: transformers uses "default"
            named = {t.get("name"): t.get("template") for t in tpl if isinstance(t, dict)}
            tpl = named.get("default")
        if tpl is not None and not isinstance(tpl, str):
            raise MnnToolError(f"{self.root / 'tokenizer_config.json'}: chat_template is neither text nor a "
                               f"list with a 'default' template")
        return tpl or None

    def err(self, what: str) -> MnnToolError:
        return MnnToolError(f"{self.origin}: {what}")


# --------------------------------------------------------------------------------------------------
# SentencePiece tokenizer.model (protobuf ModelProto, decoded by hand)
# --------------------------------------------------------------------------------------------------

def _pb_fields(buf: bytes, where: Path):
    """Yield (field number, wire type, value) of one protobuf message; value is int or bytes."""
    i, n = 0, len(buf)

    def varint():
        nonlocal i
        shift = result = 0
        while True:
            if i >= n or shift > 63:
                raise MnnToolError(f"{where}: truncated or malformed protobuf (not a SentencePiece model)")
            b = buf[i]
            i += 1
            result |= (b & 0x7F) << shift
            if b < 0x80:
                return result
            shift += 7

    while i < n:
        key = varint()
        field, wire = key >> 3, key & 7
        if wire == 0:
            yield field, wire, varint()
        elif wire == 1:
            if i + 8 > n:
                raise MnnToolError(f"{where}: truncated protobuf (not a SentencePiece model)")
            yield field, wire, buf[i:i + 8]
            i += 8
        elif wire == 2:
            ln = varint()
            if i + ln > n:
                raise MnnToolError(f"{where}: truncated protobuf (not a SentencePiece model)")
            yield field, wire, buf[i:i + ln]
            i += ln
        elif wire == 5:
            if i + 4 > n:
                raise MnnToolError(f"{where}: truncated protobuf (not a SentencePiece model)")
            yield field, wire, buf[i:i + 4]
            i += 4
        else:
            raise MnnToolError(f"{where}: malformed protobuf (wire type {wire}): not a SentencePiece model")


def _pb_int32(v: int) -> int:
    v &= 0xFFFFFFFFFFFFFFFF
    return v - (1 << 64) if v >= 1 << 63 else v


def _spm_to_tokenizer_json(path: Path) -> dict:
    """A SentencePiece ModelProto as the tokenizer.json transformers would build from it (BPE: merges
    ranked by piece score; Unigram: scores), for the same writer."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise MnnToolError(f"{path}: cannot read ({e.strerror})") from None
    pieces, trainer, norm = [], {}, {}
    for field, wire, val in _pb_fields(data, path):
        if field == 1 and wire == 2:
            piece = {"piece": None, "score": 0.0, "type": 1}
            for f, w, v in _pb_fields(val, path):
                if f == 1 and w == 2:
                    try:
                        piece["piece"] = v.decode("utf-8")
                    except UnicodeDecodeError:
                        raise MnnToolError(f"{path}: a piece is not UTF-8") from None
                elif f == 2 and w == 5:
                    piece["score"] = struct.unpack("<f", v)[0]
                elif f == 3 and w == 0:
                    piece["type"] = v
            if piece["piece"] is None:
                raise MnnToolError(f"{path}: a piece without text (not a SentencePiece model)")
            pieces.append(piece)
        elif field == 2 and wire == 2:
            for f, w, v in _pb_fields(val, path):
                trainer[f] = v
        elif field == 3 and wire == 2:
            for f, w, v in _pb_fields(val, path):
                norm[f] = v
    if not pieces:
        raise MnnToolError(f"{path}: no pieces: not a SentencePiece model")
    model_type = trainer.get(3, 1)
    byte_fallback = bool(trainer.get(35, 0))
    unk_id = _pb_int32(trainer.get(40, 0))
    if trainer.get(24, 0):
        raise MnnToolError(f"{path}: unsupported SentencePiece option treat_whitespace_as_suffix")
    add_dummy_prefix = bool(norm.get(3, 1))
    remove_extra_ws = bool(norm.get(4, 1))
    escape_ws = bool(norm.get(5, 1))
    charsmap = norm.get(2, b"")
    if remove_extra_ws:
        raise MnnToolError(f"{path}: unsupported SentencePiece normalizer option remove_extra_whitespaces "
                           f"(MNN's tokenizer cannot collapse runs of spaces)")

    normalizers = []
    if charsmap:
        normalizers.append({"type": "Precompiled", "precompiled_charsmap": base64.b64encode(charsmap).decode()})
    if add_dummy_prefix:
        normalizers.append({"type": "Prepend", "prepend": META if escape_ws else " "})
    if escape_ws:
        normalizers.append({"type": "Replace", "pattern": {"String": " "}, "content": META})
    decoders = []
    if escape_ws:
        decoders.append({"type": "Replace", "pattern": {"String": META}, "content": " "})
    if byte_fallback:
        decoders.append({"type": "ByteFallback"})
    decoders.append({"type": "Fuse"})
    if add_dummy_prefix:
        decoders.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})

    added = [{"id": i, "content": p["piece"], "special": p["type"] in (2, 3), "lstrip": False, "rstrip": False,
              "normalized": False, "single_word": False}
             for i, p in enumerate(pieces) if p["type"] in (2, 3, 4)]
    notes = []
    if add_dummy_prefix and any(p["type"] == 4 for p in pieces):
        notes.append("text right after a user-defined piece gets its own dummy-prefix space marker in MNN "
                     "(SentencePiece adds one only at the start)")
    if model_type == 2:  # BPE: SentencePiece merges the pair whose joined piece scores best
        normal = {p["piece"]: (p["score"], i) for i, p in enumerate(pieces) if p["type"] == 1}
        ranked = []
        for tok, (score, idx) in normal.items():
            for cut in range(1, len(tok)):
                left, right = tok[:cut], tok[cut:]
                if left in normal and right in normal:
                    ranked.append((-score, idx, left, right))
        ranked.sort()
        model = {"type": "BPE", "vocab": {p["piece"]: i for i, p in enumerate(pieces)},
                 "merges": [[l, r] for _, _, l, r in ranked], "byte_fallback": byte_fallback,
                 "unk_token": pieces[unk_id]["piece"] if 0 <= unk_id < len(pieces) else None}
    elif model_type == 1:
        model = {"type": "Unigram", "unk_id": unk_id if unk_id >= 0 else None, "byte_fallback": byte_fallback,
                 "vocab": [[p["piece"], p["score"]] for p in pieces]}
    else:
        kinds = {3: "WORD", 4: "CHAR"}
        raise MnnToolError(f"{path}: unsupported SentencePiece model type {kinds.get(model_type, model_type)}")
    return {"model": model, "normalizer": {"type": "Sequence", "normalizers": normalizers},
            "pre_tokenizer": None, "decoder": {"type": "Sequence", "decoders": decoders},
            "added_tokens": added, "post_processor": None,
            "_spm": {"bos_id": _pb_int32(trainer.get(41, 1)), "eos_id": _pb_int32(trainer.get(42, 2)),
                     "notes": notes}}


# --------------------------------------------------------------------------------------------------
# binary helpers
# --------------------------------------------------------------------------------------------------

class _Buf:
    def __init__(self):
        self.parts: list[bytes] = []

    def u8(self, v):
        self.parts.append(struct.pack("<B", int(v)))

    def u16(self, v):
        self.parts.append(struct.pack("<H", v))

    def u32(self, v):
        self.parts.append(struct.pack("<I", v))

    def f64(self, v):
        self.parts.append(struct.pack("<d", v))

    def raw(self, b: bytes):
        self.parts.append(b)

    def str(self, s, what: str, src: _Source):
        try:
            b = s.encode("utf-8") if isinstance(s, str) else bytes(s)
        except UnicodeEncodeError:
            raise src.err(f"{what} is not valid Unicode text") from None
        if len(b) > 0xFFFF:
            raise src.err(f"{what} is {len(b)} bytes, longer than MNN's 65535-byte strings")
        self.u16(len(b))
        self.parts.append(b)

    def bytes(self) -> bytes:
        return b"".join(self.parts)


@lru_cache(maxsize=None)
def _norm_table(form: str) -> bytes:
    """[u32 count] then (u32 code point, str mapped) for every code point `form` changes, ascending."""
    out, count = [], 0
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        ch = chr(cp)
        mapped = unicodedata.normalize(form, ch)
        if mapped != ch:
            b = mapped.encode("utf-8")
            out.append(struct.pack("<IH", cp, len(b)) + b)
            count += 1
    return struct.pack("<I", count) + b"".join(out)


def _pattern(obj, what: str, src: _Source, regex_ok: bool) -> str:
    """A tokenizers pattern ({"String": s} or {"Regex": r}) as the regex text MNN's scanner gets."""
    if isinstance(obj, str):
        return re.escape(obj) if regex_ok else obj
    if isinstance(obj, dict) and isinstance(obj.get("String"), str):
        return re.escape(obj["String"]) if regex_ok else obj["String"]
    if isinstance(obj, dict) and isinstance(obj.get("Regex"), str):
        if regex_ok:
            return obj["Regex"]
        raise src.err(f"unsupported {what} with a regex pattern ({obj['Regex']!r}); MNN matches literal text only")
    raise src.err(f"{what}: pattern missing or malformed")


def _types(node, key: str) -> list[str]:
    """Every component type in a (possibly nested) Sequence."""
    if not isinstance(node, dict):
        return []
    if node.get("type") == "Sequence":
        return [t for child in node.get(key) or [] for t in _types(child, key)]
    return [node.get("type")]


# --------------------------------------------------------------------------------------------------
# the pipeline components
# --------------------------------------------------------------------------------------------------

def _is_identity_normalizer(node) -> bool:
    """A Precompiled normalizer without a charsmap (SentencePiece's "identity" rule) changes nothing."""
    return isinstance(node, dict) and node.get("type") == "Precompiled" and not node.get("precompiled_charsmap")


def _write_normalizer(buf: _Buf, node, src: _Source, notes: list, skip_bytelevel: bool):
    if node is None:
        buf.u8(_N_NONE)
        return
    if not isinstance(node, dict):
        raise src.err("normalizer is not an object")
    t = node.get("type")
    if _is_identity_normalizer(node) or (skip_bytelevel and t == "ByteLevel"):
        buf.u8(_N_NONE)  # (a lone ByteLevel normalizer is the BPE model's byte_level flag)
    elif t == "Sequence":
        children = [c for c in node.get("normalizers") or [] if not _is_identity_normalizer(c)]
        # NFD then StripAccents is how tokenizers strips accents; MNN does both in one step
        merged, i = [], 0
        while i < len(children):
            c = children[i]
            nxt = children[i + 1] if i + 1 < len(children) else None
            if isinstance(c, dict) and c.get("type") == "NFD" and isinstance(nxt, dict) \
                    and nxt.get("type") == "StripAccents":
                merged.append({"type": "_NFDStripAccents"})
                i += 2
                continue
            if skip_bytelevel and isinstance(c, dict) and c.get("type") == "ByteLevel":
                i += 1
                continue
            merged.append(c)
            i += 1
        buf.u8(_N_SEQUENCE)
        buf.u32(len(merged))
        for c in merged:
            _write_normalizer(buf, c, src, notes, skip_bytelevel)
    elif t in ("NFKC", "NFC", "Precompiled"):
        buf.u8(_N_TABLE)
        buf.raw(_norm_table("NFC" if t == "NFC" else "NFKC"))
        if t == "Precompiled":
            notes.append("Precompiled (SentencePiece) normalizer approximated by NFKC, as llmexport does")
        notes.append(f"{t} applied per code point; MNN also maps control characters to spaces")
    elif t == "Prepend":
        buf.u8(_N_PREPEND)
        buf.str(node.get("prepend", ""), "Prepend normalizer text", src)
    elif t == "Replace":
        buf.u8(_N_REPLACE)
        buf.str(_pattern(node.get("pattern"), "Replace normalizer", src, regex_ok=False), "Replace pattern", src)
        buf.str(node.get("content", ""), "Replace content", src)
    elif t == "BertNormalizer":
        lower = bool(node.get("lowercase", True))
        strip = node.get("strip_accents")
        strip = lower if strip is None else bool(strip)  # tokenizers: None follows lowercase
        buf.u8(_N_BERT_NFD if strip else _N_BERT)
        buf.u8(bool(node.get("clean_text", True)))
        buf.u8(bool(node.get("handle_chinese_chars", True)))
        buf.u8(strip)
        buf.u8(lower)
        if strip:
            buf.raw(_norm_table("NFD"))
    elif t == "Lowercase":
        buf.u8(_N_BERT)
        buf.raw(bytes([0, 0, 0, 1]))
    elif t == "_NFDStripAccents":
        buf.u8(_N_BERT_NFD)
        buf.raw(bytes([0, 0, 1, 0]))
        buf.raw(_norm_table("NFD"))
    elif t == "Strip":
        buf.u8(_N_STRIP)
        buf.u8(bool(node.get("left", node.get("strip_left", True))))
        buf.u8(bool(node.get("right", node.get("strip_right", True))))
    else:
        raise src.err(f"unsupported normalizer {t} (MNN's tokenizer has no equivalent)")


def _write_pre_tokenizer(buf: _Buf, node, src: _Source, notes: list):
    if node is None:
        buf.u8(_P_NONE)
        return
    if not isinstance(node, dict):
        raise src.err("pre_tokenizer is not an object")
    t = node.get("type")
    if t == "Sequence":
        children = node.get("pretokenizers") or []
        buf.u8(_P_SEQUENCE)
        buf.u32(len(children))
        for c in children:
            _write_pre_tokenizer(buf, c, src, notes)
    elif t == "ByteLevel":
        if node.get("add_prefix_space", False):
            raise src.err("unsupported pre-tokenizer ByteLevel with add_prefix_space=true "
                          "(MNN's ByteLevel never adds a space)")
        buf.u8(_P_BYTELEVEL)
        buf.u8(bool(node.get("use_regex", True)))
    elif t == "Digits":
        buf.u8(_P_DIGITS)
        buf.u8(bool(node.get("individual_digits", False)))
    elif t == "Metaspace":
        rep = node.get("replacement", META)
        if node.get("str_rep"):
            rep = node["str_rep"]
        scheme = node.get("prepend_scheme")
        if scheme is None:
            prepend = bool(node.get("add_prefix_space", True))
        elif scheme in ("always", "first", "never"):
            prepend = scheme != "never"
            if scheme == "first":
                notes.append("Metaspace prepend_scheme 'first' written as 'always': MNN also prefixes the "
                             "text after an added token with the space marker")
        else:
            raise src.err(f"unsupported pre-tokenizer Metaspace with prepend_scheme {scheme!r}")
        buf.u8(_P_METASPACE)
        buf.str(rep, "Metaspace replacement", src)
        buf.u8(prepend)
    elif t in ("Split", "WhitespaceSplit", "Whitespace", "CharDelimiterSplit"):
        if t == "Split":
            pat = _pattern(node.get("pattern"), "Split pre-tokenizer", src, regex_ok=True)
            behavior, invert = node.get("behavior", "Isolated"), bool(node.get("invert", False))
        elif t == "WhitespaceSplit":
            pat, behavior, invert = r"\s+", "Removed", False
        elif t == "Whitespace":
            pat, behavior, invert = r"\w+|[^\w\s]+", "Removed", True
        else:
            delim = node.get("delimiter")
            if not isinstance(delim, str) or len(delim) != 1:
                raise src.err("CharDelimiterSplit pre-tokenizer without a one-character delimiter")
            pat, behavior, invert = re.escape(delim), "Removed", False
        if behavior not in _SPLIT_BEHAVIOR:
            raise src.err(f"unsupported pre-tokenizer {t} with behavior {behavior} "
                          f"(MNN knows Isolated, Removed, MergedWithPrevious)")
        buf.u8(_P_SPLIT)
        buf.str(pat, f"{t} pattern", src)
        buf.u8(invert)
        buf.u8(_SPLIT_BEHAVIOR[behavior])
    elif t == "BertPreTokenizer":
        buf.u8(_P_BERT)
    else:
        raise src.err(f"unsupported pre-tokenizer {t} (MNN's tokenizer has no equivalent)")


def _write_decoder(buf: _Buf, node, src: _Source):
    if node is None:
        buf.u8(_D_NONE)
        return
    if not isinstance(node, dict):
        raise src.err("decoder is not an object")
    t = node.get("type")
    if t == "Sequence":
        children = node.get("decoders") or []
        buf.u8(_D_SEQUENCE)
        buf.u32(len(children))
        for c in children:
            _write_decoder(buf, c, src)
    elif t == "ByteLevel":
        buf.u8(_D_BYTELEVEL)
    elif t == "ByteFallback":
        buf.u8(_D_BYTEFALLBACK)
    elif t == "Metaspace":
        scheme = node.get("prepend_scheme")
        prepend = bool(node.get("add_prefix_space", True)) if scheme is None else scheme != "never"
        buf.u8(_D_METASPACE)
        buf.str(node.get("str_rep") or node.get("replacement", META), "Metaspace decoder replacement", src)
        buf.u8(prepend)
    elif t == "WordPiece":
        buf.u8(_D_WORDPIECE)
        buf.str(node.get("prefix", "##"), "WordPiece decoder prefix", src)
        buf.u8(bool(node.get("cleanup", True)))
    elif t == "Fuse":
        buf.u8(_D_FUSE)
    elif t == "Replace":
        buf.u8(_D_REPLACE)
        buf.str(_pattern(node.get("pattern"), "Replace decoder", src, regex_ok=False), "Replace pattern", src)
        buf.str(node.get("content", ""), "Replace content", src)
    elif t == "Strip":
        buf.u8(_D_STRIP)
        buf.str(node.get("content", " "), "Strip decoder content", src)
        buf.u32(int(node.get("start", 0)))
        buf.u32(int(node.get("stop", 0)))
    else:
        raise src.err(f"unsupported decoder {t} (MNN's tokenizer has no equivalent)")


def _sorted_by_bytes(table: list[str], src: _Source) -> list[tuple[bytes, int]]:
    """(UTF-8 text, id), in the byte order the reader's binary search assumes."""
    rows = []
    for i, tok in enumerate(table):
        try:
            rows.append((tok.encode("utf-8"), i))
        except UnicodeEncodeError:
            raise src.err(f"token {i} ({tok!r}) is not valid Unicode text") from None
    rows.sort()
    return rows


def _id_table(vocab: dict, added: list[dict], src: _Source, notes: list) -> tuple[list[str], int]:
    """id -> text for the model (the reader indexes it by id: no holes allowed), extended with the added
    tokens the model's vocabulary lacks."""
    n_model = len(vocab)
    by_id: dict[int, str] = {}
    for tok, tid in vocab.items():
        if not isinstance(tok, str) or isinstance(tid, bool) or not isinstance(tid, int) or tid < 0:
            raise src.err(f"model vocabulary entry {tok!r}: {tid!r} is not a token with a non-negative id")
        if tid in by_id:
            raise src.err(f"model vocabulary gives id {tid} to both {by_id[tid]!r} and {tok!r}")
        by_id[tid] = tok
    known = set(vocab)
    for at in added:
        tid, content = at["id"], at["content"]
        if tid in by_id or content in known or at["lstrip"] or at["rstrip"]:
            continue  # (an lstrip/rstrip token in the table would also be cut out ignoring its strip flags)
        by_id[tid] = content
        known.add(content)
    size = max(by_id) + 1 if by_id else 0
    if size > 2 * len(by_id) + 1024:  # the reader's table has a row for every id up to the largest
        raise src.err(f"token ids are sparse (largest {size - 1} for {len(by_id)} tokens)")
    holes = size - len(by_id)
    if holes:
        notes.append(f"{holes} unused ids below {size} decode as empty text")
    return [by_id.get(i, "") for i in range(size)], n_model


def _write_model(buf: _Buf, tj: dict, added: list[dict], src: _Source, notes: list) -> dict:
    model = tj["model"]
    t = model.get("type")
    if not t:  # old tokenizer.json files omit it
        if "merges" in model:
            t = "BPE"
        elif isinstance(model.get("vocab"), list):
            t = "Unigram"
        elif "continuing_subword_prefix" in model or "max_input_chars_per_word" in model:
            t = "WordPiece"
        else:
            t = "WordLevel"
    if t == "BPE":
        return _write_bpe(buf, tj, model, added, src, notes)
    if t == "WordPiece":
        vocab = model.get("vocab")
        if not isinstance(vocab, dict):
            raise src.err("WordPiece model without a vocab object")
        table, n_model = _id_table(vocab, added, src, notes)
        buf.u8(_M_WORDPIECE)
        buf.u32(len(table))
        buf.str(model.get("unk_token") or "[UNK]", "WordPiece unk_token", src)
        buf.str(model.get("continuing_subword_prefix") or "##", "WordPiece prefix", src)
        buf.u32(int(model.get("max_input_chars_per_word") or 100))
        for b, i in _sorted_by_bytes(table, src):
            buf.str(b, f"token {i}", src)
            buf.u32(i)
        return {"kind": "WordPiece", "model_vocab": n_model, "table": table}
    if t == "Unigram":
        vocab = model.get("vocab")
        if not isinstance(vocab, list):
            raise src.err("Unigram model without a vocab list")
        as_dict, scores = {}, []
        for i, item in enumerate(vocab):
            if not (isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], str)
                    and isinstance(item[1], (int, float))):
                raise src.err(f"Unigram vocab entry {i} is not [piece, score]")
            if item[0] in as_dict:
                raise src.err(f"Unigram vocab lists {item[0]!r} twice")
            as_dict[item[0]] = i
            scores.append(float(item[1]))
        table, n_model = _id_table(as_dict, added, src, notes)
        low = (min(scores) if scores else 0.0) - 10.0  # tokenizers' and SentencePiece's unknown penalty
        scores += [low] * (len(table) - len(scores))
        if model.get("byte_fallback"):
            # MNN's Viterbi offers a byte piece for every single byte, not only for unknown characters
            # as tokenizers does; SentencePiece gives byte pieces score 0, which would then beat every
            # real piece. Pricing them like an unknown character keeps them for unknown text only.
            for i, tok in enumerate(table):
                if _BYTE_PIECE.fullmatch(tok):
                    scores[i] = min(scores[i], low)
        unk = model.get("unk_id")
        buf.u8(_M_UNIGRAM)
        buf.u32(len(table))
        buf.u32(0xFFFFFFFF if unk is None else int(unk))
        buf.u8(bool(model.get("byte_fallback", False)))
        for b, i in _sorted_by_bytes(table, src):
            buf.str(b, f"token {i}", src)
            buf.u32(i)
            buf.f64(scores[i])
        return {"kind": "Unigram", "model_vocab": n_model, "table": table}
    raise src.err(f"unsupported tokenizer model {t} (MNN reads BPE, WordPiece and Unigram)")


def _write_bpe(buf: _Buf, tj: dict, model: dict, added: list[dict], src: _Source, notes: list) -> dict:
    vocab = model.get("vocab")
    merges = model.get("merges")
    if not isinstance(vocab, dict) or not isinstance(merges, list):
        raise src.err("BPE model needs a vocab object and a merges list")
    for key in ("continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            raise src.err(f"unsupported BPE option {key}={model[key]!r} (MNN's BPE has no equivalent)")
    if model.get("dropout") not in (None, 0, 0.0):
        raise src.err(f"unsupported BPE option dropout={model['dropout']!r}")
    if model.get("ignore_merges"):
        notes.append("BPE ignore_merges is not supported by MNN: a word in the vocabulary that merges "
                     "would not build may be split differently")

    # A pre-tokenizer without ByteLevel but a ByteLevel decoder (or normalizer) means the model itself
    # maps bytes to the byte-level alphabet: MNN's BPE flag `byte_level` (as llmexport decides it).
    pt_types = _types(tj.get("pre_tokenizer"), "pretokenizers")
    has_bl_pt = "ByteLevel" in pt_types
    has_bl_dec = "ByteLevel" in _types(tj.get("decoder"), "decoders")
    has_bl_norm = "ByteLevel" in _types(tj.get("normalizer"), "normalizers")
    byte_level_model = (not has_bl_pt) and (has_bl_dec or has_bl_norm)
    if has_bl_norm and not byte_level_model:
        raise src.err("unsupported normalizer ByteLevel together with a ByteLevel pre-tokenizer")

    table, n_model = _id_table(vocab, added, src, notes)
    rows: dict[tuple[int, int], int] = {}
    for rank, m in enumerate(merges):
        if isinstance(m, str):
            parts = m.split(" ")
        elif isinstance(m, (list, tuple)):
            parts = list(m)
        else:
            parts = None
        if not parts or len(parts) != 2 or not all(isinstance(p, str) for p in parts):
            raise src.err(f"BPE merge {rank} ({m!r}) is not a pair of tokens")
        a, b = parts
        if a not in vocab or b not in vocab:
            raise src.err(f"BPE merge {rank} ({a!r} {b!r}) uses a token missing from the vocab")
        if a + b not in vocab:
            raise src.err(f"BPE merge {rank} ({a!r} {b!r}) makes {a + b!r}, missing from the vocab")
        rows[(vocab[a], vocab[b])] = rank  # a repeated pair keeps the last rank, as tokenizers' map does
    buf.u8(_M_BPE)
    buf.u32(len(table))
    buf.u8(bool(model.get("byte_fallback", False)))
    buf.u8(byte_level_model)
    buf.u32(len(rows))
    for b, i in _sorted_by_bytes(table, src):
        buf.str(b, f"token {i}", src)
        buf.u32(i)
    for (a, b) in sorted(rows):
        buf.raw(struct.pack("<III", a, b, rows[(a, b)]))
    byte_level = has_bl_pt or byte_level_model
    kind = "byte-level BPE" if byte_level else ("BPE (byte fallback)" if model.get("byte_fallback") else "BPE")
    return {"kind": kind, "model_vocab": n_model, "table": table, "merges": len(rows),
            "byte_level_model": byte_level_model}


# --------------------------------------------------------------------------------------------------
# special, stop and prefix ids; chat template
# --------------------------------------------------------------------------------------------------

def _added_tokens(tj: dict, src: _Source) -> list[dict]:
    out = []
    for i, at in enumerate(tj.get("added_tokens") or []):
        if not isinstance(at, dict) or not isinstance(at.get("content"), str) or not at["content"] \
                or isinstance(at.get("id"), bool) or not isinstance(at.get("id"), int) \
                or not 0 <= at["id"] < 0x80000000:
            raise src.err(f"added_tokens[{i}] needs a non-empty content and an id in 0..2^31-1")
        out.append({"id": at["id"], "content": at["content"], "special": bool(at.get("special", False)),
                    "lstrip": bool(at.get("lstrip", False)), "rstrip": bool(at.get("rstrip", False))})
    return out


def _post_processor_ids(node, token_id, src: _Source) -> tuple[list[int], list[int]]:
    """(ids before the text, ids after it) that the tokenizer.json post-processor adds to one sequence."""
    if not isinstance(node, dict):
        return [], []
    t = node.get("type")
    if t == "Sequence":
        pre, post = [], []
        for child in node.get("processors") or []:
            p, s = _post_processor_ids(child, token_id, src)
            pre, post = p + pre, post + s
        return pre, post
    if t == "TemplateProcessing":
        table = node.get("special_tokens") or {}
        pre, post, seen_a = [], [], False
        for piece in node.get("single") or []:
            if not isinstance(piece, dict) or len(piece) != 1:
                raise src.err("post_processor TemplateProcessing: malformed 'single' template")
            (key, val), = piece.items()
            if key == "Sequence":
                seen_a = True
            elif key == "SpecialToken":
                name = val.get("id") if isinstance(val, dict) else None
                ids = (table.get(name) or {}).get("ids") if isinstance(table.get(name), dict) else None
                if ids is None:
                    tid = token_id(name)
                    ids = [] if tid is None else [tid]
                (post if seen_a else pre).extend(int(x) for x in ids)
        return pre, post
    if t in ("BertProcessing", "RobertaProcessing"):
        cls, sep = node.get("cls"), node.get("sep")
        pre = [int(cls[1])] if isinstance(cls, list) and len(cls) == 2 else []
        post = [int(sep[1])] if isinstance(sep, list) and len(sep) == 2 else []
        return pre, post
    return [], []  # ByteLevel and others add no ids


def _dedup(ids) -> list[int]:
    seen, out = set(), []
    for i in ids:
        if i is not None and i not in seen:
            seen.add(i)
            out.append(i)
    return out


def _int_ids(value) -> list[int]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


# --------------------------------------------------------------------------------------------------
# assembling the file
# --------------------------------------------------------------------------------------------------

def _build(src: _Source) -> tuple[bytes, dict]:
    tj = src.tj
    notes: list[str] = []
    added = _added_tokens(tj, src)

    body = _Buf()
    pt_types = _types(tj.get("pre_tokenizer"), "pretokenizers")
    skip_bl_norm = "ByteLevel" not in pt_types  # a ByteLevel normalizer becomes the BPE byte_level flag
    _write_normalizer(body, tj.get("normalizer"), src, notes, skip_bytelevel=skip_bl_norm)
    _write_pre_tokenizer(body, tj.get("pre_tokenizer"), src, notes)
    minfo = _write_model(body, tj, added, src, notes)
    _write_decoder(body, tj.get("decoder"), src)
    table = minfo["table"]

    body.u32(len(added))
    for at in added:
        body.u32(at["id"])
        body.u8(at["special"])
        body.u8(at["lstrip"])
        body.u8(at["rstrip"])
        body.str(at["content"], f"added token {at['id']}", src)

    # token text -> id, as transformers resolves the names in tokenizer_config.json
    text_to_id = {tok: i for i, tok in enumerate(table) if tok}
    for at in added:
        text_to_id[at["content"]] = at["id"]

    def token_id(text):
        return text_to_id.get(text) if isinstance(text, str) else None

    cfg = src.config
    bos = _token_text(cfg.get("bos_token"))
    eos = _token_text(cfg.get("eos_token"))
    spm = tj.get("_spm")
    if spm is not None:  # transformers takes them from the SentencePiece model when the config is silent
        notes.extend(spm["notes"])
        if bos is None and "bos_token" not in cfg and 0 <= spm["bos_id"] < len(table):
            bos = table[spm["bos_id"]]
        if eos is None and "eos_token" not in cfg and 0 <= spm["eos_id"] < len(table):
            eos = table[spm["eos_id"]]
    bos_id, eos_id = token_id(bos), token_id(eos)

    # special ids: added tokens marked special + the named special tokens of the config
    special = [at["id"] for at in added if at["special"]]
    for key in _NAMED_SPECIALS:
        special.append(token_id(_token_text(cfg.get(key))))
    for key in ("additional_special_tokens", "extra_special_tokens"):
        extra = cfg.get(key)
        if isinstance(extra, dict):
            extra = list(extra.values())
        for v in extra if isinstance(extra, list) else []:
            special.append(token_id(_token_text(v)))
    if bos_id is not None:
        special.append(bos_id)
    if eos_id is not None:
        special.append(eos_id)
    special = _dedup(special)
    # MNN cuts special texts out of the input in list order: longest first, like a leftmost-longest match
    special.sort(key=lambda i: -len(table[i].encode("utf-8")) if i < len(table) else 0)

    # stop ids: eos, generation_config's eos ids (config.json's without one), end-of-turn tokens
    stop = [eos_id]
    gen = src.generation_config if isinstance(src.generation_config, dict) else None
    if gen is not None:
        stop += _int_ids(gen.get("eos_token_id"))
    elif isinstance(src.model_config, dict):
        stop += _int_ids(src.model_config.get("eos_token_id"))
    stop += [token_id(t) for t in _END_OF_TURN]
    stop = _dedup(stop)

    # prefix ids (and a suffix the format cannot express): the post-processor, or transformers'
    # add_bos_token / add_eos_token when the config sets either (transformers rebuilds it then)
    tc = src.tokenizer_config
    if "add_bos_token" in tc or "add_eos_token" in tc:
        prefix = [bos_id] if tc.get("add_bos_token") and bos_id is not None else []
        suffix = [eos_id] if tc.get("add_eos_token") and eos_id is not None else []
    else:
        prefix, suffix = _post_processor_ids(tj.get("post_processor"), token_id, src)
    if suffix:
        notes.append(f"the post-processor appends ids {suffix} after the text; MNN 3.6.1 cannot: dropped")

    for name, ids in (("special", special), ("stop", stop), ("prefix", prefix)):
        for i in ids:
            if not 0 <= i < 0x80000000:
                raise src.err(f"{name} token id {i} out of range")

    head = (f"{MAGIC} {PIPELINE}\n{len(special)} {len(stop)} {len(prefix)}\n"
            + " ".join(str(i) for i in special + stop + prefix) + "\n").encode("ascii")

    tpl = src.chat_template or ""
    tpl_b = tpl.encode("utf-8")
    body.u32(len(tpl_b))
    body.raw(tpl_b)
    body.str(eos or "", "eos_token", src)
    clean = tc.get("clean_up_tokenization_spaces", False) is True
    body.u8(0x01 if clean else 0x00)
    body.str(bos or "", "bos_token", src)

    jinja = {}
    if src.chat_template:
        jinja = {"chat_template": src.chat_template}
        if bos:
            jinja["bos"] = bos
        if eos:
            jinja["eos"] = eos
    info = {
        "source": src.origin.name,
        "kind": minfo["kind"],
        "vocab_size": len(table),
        "model_vocab_size": minfo["model_vocab"],
        "merges": minfo.get("merges"),
        "added_tokens": len(added),
        "special_ids": special,
        "stop_ids": stop,
        "prefix_ids": prefix,
        "bos_token": bos,
        "bos_id": bos_id,
        "eos_token": eos,
        "eos_id": eos_id,
        "chat_template": bool(src.chat_template),
        "llm_config": {"jinja": jinja} if jinja else {},
        "notes": _dedup(notes),
    }
    return head + body.bytes(), info


def _atomic_write(path: Path, data: bytes) -> None:
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise MnnToolError(f"{folder}: output folder does not exist")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as e:
        raise MnnToolError(f"{path}: cannot write ({e.strerror})") from None
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(e, OSError):
            raise MnnToolError(f"{path}: cannot write ({e.strerror})") from None
        raise
