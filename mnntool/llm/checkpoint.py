"""A Hugging Face model folder as named tensors: config.json plus safetensors weights, nothing else.

A downloaded folder is untrusted. So: JSON and safetensors only. Pickle checkpoints (pytorch_model.bin,
*.pt) are refused, not loaded, because unpickling runs code; no module from the folder is imported and
`auto_map` / trust_remote_code are never acted on. Every file is checked when the folder is opened (an
index's shard paths stay inside the folder, each listed tensor is in its shard, no tensor is in two files,
dtypes are ones the exporter widens), so the graph builder meets a problem as one line at the start, not
halfway through a 15 GB export. Tensors are read one at a time from memory maps.
"""
from __future__ import annotations

import json
import os
from pathlib import Path, PurePosixPath, PureWindowsPath

import numpy as np

from ..errors import MnnToolError
from .safetensors import FP8, SafetensorsFile, show, to_float32

JSON_LIMIT = 64 << 20           # a config or index is KBs; more is not one
FLOATS = ("F32", "F16", "BF16", "F64")
ALLOWED = FLOATS + ("I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8", "BOOL")   # ints: buffers, ids
INDEX = "model.safetensors.index.json"
PICKLES = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")


def read_json_object(path: Path) -> dict:
    """A JSON object from a small file, or one MnnToolError line (missing, too big, not JSON, not an object)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(JSON_LIMIT + 1)
    except FileNotFoundError:
        raise MnnToolError(f"{path}: no such file") from None
    except (IsADirectoryError, PermissionError) as e:
        raise MnnToolError(f"{path}: cannot be read ({e.strerror})") from None
    if len(raw) > JSON_LIMIT:
        raise MnnToolError(f"{path}: larger than {JSON_LIMIT >> 20} MB, not a JSON config")
    try:
        value = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise MnnToolError(f"{path}: not UTF-8 text, expected JSON") from None
    except (ValueError, RecursionError) as e:
        raise MnnToolError(f"{path}: not valid JSON ({' '.join(str(e).split())[:120]})") from None
    if not isinstance(value, dict):
        raise MnnToolError(f"{path}: is a JSON {type(value).__name__}, expected an object")
    return value


def _shard_path(folder: Path, index: Path, name) -> Path:
    """An index's shard name as a path inside the folder: a name is text from the internet, and '../x' or
    '/etc/x' would read a file the user never gave. (Symlinks are followed: the HF cache's shards are links
    into its blob store.)"""
    if not isinstance(name, str) or not name or "\0" in name:
        raise MnnToolError(f"{index}: weight_map has a shard name that is not a file name")
    if PurePosixPath(name).is_absolute() or PureWindowsPath(name).anchor or ".." in PureWindowsPath(name).parts:
        raise MnnToolError(f"{index}: shard {show(name)} is outside the model folder")
    if not name.endswith(".safetensors"):
        raise MnnToolError(f"{index}: shard {show(name)} is not a .safetensors file")
    path = folder / name
    if not path.is_file():
        raise MnnToolError(f"{index}: shard {show(name)} does not exist in {folder}")
    return path


def _weights(folder: Path) -> tuple[list[Path], Path | None, dict[str, str]]:
    """The weight files, in transformers' order of preference: model.safetensors, the index, any
    *.safetensors. Returns (files, index path or None, the index's weight_map)."""
    if (folder / "model.safetensors").is_file():
        return [folder / "model.safetensors"], None, {}
    index = folder / INDEX
    if index.is_file():
        weight_map = read_json_object(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise MnnToolError(f"{index}: has no weight_map object naming the tensors' shards")
        files: dict[str, Path] = {}
        for shard in weight_map.values():
            if not (isinstance(shard, str) and shard in files):     # checked before it is a key
                files[shard] = _shard_path(folder, index, shard)
        return sorted(set(files.values())), index, weight_map
    files = sorted(p for p in folder.glob("*.safetensors") if p.is_file() and not p.name.startswith("."))
    if files:
        return files, None, {}
    pickles = sorted({p.name for pattern in PICKLES for p in folder.glob(pattern)})
    if pickles:
        raise MnnToolError(f"{folder}: has only pickle weights ({', '.join(pickles[:3])}); mnntool does not read "
                           "pickle files (loading one can run code): convert to safetensors, e.g. "
                           "model.save_pretrained(out_dir, safe_serialization=True)")
    raise MnnToolError(f"{folder}: no weights (expected model.safetensors, {INDEX} or *.safetensors)")


class Checkpoint:
    """config.json, generation_config.json and the tensors of a model folder; `get` widens one at a time."""

    def __init__(self, folder: Path, config: dict, generation_config: dict, where: dict[str, SafetensorsFile],
                 files: list[SafetensorsFile]):
        self.dir = folder
        self.config = config
        self.generation_config = generation_config
        self._where = where
        self._files = files

    @classmethod
    def open(cls, model_dir: str | os.PathLike) -> Checkpoint:
        folder = Path(model_dir)
        if not folder.is_dir():
            raise MnnToolError(f"{folder}: {'not a folder' if folder.exists() else 'no such folder'}; "
                               "expected a Hugging Face model folder (config.json, *.safetensors)")
        config = read_json_object(folder / "config.json")
        gen_path = folder / "generation_config.json"
        generation = read_json_object(gen_path) if gen_path.exists() else {}
        paths, index, weight_map = _weights(folder)
        files: list[SafetensorsFile] = []
        try:
            where: dict[str, SafetensorsFile] = {}
            for path in paths:
                sf = SafetensorsFile(path)
                files.append(sf)
                for name in sf.names:
                    if name in where:
                        raise MnnToolError(f"{path}: tensor {show(name)} is also in {where[name].path.name}")
                    dtype = sf.info(name).dtype
                    if dtype not in ALLOWED:
                        why = ("FP8 weights need their block scales: dequantize to BF16 or F16 first" if dtype in FP8
                               else "expected F32, F16, BF16 or integer buffers")
                        raise MnnToolError(f"{path}: tensor {show(name)} has dtype {dtype}, not supported ({why})")
                    where[name] = sf
            for name, shard in weight_map.items():
                if where.get(name) is None or where[name].path != folder / shard:
                    raise MnnToolError(f"{index}: tensor {show(name)} is listed in {show(shard)}, which does not have it")
            if not where:
                raise MnnToolError(f"{paths[0]}: has no tensors")
        except BaseException:
            for sf in files:
                sf.close()
            raise
        return cls(folder, config, generation, where, files)

    def _file(self, name: str) -> SafetensorsFile:
        if name not in self._where:
            raise MnnToolError(f"{self.dir}: the checkpoint has no tensor {show(name)}")
        return self._where[name]

    def names(self) -> list[str]:
        return list(self._where)

    def has(self, name: str) -> bool:
        return name in self._where

    def shape(self, name: str) -> tuple[int, ...]:
        return self._file(name).info(name).shape

    def dtype(self, name: str) -> str:
        return self._file(name).info(name).dtype

    def file(self, name: str) -> Path:
        return self._file(name).path

    def raw(self, name: str) -> np.ndarray:
        """The stored values as a read-only view of the map (BF16 as uint16 bits), for copying unchanged."""
        return self._file(name).get(name)

    def get(self, name: str) -> np.ndarray:
        """A float32 copy of a float tensor (BF16/F16/F64 widened or narrowed); an integer or bool buffer is a
        copy in its own dtype (native byte order), since float32 would change large int64 values."""
        sf = self._file(name)
        dtype = sf.info(name).dtype
        view = sf.get(name)
        if dtype in FLOATS:
            out = to_float32(view, dtype)
        elif dtype == "BOOL":
            out = view.view(np.uint8) != 0         # a byte other than 0/1 is still a plain bool
        else:
            out = view.astype(view.dtype.newbyteorder("="))
        sf.release(name)        # the copy is what the caller keeps: the file's pages need not stay resident
        return out

    def expect_shape(self, name: str, shape) -> None:
        """The graph builder's check that the weights are the size the config says."""
        want = [int(d) for d in shape]
        if name not in self._where:
            raise MnnToolError(f"{self.dir}: the checkpoint has no tensor {show(name)} (the config says {want})")
        have = list(self.shape(name))
        if have != want:
            raise MnnToolError(f"{self.file(name)}: tensor {show(name)} has shape {have}, the config says {want}")

    def close(self) -> None:
        for sf in self._files:
            sf.close()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
