"""OpenCV's Caffe importer: the reference for Caffe models (fusion off, so each layer keeps its own
output; one tensor per blob's last writer)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import MnnToolError
from .base import Runner


class OpenCvRunner(Runner):
    name = "opencv"

    def __init__(self, path: Path, threads: int | None, shapes: dict, reference: bool = True):
        try:
            import cv2
        except ImportError:
            raise MnnToolError("verifying Caffe models needs OpenCV: pip install opencv-python-headless") from None
        from ..frontends.caffe import _active, find_pair, read_net
        self.graph = None
        proto, model = find_pair(path)
        layers = [lay for lay in read_net(proto).layer if _active(lay) and lay.type not in ("Input", "Dropout", "Split")]
        self.last = {}
        for lay in layers:
            for top in lay.top:
                self.last[top] = lay
        try:
            self.net = cv2.dnn.readNetFromCaffe(str(proto), str(model))
        except cv2.error as e:
            raise MnnToolError(f"{proto}: OpenCV cannot load it ({str(e).strip().splitlines()[-1][:120]})") from None
        self.net.enableFusion(False)

    def run_all(self, feeds, wanted=None):
        for name, x in feeds.items():
            self.net.setInput(np.ascontiguousarray(x, np.float32), name)
        known = set(self.net.getLayerNames())
        order = [(top, lay.type) for top, lay in self.last.items() if lay.name in known and lay.top[0] == top]
        outs = self.net.forward([self.last[top].name for top, _ in order])
        return {top: np.asarray(v) for (top, _), v in zip(order, outs)}, order

    def run(self, feeds):
        return self.run_all(feeds)[0]
