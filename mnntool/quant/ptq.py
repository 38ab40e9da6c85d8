"""Full int8 post-training quantization in MNN's representation.

Convolutions get int8 per-channel weights (quanParameter with scaleIn/scaleOut) and symmetricQuan;
their input and output tensors get a TensorQuantInfo scale from the chosen calibrator. Bias
correction removes the mean output shift that weight rounding causes, using the calibration
inputs' per-channel means.
"""
from __future__ import annotations

import copy

import numpy as np

from ..errors import MnnToolError
from ..ir.graph import Graph
from ..runtime.session import Session
from .calibrate import make
from .weights import dequantize, quantize_weight

CONVS = ("Convolution", "ConvolutionDepthwise")
SYMMETRIC = {"method": "DEFAULT", "nbits": 8, "zeroPoint": 0, "outputZeroPoint": 0, "clampMin": -127,
             "clampMax": 127, "outputDataType": "DT_INT8"}


MOVES = {"Reshape", "ConvertTensor", "Flatten", "Squeeze", "Unsqueeze", "Identity"}


def output_layers(g: Graph) -> set[str]:
    """Convolutions whose result reaches a graph output through data movement only. They stay float:
    an int8 output grid (127 levels) would flatten the small logit differences that decide the top-1."""
    producers = g.producers()
    found = set()
    for out in g.outputs:
        node = producers.get(out)
        while node is not None and node.op in MOVES:
            node = producers.get(node.inputs[0])
        if node is not None and node.op in CONVS:
            found.add(node.name)
    return found


def targets(g: Graph, skip: set[str]) -> list:
    keep_float = output_layers(g)
    out = []
    for n in g.nodes:
        if n.op in CONVS and n.name not in skip and n.outputs[0] not in skip and n.name not in keep_float \
                and n.param.get("weight") is not None:
            out.append(n)
    return out


def calibrate(g: Graph, samples: list[dict], method: str, nodes, progress=None) -> tuple[dict, dict]:
    """Per-tensor int8 scales for the inputs and outputs of `nodes`, and per-channel input means."""
    names = sorted({n.inputs[0] for n in nodes} | {n.outputs[0] for n in nodes})
    cals = {t: make(method) for t in names}
    means: dict[str, np.ndarray] = {}
    sess = Session(g)
    for k, feeds in enumerate(samples):
        every = sess.run(feeds, keep_all=True)
        for t in names:
            if t not in every:
                raise MnnToolError(f"tensor '{t}' was not computed during calibration")
            cals[t].observe(every[t])
        for n in nodes:
            x = every[n.inputs[0]]
            m = x.mean(axis=(0, 2, 3)) if x.ndim == 4 else x.reshape(-1, x.shape[-1]).mean(0)
            means[n.name] = means.get(n.name, 0) + m / len(samples)
        if progress:
            progress(1)
    return {t: c.scale() for t, c in cals.items()}, means


def quantize_int8(g: Graph, samples: list[dict], method: str = "kl", per_channel: bool = True,
                  skip: set[str] = frozenset(), bias_correction: bool = True, progress=None) -> Graph:
    if not samples:
        raise MnnToolError("no calibration samples")
    q = copy.deepcopy(g)
    nodes = targets(q, set(skip))
    if not nodes:
        if skip:
            return q      # everything asked to stay float
        raise MnnToolError("the model has no float convolutions to quantize")
    scales, means = calibrate(q, samples, method, nodes, progress)
    for n in nodes:
        c = n.param["common"]
        cout = c["outputCount"]
        w = np.asarray(n.param["weight"], np.float32).reshape(cout, -1)
        qp = quantize_weight(w, 8, False, cout, per_tensor=not per_channel)
        if bias_correction and n.name in means:
            err = w - dequantize(qp, cout)                       # (O, C/g * kh * kw)
            group = c.get("group", 1) or 1
            cin_g = c.get("inputCount", 0) // group or err.shape[1]
            k = c.get("kernelX", 1) * c.get("kernelY", 1)
            mu = np.asarray(means[n.name], np.float64)
            if err.shape[1] == cin_g * k and mu.size == cin_g * group:
                e = err.reshape(cout, cin_g, k).sum(-1)         # (O, C/g)
                og = cout // group
                shift = np.concatenate([e[g_ * og:(g_ + 1) * og] @ mu[g_ * cin_g:(g_ + 1) * cin_g]
                                        for g_ in range(group)])
                n.param["bias"] = (np.asarray(n.param["bias"], np.float64) + shift).astype(np.float32)
        qp["scaleIn"] = float(scales[n.inputs[0]])
        qp["scaleOut"] = float(scales[n.outputs[0]])
        n.param["quanParameter"] = qp
        n.param["symmetricQuan"] = dict(SYMMETRIC)
        n.param.pop("weight")
    for t, s in scales.items():
        q.info(t).quant = {"scale": float(s), "zero": 0.0, "min": -127.0, "max": 127.0, "type": "DT_INT8"}
    return q
