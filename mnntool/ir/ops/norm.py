"""Normalizations: layer, group and instance norm over some axes with a learned affine; batch norm;
across-channel local response normalization (LRN)."""
from __future__ import annotations

import numpy as np

from . import define, numel, out_size, params, same


@define("LayerNorm", param="LayerNorm", inputs=("x", "gamma?", "beta?"), kind="normalization")
class LayerNorm:
    """(x - mean) / sqrt(var + epsilon) * gamma + beta over `axis` (RMS norm skips the mean when
    useRMSNorm); gamma and beta from the table, or the 2nd and 3rd inputs."""
    infer = same
    flops = out_size

    def compute(node, xs):
        x = xs[0].astype(np.float64)
        p = params(node)
        axes = tuple(sorted(int(a) % x.ndim for a in p.get("axis", [-1])))
        eps = float(p["epsilon"])
        tail = tuple(x.shape[a] for a in axes)
        bshape = tuple(x.shape[a] if a in axes else 1 for a in range(x.ndim))
        if p["useRMSNorm"]:
            y = x / np.sqrt(np.mean(x * x, axis=axes, keepdims=True) + eps)
        else:
            mean = x.mean(axis=axes, keepdims=True)
            y = (x - mean) / np.sqrt(((x - mean) ** 2).mean(axis=axes, keepdims=True) + eps)
        gamma = xs[1] if len(xs) > 1 and xs[1] is not None else p.get("gamma")
        beta = xs[2] if len(xs) > 2 and xs[2] is not None else p.get("beta")
        if gamma is not None and np.size(gamma):
            y = y * np.broadcast_to(np.asarray(gamma, np.float64).reshape(-1) if np.size(gamma) == np.prod(tail)
                                    else np.asarray(gamma, np.float64), tail).reshape(bshape)
        if beta is not None and np.size(beta):
            y = y + np.broadcast_to(np.asarray(beta, np.float64).reshape(-1) if np.size(beta) == np.prod(tail)
                                    else np.asarray(beta, np.float64), tail).reshape(bshape)
        return y.astype(xs[0].dtype)


@define("BatchNorm", param="BatchNorm", kind="normalization")
class BatchNorm:
    """Inference batch norm, (x - meanData) / sqrt(varData + epsilon) * slopeData + biasData per channel
    (axis 1). Every frontend emits it; the fold_batch_norm pass lowers it to Scale for MNN."""
    infer = same
    flops = out_size

    def compute(node, xs):
        x = xs[0]
        p = params(node)
        shape = (1, -1) + (1,) * (x.ndim - 2)
        s, b = batch_norm_affine(p)
        return (x * s.reshape(shape) + b.reshape(shape)).astype(x.dtype)


def batch_norm_affine(p: dict):
    """(scale, bias) of the per-channel affine a BatchNorm table amounts to, in float64, then float32."""
    mean = np.asarray(p["meanData"], np.float64)
    var = np.asarray(p["varData"], np.float64)
    slope = np.asarray(p["slopeData"], np.float64) if p.get("slopeData") is not None else np.ones_like(mean)
    bias = np.asarray(p["biasData"], np.float64) if p.get("biasData") is not None else np.zeros_like(mean)
    s = slope / np.sqrt(var + float(p["epsilon"]))
    return s.astype(np.float32), (bias - mean * s).astype(np.float32)


def batch_norm_param(mean, var, eps, gamma=None, beta=None) -> dict:
    """The BatchNorm table the frontends emit (gamma 1 and beta 0 when absent)."""
    mean = np.asarray(mean, np.float32).reshape(-1)
    return {"channels": int(mean.size), "meanData": mean, "varData": np.asarray(var, np.float32).reshape(-1),
            "slopeData": np.ones_like(mean) if gamma is None else np.asarray(gamma, np.float32).reshape(-1),
            "biasData": np.zeros_like(mean) if beta is None else np.asarray(beta, np.float32).reshape(-1),
            "epsilon": float(eps)}


@define("LRN", param="LRN", kind="normalization")
class LRN:
    """Across-channel local response normalization, x / (bias + alpha / size * sum of squares)^beta over
    the `localSize` channels around each (ONNX's window: (size - 1) // 2 before, size // 2 after). A field
    the file leaves out is the schema's default, as MNN reads it (alpha and beta 0, bias 1); ONNX's own
    defaults (alpha 1e-4, beta 0.75) are its converter's to write."""
    infer = same

    def flops(node, ins, outs):
        return numel(outs[0].shape) * (params(node)["localSize"] + 3)

    def compute(node, xs):
        x = xs[0].astype(np.float64)
        p = params(node)
        size = p["localSize"]
        sq = np.pad(x * x, [(0, 0), ((size - 1) // 2, size // 2)] + [(0, 0)] * (x.ndim - 2))
        acc = sum(sq[:, k:k + x.shape[1]] for k in range(size))
        return (x / (p["bias"] + p["alpha"] / size * acc) ** p["beta"]).astype(xs[0].dtype)
