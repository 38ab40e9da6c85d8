"""torch.jit.load'ed TorchScript: the final outputs, named as the TorchScript frontend names them."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import MnnToolError
from .base import Runner


class TorchRunner(Runner):
    name = "torch"

    def __init__(self, path: Path, threads: int | None, shapes: dict, reference: bool = True):
        try:
            import torch
        except ImportError:
            raise MnnToolError("verifying TorchScript models needs torch: pip install 'mnntool[torch]'") from None
        self.torch, self.graph = torch, None
        self.module = torch.jit.load(str(path), map_location="cpu").eval()
        self.inputs = [v.debugName().split(".")[0] for v in self.module.graph.inputs()][1:]

    def run(self, feeds):
        torch = self.torch
        with torch.no_grad():
            out = self.module(*[torch.from_numpy(np.asarray(feeds[n])) for n in self.inputs])
        flat = [o.numpy() for o in (list(out) if isinstance(out, (tuple, list)) else [out])]
        return dict(zip(["output"] if len(flat) == 1 else [f"output_{k}" for k in range(len(flat))], flat))
