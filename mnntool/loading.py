"""A model file -> IR, importing only what that file needs: the runtime loads a .mnn with the reader
alone (mnntool.api, with every frontend, the passes and the writer, costs ~14 ms to import, a third of
MNN's whole load+prepare of a tiny transformer)."""
from __future__ import annotations

from pathlib import Path

from .errors import MnnToolError
from .ir.graph import Graph


def load_graph(path, framework: str | None = None, input_shapes: dict | None = None) -> Graph:
    """Any supported model file -> IR (a .mnn file is read, anything else goes through its frontend)."""
    path = Path(path)
    if (framework or "").lower() == "mnn" or (framework is None and path.suffix.lower() == ".mnn"):
        from .format import reader
        g = reader.load(path)
        for name, shape in (input_shapes or {}).items():
            if name not in g.inputs:
                raise MnnToolError(f"{path}: --input-shape names '{name}', but the inputs are {', '.join(g.inputs)}")
            g.tensors[name].shape = tuple(shape)
        return g
    from .frontends import load as load_source
    return load_source(path, framework, input_shapes)
