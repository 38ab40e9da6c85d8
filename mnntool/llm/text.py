"""Text to token ids with the checkpoint's own tokenizer.json, read as data by Hugging Face's
`tokenizers` library (the `[llm]` extra): calibration text for AWQ, evaluation text for perplexity."""
from __future__ import annotations

from pathlib import Path

from ..errors import MnnToolError


def read_text(path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MnnToolError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise MnnToolError(f"{path}: cannot read as UTF-8 text ({e})") from None


def tokenizer(model_dir):
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise MnnToolError("reading text needs the `tokenizers` package: pip install 'mnntool[llm]'") from None
    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        raise MnnToolError(f"{path}: missing (text is tokenized with the checkpoint's tokenizer.json)")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:      # the Rust library's parse errors are plain exceptions
        raise MnnToolError(f"{path}: not a tokenizer the tokenizers library reads ({str(e)[:200]})") from None


def encode_file(model_dir, text_path) -> list[int]:
    return tokenizer(model_dir).encode(read_text(text_path), add_special_tokens=False).ids
