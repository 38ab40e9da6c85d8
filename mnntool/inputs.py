"""Model inputs shared by run, bench, verify and quant: seeded random data or user files."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .errors import MnnToolError
from .ir.graph import Graph


MAX_INPUT_BYTES = 1 << 30     # random inputs are drawn in float64 first: 2 GB at this bound


def random_feeds(g: Graph, shapes: dict | None = None, seed: int = 0) -> dict[str, np.ndarray]:
    """Normal floats; small non-negative ints for integer inputs (token ids, indices)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for name in g.inputs:
        t = g.tensors[name]
        shape = (shapes or {}).get(name) or t.shape
        if shape is None or not all(isinstance(d, int) and d > 0 for d in shape):
            raise MnnToolError(f"input '{name}' has an unknown shape {shape}; give it with --input-shape")
        nbytes = int(np.prod(shape, dtype=np.float64)) * 4
        if nbytes > MAX_INPUT_BYTES:
            raise MnnToolError(f"input '{name}' of shape {list(shape)} would take {nbytes / 2**30:.1f} GB")
        if np.dtype(t.dtype).kind in "iub":
            feeds[name] = rng.integers(0, 100, size=shape).astype(t.dtype)
        else:
            feeds[name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def input_files(specs) -> list[Path]:
    """The files named by --input specs (NAME=file.npy or a .npz): an output must not replace them."""
    return [Path(spec.partition("=")[2] if "=" in spec else spec) for spec in specs or []]


def load_feeds(specs, g: Graph) -> dict[str, np.ndarray]:
    """--input name=file.npy (repeatable), or one .npz holding every input by name."""
    feeds = {}
    for spec in specs or []:
        name, sep, path = spec.partition("=")
        if not sep:
            name, path = "", spec
        path = Path(path)
        if not path.exists():
            raise MnnToolError(f"--input {spec}: {path} does not exist")
        try:
            data = np.load(path, allow_pickle=False)
        except Exception as e:
            raise MnnToolError(f"--input {spec}: {path} is not a .npy/.npz file ({type(e).__name__})") from None
        if isinstance(data, np.lib.npyio.NpzFile):
            feeds.update({k: data[k] for k in data.files})
        else:
            if not name:
                if len(g.inputs) != 1:
                    raise MnnToolError(f"--input {spec}: name the input (NAME=FILE); inputs are {', '.join(g.inputs)}")
                name = g.inputs[0]
            feeds[name] = data
    for name in feeds:
        if name not in g.inputs:
            raise MnnToolError(f"--input names '{name}', but the model's inputs are {', '.join(g.inputs)}")
    for name, x in feeds.items():
        if x.dtype.kind == "f" and not np.isfinite(x).all():
            raise MnnToolError(f"input '{name}' contains NaN or infinite values")
    return feeds
