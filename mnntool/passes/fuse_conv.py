"""Fold what follows a convolution into it: Scale (BatchNorm), Mul/Add by per-channel constants, and
ReLU/ReLU6 into its activation flags."""
from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Node
from ..ir.ops import is_convolution, is_deconvolution
from .util import per_channel, sole_user


def _bypass(g: Graph, conv: Node, follower: Node) -> None:
    """The conv takes over the follower's output tensor; the follower disappears."""
    conv.outputs = list(follower.outputs)
    g.nodes.remove(follower)


def _affine_of(g: Graph, node: Node, cout: int):
    """(scale, shift) per output channel when node is Scale or Mul/Add/Sub/Div by a constant, else None."""
    if node.op == "Scale":
        s = np.asarray(node.param["scaleData"], np.float64).reshape(-1)
        b = node.param.get("biasData")
        b = np.zeros(cout) if b is None or len(b) == 0 else np.asarray(b, np.float64).reshape(-1)
        return (s, b) if s.size == cout and b.size == cout else None
    if node.op != "BinaryOp" or len(node.inputs) != 2 or int(node.param.get("activationType", 0)):
        return None     # an add with a fused ReLU is not affine
    op = node.param.get("opType")
    const = g.constants.get(node.inputs[1])
    if const is None or const.dtype.kind != "f":
        return None
    v = per_channel(const, cout)
    if v is None:
        return None
    if op == "MUL":
        return v, np.zeros(cout)
    if op == "ADD":
        return np.ones(cout), v
    if op == "SUB":
        return np.ones(cout), -v
    if op == "REALDIV" and np.all(v != 0):
        return 1.0 / v, np.zeros(cout)
    return None


class FoldAffineIntoConvPass:
    name = "fold_affine_into_conv"

    def __call__(self, g: Graph) -> bool:
        changed = False
        for conv in [n for n in g.nodes if is_convolution(n.op)]:
            while True:
                c = conv.param["common"]
                nxt = sole_user(g, conv)
                if nxt is None or c.get("relu") or c.get("relu6") or nxt.inputs[0] != conv.outputs[0]:
                    break
                cout = c["outputCount"]
                affine = _affine_of(g, nxt, cout)
                if affine is None:
                    break
                scale, shift = affine
                w = np.asarray(conv.param["weight"], np.float64).reshape(cout, -1) * scale[:, None]
                b = np.asarray(conv.param["bias"], np.float64) * scale + shift
                conv.param["weight"] = w.astype(np.float32).reshape(-1)
                conv.param["bias"] = b.astype(np.float32)
                _bypass(g, conv, nxt)
                changed = True
        return changed


class FuseReluIntoConvPass:
    name = "fuse_relu_into_conv"

    def __call__(self, g: Graph) -> bool:
        changed = False
        for conv in [n for n in g.nodes if is_convolution(n.op) or is_deconvolution(n.op)]:
            common = conv.param["common"]
            nxt = sole_user(g, conv)
            if nxt is None or common.get("relu") or common.get("relu6"):
                continue
            if nxt.op == "ReLU" and float(nxt.param.get("slope", 0.0)) == 0.0:
                common["relu"] = True
            elif nxt.op == "ReLU6" and float(nxt.param.get("minValue", 0.0)) == 0.0 and \
                    float(nxt.param.get("maxValue", 6.0)) == 6.0:
                common["relu6"] = True
            else:
                continue
            _bypass(g, conv, nxt)
            changed = True
        return changed


class FuseReluIntoBinaryPass:
    """BinaryOp followed by ReLU -> the BinaryOp's activationType 1, as MNN's converter writes residual adds."""
    name = "fuse_relu_into_binary"

    def __call__(self, g: Graph) -> bool:
        changed = False
        for op in [n for n in g.nodes if n.op == "BinaryOp" and n.param.get("opType") in ("ADD", "SUB", "MUL")]:
            nxt = sole_user(g, op)
            if nxt is None or nxt.op != "ReLU" or float(nxt.param.get("slope", 0.0)) != 0.0 or \
                    int(op.param.get("activationType", 0)) or g.info(op.outputs[0]).dtype != "float32":
                continue
            op.param["activationType"] = 1
            _bypass(g, op, nxt)
            changed = True
        return changed
