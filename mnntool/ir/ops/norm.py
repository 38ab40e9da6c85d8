"""Normalizations: layer, group and instance norm over some axes with a learned affine."""
from __future__ import annotations

import numpy as np

from . import define, out_size, same


@define("LayerNorm", param="LayerNorm", inputs=("x", "gamma?", "beta?"))
class LayerNorm:
    """(x - mean) / sqrt(var + epsilon) * gamma + beta over `axis` (RMS norm skips the mean when
    useRMSNorm); gamma and beta from the table, or the 2nd and 3rd inputs."""
    infer = same
    flops = out_size

    def compute(node, xs):
        x = xs[0].astype(np.float64)
        p = node.param
        axes = tuple(sorted(int(a) % x.ndim for a in p.get("axis", [-1])))
        eps = float(p.get("epsilon", 1e-5))
        tail = tuple(x.shape[a] for a in axes)
        bshape = tuple(x.shape[a] if a in axes else 1 for a in range(x.ndim))
        if p.get("useRMSNorm"):
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
