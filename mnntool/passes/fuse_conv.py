"""Fold a following Scale (BatchNorm) into a convolution's weights, and a following ReLU/ReLU6 into its flags."""
from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Node

CONVS = {"Convolution", "ConvolutionDepthwise"}


def _sole_consumer(g: Graph, node: Node) -> Node | None:
    out = node.outputs[0]
    if out in g.outputs:
        return None
    users = [n for n in g.nodes if out in n.inputs]
    return users[0] if len(users) == 1 else None


def _bypass(g: Graph, conv: Node, follower: Node) -> None:
    """The conv takes over the follower's output tensor; the follower disappears."""
    conv.outputs = list(follower.outputs)
    g.nodes.remove(follower)


class FoldScaleIntoConvPass:
    name = "fold_scale_into_conv"

    def __call__(self, g: Graph) -> bool:
        changed = False
        for conv in [n for n in g.nodes if n.op in CONVS]:
            nxt = _sole_consumer(g, conv)
            if nxt is None or nxt.op != "Scale" or conv.param["common"].get("relu") or \
                    conv.param["common"].get("relu6"):
                continue
            cout = conv.param["common"]["outputCount"]
            scale = np.asarray(nxt.param["scaleData"], np.float64).reshape(-1)
            shift = np.asarray(nxt.param.get("biasData", np.zeros(cout)), np.float64).reshape(-1)
            if scale.size != cout:
                continue
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
        for conv in [n for n in g.nodes if n.op in CONVS]:
            common = conv.param["common"]
            nxt = _sole_consumer(g, conv)
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
