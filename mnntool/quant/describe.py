"""What a .mnn file's quantization is, read back from the file alone (`mnntool info --quant`): per layer
the kind (int8 compute, weight-only, fp16 or float), the bits, symmetric or not, the block (input channels
per scale), a summary of the scales, and the int8 tensors' grids.

Why from the file: a file may come from mnntool, from MNN's converter (`--weightQuantBits`,
`--weightQuantBlock`, `--fp16`) or from MNN's quantizer, and its report, if any, is not beside it. The
layout read is format/idst.py's (IDSTQuan: `aMaxOrBits`, `readType` != 0 for (min, scale) pairs, one
scale a run of equal length) and MNN's `symmetricQuan` for int8 compute.
"""
from __future__ import annotations

import numpy as np

from ..format import idst
from ..ir.graph import Graph
from ..ir.ops import is_convolution, is_deconvolution

# Bits of one stored scale, and of one minimum of an asymmetric block: MNN keeps them as float32.
# `stored_bits` counts them with the weight codes, as llama.cpp's bits per weight counts each block's
# fp16 scale (Q4_0: 4.5 bits); biases and table headers are not counted.
SCALE_BITS = 32
# MNN's own int8 convolutions (older quantizer output), which the IR has no definition of
MNN_INT8_CONVS = ("ConvInt8", "DepthwiseConvInt8")


def _holds_weights(op: str) -> bool:
    return is_convolution(op) or is_deconvolution(op) or op in MNN_INT8_CONVS


def _scales(values) -> dict | None:
    a = np.asarray(values, np.float64).ravel()
    if not a.size:
        return None
    return {"count": int(a.size), "min": float(a.min()), "median": float(np.median(a)), "max": float(a.max())}


def _kernel(common: dict) -> int:
    return max(int(common.get("kernelX", 1) or 1), 1) * max(int(common.get("kernelY", 1) or 1), 1)


def layer(node) -> dict | None:
    """One convolution's quantization, or None for an op that holds no weights."""
    if not _holds_weights(node.op) or not isinstance(node.param, dict):
        return None
    p = node.param
    common = p.get("common") or {}
    rows = int(common.get("outputCount", 0) or 0)
    qp, sq = p.get("quanParameter"), p.get("symmetricQuan")
    out = {"name": node.name or node.outputs[0], "op": node.op, "kind": "float", "bits": 32, "symmetric": None,
           "block": None, "weights": None, "scales": None}
    if sq and (sq.get("weight") is not None and np.asarray(sq.get("weight")).size):     # MNN's quantizer: ConvInt8
        w = np.asarray(sq["weight"])
        out.update(kind="int8", bits=int(sq.get("nbits", 8) or 8), symmetric=True, weights=int(w.size),
                   block="channel", scales=_scales(sq.get("scale", ())))
        out["stored_bits"] = out["bits"] * out["weights"] + SCALE_BITS * np.asarray(sq.get("scale", ())).size
    elif qp and int(qp.get("type", 1)) == 3:
        out.update(kind="fp16", bits=16, weights=int(np.asarray(qp["buffer"]).size // 2))
    elif qp:
        q, bits = idst.unpack(np.asarray(qp["buffer"]).astype(np.int8))
        alpha = np.asarray(qp.get("alpha", ()), np.float64)
        asymmetric = int(qp.get("readType", 0) or 0) != 0
        groups = alpha.size // 2 if asymmetric else alpha.size
        per_scale = q.size // groups if groups else 0
        kernel = _kernel(common)
        block = "channel" if rows and groups == rows else (
            per_scale // kernel if per_scale % kernel == 0 else per_scale)      # input channels per scale
        out.update(kind="int8" if sq else "weight-only", bits=int(qp.get("aMaxOrBits") or bits),
                   symmetric=not asymmetric, block=block, weights=int(q.size),
                   scales=_scales(alpha[1::2] if asymmetric else alpha))
        out["stored_bits"] = out["bits"] * out["weights"] + SCALE_BITS * alpha.size
    else:
        w = p.get("weight")
        out["weights"] = int(np.asarray(w).size) if w is not None else None
    if "stored_bits" not in out:
        out["stored_bits"] = out["bits"] * out["weights"] if out["weights"] else None
    if sq:
        out["int8"] = {"input_zero_point": int(sq.get("zeroPoint", 0) or 0),
                       "output_zero_point": int(sq.get("outputZeroPoint", 0) or 0),
                       "output": "float" if sq.get("outputDataType") == "DT_FLOAT" else "int8",
                       "input_scale": float(qp.get("scaleIn", 0) or 0) if qp else None,
                       "output_scale": float(qp.get("scaleOut", 0) or 0) if qp else None}
    return out


def describe(g: Graph) -> dict:
    """The whole file: per layer (the ops that hold weights), counts by kind and bits, bits per weight over
    the layers, and the int8 tensors (MNN's TensorQuantInfo)."""
    layers = [x for x in (layer(n) for n in g.nodes) if x is not None]
    kinds: dict = {}
    bits: dict = {}
    for x in layers:
        kinds[x["kind"]] = kinds.get(x["kind"], 0) + 1
        bits[str(x["bits"])] = bits.get(str(x["bits"]), 0) + 1
    counted = [x for x in layers if x["weights"]]
    total = sum(x["weights"] for x in counted)
    tensors = [{"name": t.name, "scale": float(t.quant.get("scale", 0)), "zero": float(t.quant.get("zero", 0)),
                "min": float(t.quant.get("min", 0)), "max": float(t.quant.get("max", 0))}
               for t in g.tensors.values() if t.quant]
    if kinds.get("int8"):
        mode = "int8"
    elif kinds.get("weight-only"):
        mode = "weight-only int" + "/".join(sorted({str(x["bits"]) for x in layers if x["kind"] == "weight-only"},
                                                 key=int))
    elif kinds.get("fp16"):
        mode = "fp16"
    else:
        mode = "float"
    return {"mode": mode, "layers": layers, "kinds": kinds, "bits": bits, "weights": total,
            "bits_per_weight": sum(x["weights"] * x["bits"] for x in counted) / total if total else None,
            "bits_per_weight_stored": sum(x["stored_bits"] for x in counted) / total if total else None,
            "int8_tensors": tensors}
