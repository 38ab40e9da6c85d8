"""tokenizer.mtok (mnntool.llm.tokenizer.write_mtok): MNN-LLM encodes with our file as Hugging Face does.

The MNN side runs in a child process (MNN can segfault). It needs no exported model: a "carrier" bundle
of config.json, our tokenizer.mtok and empty llm.mnn / llm.mnn.weight makes `Llm.load()` fail after the
tokenizer has loaded, and `tokenizer_encode` / `tokenizer_decode` / `apply_chat_template` still work.
`mnn_encode(bundle_dir, texts)` works on any bundle, the exporter's included.

Known deviations of MNN's reader, asserted here so a change shows (the writer reports them in `notes`):
- NFC is applied per code point: "e" + U+0301 stays two code points (tokenizers composes them).
- Metaspace prepend_scheme "first": MNN prefixes the text after an added token with "▁" too.
- A post-processor's suffix (BERT's [SEP]) cannot be expressed in MNN 3.6.1 and is dropped.
"""
from __future__ import annotations

import glob
import importlib.util
import json
import os
import shutil
import struct
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from mnntool.errors import MnnToolError
from mnntool.llm.tokenizer import write_mtok

REPO = Path(__file__).resolve().parents[2]
HAS_MNN = importlib.util.find_spec("MNN") is not None
HAS_TOKENIZERS = importlib.util.find_spec("tokenizers") is not None
needs_mnn = pytest.mark.skipif(not HAS_MNN, reason="the mnn package (MNN-LLM) is not installed")
needs_tokenizers = pytest.mark.skipif(not HAS_TOKENIZERS, reason="the tokenizers package is not installed")

QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_REGEX = QWEN2_REGEX.replace(r"|\p{N}|", r"|\p{N}{1,3}|")

TEXTS_PLAIN = [
    "def main():\n    return 42\n",
    "Hello, world! I'm here; you're there. They'll go, we'd stay, it's OK.",
    "    indented\n\n\n\ttabs\t\tand   spaces   \n",
    "  leading and trailing  ",
    "中文测试，你好世界！日本語のテキスト。",
    "café naïve résumé Ωmega ﬁne ① ＡＢＣ",
    "emoji 😀👍🏽 and 🇨🇳 flags",
    "numbers 1234567 3.14159 0x1F",
    "mixed\r\nline\rends",
    "UPPER lower MiXeD",
    "a",
    " ",
    "",
]
COMBINING = "e\u0301 combining"
TEXTS_SPECIAL = [
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
    "<s>[INST] hello [/INST]</s>",
    "x<think>reasoning</think> answer",
]


# --------------------------------------------------------------------------------------------------
# reusable helpers: a carrier bundle, MNN's encoding in a child process, a reader of the file
# --------------------------------------------------------------------------------------------------

def make_tokenizer_bundle(mtok_path, bundle_dir) -> Path:
    """A bundle MNN.llm can load a tokenizer from without any model: returns its config.json."""
    bundle_dir = Path(bundle_dir)
    bundle_dir.mkdir(parents=True, exist_ok=True)
    (bundle_dir / "config.json").write_text(json.dumps({
        "llm_model": "llm.mnn", "llm_weight": "llm.mnn.weight", "tokenizer_file": "tokenizer.mtok",
        "backend_type": "cpu", "thread_num": 1}))
    (bundle_dir / "llm_config.json").write_text("{}")
    for name in ("llm.mnn", "llm.mnn.weight"):
        (bundle_dir / name).write_bytes(b"")
    if Path(mtok_path).resolve() != (bundle_dir / "tokenizer.mtok").resolve():
        shutil.copyfile(mtok_path, bundle_dir / "tokenizer.mtok")
    return bundle_dir / "config.json"


_CHILD = r'''
import json, sys
import MNN.llm as llm
out = []
for job in json.loads(sys.stdin.read()):
    m = llm.create(job["config"])
    m.load()  # fails on a carrier bundle's empty model after loading the tokenizer: fine
    res = {"ids": [], "pieces": [], "chat": None}
    for text in job["texts"]:
        ids = [int(i) for i in m.tokenizer_encode(text)]
        pieces = []
        for i in ids:
            try:
                pieces.append(m.tokenizer_decode(i))
            except Exception:  # a lone byte of a multi-byte character is not valid UTF-8
                pieces.append(None)
        res["ids"].append(ids)
        res["pieces"].append(pieces)
    if job.get("chat") is not None:
        res["chat"] = m.apply_chat_template(job["chat"])
    out.append(res)
print("@@MNN_RESULT@@" + json.dumps(out), flush=True)
'''


def mnn_run(jobs: list[dict], timeout: float = 120) -> list[dict]:
    """Run MNN-LLM in one child process over jobs [{"config": config.json, "texts": [...], "chat": str?}]
    -> [{"ids": [[...]], "pieces": [[per-id decoded text or None]], "chat": rendered prompt or None}]."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", _CHILD], input=json.dumps(jobs), capture_output=True,
                          text=True, timeout=timeout, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith("@@MNN_RESULT@@"):
            return json.loads(line[len("@@MNN_RESULT@@"):])
    raise AssertionError(f"MNN child failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}\n{proc.stdout[-2000:]}")


def mnn_encode(bundle_dir, texts, timeout: float = 120) -> list[list[int]]:
    """Token ids MNN-LLM gives each text with the bundle in `bundle_dir` (its config.json), in a child."""
    return mnn_run([{"config": str(Path(bundle_dir) / "config.json"), "texts": list(texts)}], timeout)[0]["ids"]


def read_mtok(path) -> dict:
    """The sections of a tokenizer.mtok, parsed independently of the writer (for comparisons)."""
    data = Path(path).read_bytes()
    l1, l2, l3, b = data.split(b"\n", 3)
    ns, nst, npf = map(int, l2.split())
    ids = [int(x) for x in l3.split()]
    out = {"header": tuple(map(int, l1.split())), "special": ids[:ns], "stop": ids[ns:ns + nst],
           "prefix": ids[ns + nst:ns + nst + npf]}
    p = 0

    def take(fmt):
        nonlocal p
        v = struct.unpack_from(fmt, b, p)
        p += struct.calcsize(fmt)
        return v[0] if len(v) == 1 else v

    def s():
        nonlocal p
        n = take("<H")
        p += n
        return b[p - n:p]

    def table():
        return [(take("<I"), s()) for _ in range(take("<I"))]

    def norm():
        t = take("<B")
        return {0: lambda: None, 2: lambda: ("Prepend", s()), 3: lambda: ("Replace", s(), s()),
                4: lambda: ("Sequence", [norm() for _ in range(take("<I"))]),
                5: lambda: ("Bert", take("<4B")), 6: lambda: ("Table", len(table())),
                7: lambda: ("BertNFD", *(lambda a: (a, len(table()) if a[2] else 0))(take("<4B"))),
                8: lambda: ("Strip", take("<2B"))}[t]()

    def pre():
        t = take("<B")
        return {0: lambda: None, 1: lambda: ("ByteLevel", take("<B")), 2: lambda: ("Digits", take("<B")),
                3: lambda: ("Metaspace", s(), take("<B")), 4: lambda: ("Split", s(), take("<2B")),
                5: lambda: ("Bert",), 6: lambda: ("Sequence", [pre() for _ in range(take("<I"))])}[t]()

    def dec():
        t = take("<B")
        return {0: lambda: ("ByteLevel",), 1: lambda: ("ByteFallback",), 2: lambda: ("Metaspace", s(), take("<B")),
                3: lambda: ("WordPiece", s(), take("<B")), 4: lambda: ("Fuse",), 5: lambda: ("Replace", s(), s()),
                6: lambda: ("Strip", s(), take("<2I")), 7: lambda: ("Sequence", [dec() for _ in range(take("<I"))])
                }.get(t, lambda: None)()

    out["normalizer"], out["pre_tokenizer"] = norm(), pre()
    mt, n = take("<B"), take("<I")
    model = {"type": ("BPE", "WordPiece", "Unigram")[mt]}
    if mt == 0:
        model["byte_fallback"], model["byte_level"], nm = take("<B"), take("<B"), take("<I")
        model["vocab"] = [(s(), take("<I")) for _ in range(n)]
        model["merges"] = [take("<3I") for _ in range(nm)]
    elif mt == 1:
        model["unk"], model["prefix"], model["max_chars"] = s(), s(), take("<I")
        model["vocab"] = [(s(), take("<I")) for _ in range(n)]
    else:
        model["unk_id"], model["byte_fallback"] = take("<I"), take("<B")
        model["vocab"] = [(s(), take("<I"), take("<d")) for _ in range(n)]
    out["model"], out["decoder"] = model, dec()
    out["added"] = [(take("<I"), take("<3B"), s()) for _ in range(take("<I"))]
    tpl_len = take("<I")
    out["chat_template"] = b[p:p + tpl_len].decode()
    p += tpl_len
    out["eos"], out["flags"], out["bos"] = s(), take("<B"), s()
    out["trailing"] = len(b) - p
    return out


# --------------------------------------------------------------------------------------------------
# tokenizers trained here on the standard library's .py files
# --------------------------------------------------------------------------------------------------

def _corpus(n: int) -> list[str]:
    return sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))[:n]


CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _save(tok, out: Path, config: dict, tokenizer_json: dict | None = None) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    if tokenizer_json is None:
        tok.save(str(out / "tokenizer.json"))
    else:
        (out / "tokenizer.json").write_text(json.dumps(tokenizer_json, ensure_ascii=False))
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


def _byte_level(out: Path, style: str) -> Path:
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    if style == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_REGEX if style == "qwen2" else LLAMA3_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    if style == "qwen2":
        tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    tok.train(_corpus(12), trainers.BpeTrainer(vocab_size=1500, special_tokens=specials, show_progress=False,
                                               initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.add_tokens(["<think>", "</think>"])
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
              "pad_token": "<|endoftext|>", "chat_template": CHAT_TEMPLATE}
    if style == "llama3":  # BOS through the post-processor
        tok.post_processor = processors.TemplateProcessing(single="<|endoftext|> $A",
                                                           special_tokens=[("<|endoftext|>", 0)])
        config["bos_token"] = "<|endoftext|>"
    return _save(tok, out, config)


def _metaspace(out: Path, scheme: str, unigram: bool = False) -> Path:
    """Llama-2 style: byte-fallback BPE (or Unigram), <unk> <s> </s>, then the 256 byte pieces."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    specials = ["<unk>", "<s>", "</s>"]
    if unigram:
        tok = Tokenizer(models.Unigram())
        trainer = trainers.UnigramTrainer(vocab_size=800, special_tokens=specials, unk_token="<unk>",
                                          show_progress=False)
        files = _corpus(3)
    else:
        tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
        trainer = trainers.BpeTrainer(vocab_size=1500, special_tokens=specials, show_progress=False)
        files = _corpus(12)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    tok.train(files, trainer)
    j = json.loads(tok.to_str())
    m = j["model"]
    if unigram:  # byte pieces at the end, score 0 as SentencePiece gives them
        m["vocab"] += [[f"<0x{b:02X}>", 0.0] for b in range(256)]
        m["byte_fallback"] = True
    else:
        old = sorted(m["vocab"].items(), key=lambda kv: kv[1])
        vocab = {t: i for i, (t, _) in enumerate(old[:3])}
        for b in range(256):
            vocab[f"<0x{b:02X}>"] = len(vocab)
        for t, _ in old[3:]:
            vocab.setdefault(t, len(vocab))
        m["vocab"] = vocab
        for at in j["added_tokens"]:
            at["id"] = vocab[at["content"]]
    if scheme == "legacy":  # the pre-0.19 tokenizers layout of Llama-2: normalizer instead of Metaspace
        j["normalizer"] = {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}
        j["pre_tokenizer"] = None
    else:
        j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": scheme, "split": False}
    j["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
        {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    j["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
    return _save(None, out, {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
                             "eos_token": "</s>", "unk_token": "<unk>"}, j)


def _wordpiece(out: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train(_corpus(6), trainers.WordPieceTrainer(vocab_size=1000, show_progress=False,
                                                    special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]"]))
    tok.post_processor = processors.BertProcessing(("[SEP]", 3), ("[CLS]", 2))
    return _save(tok, out, {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]",
                            "sep_token": "[SEP]", "cls_token": "[CLS]", "pad_token": "[PAD]"})


KINDS = {  # name: (builder, texts)
    "gpt2": (lambda d: _byte_level(d, "gpt2"), TEXTS_PLAIN + [COMBINING] + TEXTS_SPECIAL),
    "qwen2": (lambda d: _byte_level(d, "qwen2"), TEXTS_PLAIN + TEXTS_SPECIAL),
    "llama3": (lambda d: _byte_level(d, "llama3"), TEXTS_PLAIN + [COMBINING] + TEXTS_SPECIAL),
    "llama2-legacy": (lambda d: _metaspace(d, "legacy"), TEXTS_PLAIN + [COMBINING] + TEXTS_SPECIAL),
    "llama2-always": (lambda d: _metaspace(d, "always"), TEXTS_PLAIN + [COMBINING] + TEXTS_SPECIAL),
    "llama2-first": (lambda d: _metaspace(d, "first"), TEXTS_PLAIN + [COMBINING]),
    "unigram": (lambda d: _metaspace(d, "always", unigram=True), TEXTS_PLAIN + [COMBINING] + TEXTS_SPECIAL),
    "bert": (_wordpiece, TEXTS_PLAIN + [COMBINING] + TEXTS_SPECIAL),
}
SUFFIX_DROPPED = {"bert"}  # [CLS] text [SEP]: MNN 3.6.1 has no way to append the [SEP]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Every kind trained, written with write_mtok, and encoded by MNN in one child process."""
    if not (HAS_TOKENIZERS and HAS_MNN):
        pytest.skip("needs the tokenizers and mnn packages")
    from tokenizers import Tokenizer
    root = tmp_path_factory.mktemp("mtok")
    code = Path(sysconfig.get_paths()["stdlib"], "textwrap.py").read_text(encoding="utf-8")[:3000]
    kinds, jobs = {}, []
    for name, (make, texts) in KINDS.items():
        src = make(root / "src" / name)
        texts = texts + [code]
        info = write_mtok(src, root / f"{name}.mtok")
        config = make_tokenizer_bundle(root / f"{name}.mtok", root / "bundle" / name)
        kinds[name] = {"src": src, "info": info, "texts": texts,
                       "hf": Tokenizer.from_file(str(src / "tokenizer.json"))}
        jobs.append({"config": str(config), "texts": texts, "chat": "hi there"})
    for (name, k), res in zip(kinds.items(), mnn_run(jobs)):
        k["mnn"] = res
    return kinds


# --------------------------------------------------------------------------------------------------
# MNN against Hugging Face tokenizers
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(KINDS))
def test_mnn_encodes_like_hf(built, name):
    k = built[name]
    for text, ids in zip(k["texts"], k["mnn"]["ids"]):
        expected = k["hf"].encode(text).ids
        if name in SUFFIX_DROPPED:
            expected = expected[:-1]
        assert ids == expected, f"{name}: {text[:60]!r}"


@pytest.mark.parametrize("name", [n for n in KINDS if n != "bert"])
def test_mnn_decodes_like_hf(built, name):
    """MNN's per-token decoding (what streaming generation prints), joined, gives HF's text back."""
    k = built[name]
    checked = 0
    for ids, pieces in zip(k["mnn"]["ids"], k["mnn"]["pieces"]):
        if None in pieces:  # a lone byte of a character: the binding cannot return it as str
            continue
        assert "".join(pieces) == k["hf"].decode(ids, skip_special_tokens=False), (name, ids)
        checked += 1
    assert checked >= len(k["texts"]) // 2


def test_known_deviations(built):
    """Documented limits of MNN's reader: they are reported in `notes`, and here to notice a change."""
    qwen = built["qwen2"]
    mnn = mnn_encode(Path(qwen["src"]).parent.parent / "bundle" / "qwen2", [COMBINING])[0]
    assert mnn != qwen["hf"].encode(COMBINING).ids  # NFC per code point cannot compose e + U+0301
    assert any("NFC" in n for n in qwen["info"]["notes"])
    assert any("first" in n for n in built["llama2-first"]["info"]["notes"])


def test_chat_template_embedded(built):
    """With no `jinja` in llm_config.json, MNN renders the template written into the file."""
    for name in ("gpt2", "qwen2"):
        assert built[name]["mnn"]["chat"] == "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n"
        assert built[name]["info"]["llm_config"] == {"jinja": {"chat_template": CHAT_TEMPLATE,
                                                               "eos": "<|im_end|>"}}


def test_summary(built):
    gpt2, llama3, llama2 = built["gpt2"]["info"], built["llama3"]["info"], built["llama2-always"]["info"]
    assert gpt2["kind"] == "byte-level BPE" and gpt2["prefix_ids"] == [] and gpt2["stop_ids"] == [2]
    assert gpt2["vocab_size"] == gpt2["model_vocab_size"] + 2  # <think>, </think> appended to the table
    assert sorted(gpt2["special_ids"]) == [0, 1, 2]
    assert llama3["prefix_ids"] == [0]
    assert llama2["kind"] == "BPE (byte fallback)" and llama2["prefix_ids"] == [1]
    assert llama2["bos_token"] == "<s>" and llama2["eos_id"] == 2 and llama2["stop_ids"] == [2]
    assert built["unigram"]["info"]["kind"] == "Unigram"


# --------------------------------------------------------------------------------------------------
# the file itself
# --------------------------------------------------------------------------------------------------

@needs_tokenizers
def test_file_layout(tmp_path):
    src = _byte_level(tmp_path / "src", "qwen2")
    info = write_mtok(src, tmp_path / "tokenizer.mtok")
    f = read_mtok(tmp_path / "tokenizer.mtok")
    assert f["header"] == (430, 4) and f["trailing"] == 0
    assert f["normalizer"] == ("Table", f["normalizer"][1]) and f["normalizer"][1] > 100
    assert f["pre_tokenizer"] == ("Sequence", [("Split", QWEN2_REGEX.encode(), (0, 0)), ("ByteLevel", 0)])
    assert f["decoder"] == ("ByteLevel",)
    vocab = f["model"]["vocab"]
    assert [v[0] for v in vocab] == sorted(v[0] for v in vocab)  # byte order: the reader bisects it
    assert sorted(v[1] for v in vocab) == list(range(info["vocab_size"]))  # no holes
    merges = f["model"]["merges"]
    assert [(a, b) for a, b, _ in merges] == sorted((a, b) for a, b, _ in merges)
    assert sorted(r for _, _, r in merges) == list(range(len(merges)))
    assert f["chat_template"] == CHAT_TEMPLATE and f["eos"] == b"<|im_end|>" and f["bos"] == b""
    assert f["stop"] == [2] and f["prefix"] == []
    assert [a[2] for a in f["added"]] == [b"<|endoftext|>", b"<|im_start|>", b"<|im_end|>", b"<think>",
                                          b"</think>"]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def _llmref_pairs():
    out = REPO / "build" / "llmref" / "out"
    pairs = []
    for bundle in sorted(out.glob("*/tokenizer.mtok")) if out.is_dir() else []:
        name = bundle.parent.name.rsplit("-q", 1)[0]
        src = REPO / "build" / "llmref" / "src" / name
        if (src / "tokenizer.json").is_file():
            pairs.append((src, bundle))
    return pairs


@pytest.mark.skipif(not _llmref_pairs(), reason="no llmexport reference bundles in build/llmref")
def test_same_as_llmexport(tmp_path):
    """llmexport's file for the same checkpoint: the same sections (its special ids are a set)."""
    for src, ref in _llmref_pairs():
        write_mtok(src, tmp_path / "mine.mtok")
        mine, theirs = read_mtok(tmp_path / "mine.mtok"), read_mtok(ref)
        assert sorted(mine.pop("special")) == sorted(theirs.pop("special"))
        m_vocab, t_vocab = mine["model"].pop("vocab"), theirs["model"].pop("vocab")
        assert set(t_vocab) <= set(m_vocab)  # ours adds the added tokens the model vocab lacks
        assert mine == theirs


# --------------------------------------------------------------------------------------------------
# SentencePiece tokenizer.model without tokenizer.json
# --------------------------------------------------------------------------------------------------

def _pb_varint(v: int) -> bytes:
    v &= (1 << 64) - 1
    out = bytearray()
    while True:
        out.append((v & 0x7F) | (0x80 if v > 0x7F else 0))
        v >>= 7
        if not v:
            return bytes(out)


def _pb(field: int, value) -> bytes:
    if isinstance(value, bytes):
        return _pb_varint(field << 3 | 2) + _pb_varint(len(value)) + value
    if isinstance(value, float):
        return _pb_varint(field << 3 | 5) + struct.pack("<f", value)
    return _pb_varint(field << 3) + _pb_varint(value)


def _spm_model(pieces, model_type=2, byte_fallback=True, **norm) -> bytes:
    """A SentencePiece ModelProto: pieces [(text, score, type)], trainer and normalizer specs."""
    body = b"".join(_pb(1, _pb(1, t.encode()) + _pb(2, float(s)) + _pb(3, ty)) for t, s, ty in pieces)
    body += _pb(2, _pb(3, model_type) + _pb(35, int(byte_fallback)) + _pb(40, 0) + _pb(41, 1) + _pb(42, 2))
    spec = {"add_dummy_prefix": 1, "remove_extra_whitespaces": 0, "escape_whitespaces": 1, **norm}
    body += _pb(3, _pb(1, b"identity") + _pb(3, spec["add_dummy_prefix"])
                + _pb(4, spec["remove_extra_whitespaces"]) + _pb(5, spec["escape_whitespaces"]))
    return body


SPM_PIECES = ([("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3)]
              + [(f"<0x{b:02X}>", 0.0, 6) for b in range(256)]
              + [(t, -float(i), 1) for i, t in enumerate(
                  ["▁", "h", "e", "l", "o", "w", "r", "d", "ll", "▁h", "▁he", "▁hell", "▁hello", "▁w", "or",
                   "▁wor", "ld", "▁world"])])


def test_sentencepiece_model_structure(tmp_path):
    (tmp_path / "tokenizer.model").write_bytes(_spm_model(SPM_PIECES))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": True}))
    info = write_mtok(tmp_path, tmp_path / "tokenizer.mtok")
    assert info["source"] == "tokenizer.model" and info["kind"] == "BPE (byte fallback)"
    assert info["prefix_ids"] == [1] and info["bos_token"] == "<s>" and info["eos_token"] == "</s>"
    f = read_mtok(tmp_path / "tokenizer.mtok")
    assert f["normalizer"] == ("Sequence", [("Prepend", "▁".encode()), ("Replace", b" ", "▁".encode())])
    assert f["pre_tokenizer"] is None
    ids = {t: i for t, i in f["model"]["vocab"]}
    # merges ranked by the joined piece's score: "▁h" (best) before "ll" ... "▁world"
    ranked = [(a, b) for a, b, _ in sorted(f["model"]["merges"], key=lambda m: m[2])]
    assert ranked[0] == (ids["l".encode()], ids["l".encode()])
    assert (ids["▁hell".encode()], ids["o".encode()]) in ranked
    assert [a[2] for a in f["added"]] == [b"<unk>", b"<s>", b"</s>"]


@needs_mnn
def test_sentencepiece_model_in_mnn(tmp_path):
    (tmp_path / "tokenizer.model").write_bytes(_spm_model(SPM_PIECES))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": True}))
    write_mtok(tmp_path, tmp_path / "tokenizer.mtok")
    make_tokenizer_bundle(tmp_path / "tokenizer.mtok", tmp_path / "bundle")
    v = {t: i for i, (t, _, _) in enumerate(SPM_PIECES)}
    got = mnn_encode(tmp_path / "bundle", ["hello world", "hello", "hé"])
    assert got[0] == [1, v["▁hello"], v["▁world"]]
    assert got[1] == [1, v["▁hello"]]
    assert got[2] == [1, v["▁h"], v["<0xC3>"], v["<0xA9>"]]  # é is not a piece: its UTF-8 bytes


# --------------------------------------------------------------------------------------------------
# what a user can get wrong
# --------------------------------------------------------------------------------------------------

def _tiny_json(**over) -> dict:
    j = {"version": "1.0", "added_tokens": [{"id": 3, "content": "<eos>", "special": True}],
         "normalizer": None, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
         "post_processor": None, "decoder": {"type": "ByteLevel"},
         "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "<eos>": 3}, "merges": ["a b"]}}
    j.update(over)
    return j


def _write_src(tmp_path, tj=None, raw: str | None = None, config=None) -> Path:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "tokenizer.json").write_text(raw if raw is not None else json.dumps(tj or _tiny_json()))
    if config is not None:
        (src / "tokenizer_config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    return src


def _refused(src, out, *words):
    with pytest.raises(MnnToolError) as e:
        write_mtok(src, out)
    msg = str(e.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, msg
    return msg


def test_tiny_ok(tmp_path):
    src = _write_src(tmp_path, config={"eos_token": "<eos>", "chat_template": "{{ messages }}",
                                       "bos_token": {"content": "a", "special": True}})
    (src / "generation_config.json").write_text(json.dumps({"eos_token_id": [3, 1]}))
    info = write_mtok(src, tmp_path / "t.mtok")
    assert info["stop_ids"] == [3, 1] and info["eos_id"] == 3 and info["bos_id"] == 0
    assert info["llm_config"] == {"jinja": {"chat_template": "{{ messages }}", "bos": "a", "eos": "<eos>"}}


def test_missing_tokenizer(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    _refused(tmp_path, tmp_path / "t.mtok", str(tmp_path), "tokenizer")
    _refused(tmp_path / "nope", tmp_path / "t.mtok", "nope")


def test_malformed_json(tmp_path):
    _refused(_write_src(tmp_path, raw='{"model": '), tmp_path / "t.mtok", "tokenizer.json", "malformed JSON")
    _refused(_write_src(tmp_path, config="{oops"), tmp_path / "t.mtok", "tokenizer_config.json", "malformed")
    _refused(_write_src(tmp_path, raw="[1, 2]", config={}), tmp_path / "t.mtok", "tokenizer.json", "model")


@pytest.mark.parametrize("over, words", [
    ({"model": {"type": "WordLevel", "vocab": {"a": 0}, "unk_token": "a"}}, ["model WordLevel"]),
    ({"normalizer": {"type": "NFD"}}, ["normalizer NFD"]),
    ({"normalizer": {"type": "Sequence", "normalizers": [{"type": "Lowercase"}, {"type": "Nmt"}]}},
     ["normalizer Nmt"]),
    ({"normalizer": {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}}, ["Replace", "regex"]),
    ({"pre_tokenizer": {"type": "Punctuation", "behavior": "Isolated"}}, ["pre-tokenizer Punctuation"]),
    ({"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True}}, ["ByteLevel", "add_prefix_space"]),
    ({"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "x"}, "behavior": "MergedWithNext"}},
     ["Split", "MergedWithNext"]),
    ({"decoder": {"type": "CTC"}}, ["decoder CTC"]),
    ({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a c"]}}, ["merge 0", "'c'"]),
    ({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a b"]}}, ["'ab'", "missing"]),
    ({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [], "end_of_word_suffix": "</w>"}},
     ["end_of_word_suffix"]),
    ({"added_tokens": [{"id": -1, "content": "x"}]}, ["added_tokens[0]"]),
])
def test_unsupported_components(tmp_path, over, words):
    _refused(_write_src(tmp_path, _tiny_json(**over)), tmp_path / "t.mtok", "tokenizer.json", *words)


def test_bad_sentencepiece_model(tmp_path):
    (tmp_path / "tokenizer.model").write_bytes(b"\x0a\xff\xff\xff")
    _refused(tmp_path, tmp_path / "t.mtok", "tokenizer.model", "protobuf")
    (tmp_path / "tokenizer.model").write_bytes(_spm_model(SPM_PIECES, remove_extra_whitespaces=1))
    _refused(tmp_path, tmp_path / "t.mtok", "tokenizer.model", "remove_extra_whitespaces")
    (tmp_path / "tokenizer.model").write_bytes(_spm_model(SPM_PIECES, model_type=3))
    _refused(tmp_path, tmp_path / "t.mtok", "tokenizer.model", "WORD")


def test_failed_write_keeps_old_file(tmp_path):
    out = tmp_path / "t.mtok"
    out.write_bytes(b"old")
    _refused(_write_src(tmp_path, _tiny_json(decoder={"type": "CTC"})), out, "CTC")
    assert out.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src", "t.mtok"]


def test_unwritable_output(tmp_path):
    src = _write_src(tmp_path)
    _refused(src, tmp_path / "missing" / "t.mtok", "missing", "does not exist")
    (tmp_path / "adir").mkdir()
    _refused(src, tmp_path / "adir", "adir", "cannot write")
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
