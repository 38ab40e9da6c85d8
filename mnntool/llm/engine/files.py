"""A bundle folder's files, as MNN-LLM finds them: config.json names the graph, the weights, the
tokenizer and (untied models) the embeddings; llm_config.json holds the model's facts."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ...errors import MnnToolError


@dataclass
class BundleFiles:
    root: Path
    config: dict
    llm_config: dict
    graph: Path
    weights: Path
    tokenizer: Path
    embeddings: Path | None     # a separate embedding file (bf16 or quantized), None when tied

    @property
    def tie(self):
        return self.llm_config.get("tie_embeddings")


def _json(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read().decode("utf-8"))
    except FileNotFoundError:
        raise MnnToolError(f"{path}: not found (not an MNN-LLM bundle folder?)") from None
    except OSError as e:
        raise MnnToolError(f"{path}: cannot read ({e.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MnnToolError(f"{path}: malformed JSON ({e})") from None
    if not isinstance(data, dict):
        raise MnnToolError(f"{path}: not a JSON object")
    return data


def open_bundle(folder) -> BundleFiles:
    root = Path(folder)
    if root.is_file() and root.name.endswith(".json"):
        cfg_path, root = root, root.parent
    else:
        cfg_path = root / "config.json"
    if not root.is_dir():
        raise MnnToolError(f"{root}: not a folder")
    config = _json(cfg_path)
    base = root
    if config.get("base_dir"):
        base = Path(config["base_dir"])
        if not base.is_absolute():
            base = root / base
    llm_config = _json(base / "llm_config.json")

    def path(key: str, default: str | None) -> Path | None:
        name = config.get(key, default)
        if name is None:
            return None
        p = Path(name)
        return p if p.is_absolute() else base / p
    graph, weights = path("llm_model", "llm.mnn"), path("llm_weight", "llm.mnn.weight")
    tok = path("tokenizer_file", "tokenizer.mtok")
    for p, what in ((graph, "graph"), (weights, "weights")):
        if not p.is_file():
            raise MnnToolError(f"{p}: not found (the bundle's {what})")
    emb = path("embedding_file", None)
    if emb is None and not llm_config.get("tie_embeddings"):
        emb = base / "embeddings_bf16.bin"
    if emb is not None and not emb.is_file():
        raise MnnToolError(f"{emb}: not found (the bundle's embeddings; llm_config.json has no tie_embeddings)")
    return BundleFiles(base, config, llm_config, graph, weights, tok, emb)


def bundle_bytes(b: BundleFiles) -> int:
    return sum(os.path.getsize(p) for p in (b.graph, b.weights, b.embeddings) if p is not None and p.is_file())
