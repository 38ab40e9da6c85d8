"""A convolution with one input channel per group and m > 1 outputs per group (FastViT's and
MobileOne's down-sampling branches: 48 -> 96 channels in 48 groups) becomes what MNN's converter
writes: m depthwise convolutions, Concat, and the channel interleave (Reshape (n, m, c, h, w) ->
Permute (0, 2, 1, 3, 4) -> Reshape (n, m c, h, w)). MNN runs a grouped convolution as one small
convolution per group: measured in MNN 3.6.1 (1 thread), 48 -> 96 channels 7x7 on a 64x64 map took
27.3 ms written as one grouped Convolution against 8.1 ms split (FastViT-T8: 2.2x MNN's own file).
mnntool's planner runs the interleave as one ChannelShuffle step. Only where the map's shape is known
(the reshapes name it)."""
from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Node
from .util import expand_each


def _multiplier(g: Graph, node: Node) -> int:
    """m when `node` is a convolution of one input channel per group and m > 1 outputs each, else 0."""
    if node.op != "Convolution" or len(node.inputs) != 1 or node.param.get("quanParameter") is not None:
        return 0
    c = node.param.get("common") or {}
    groups, cin, cout = int(c.get("group", 1)), int(c.get("inputCount", 0)), int(c.get("outputCount", 0))
    if groups <= 1 or groups != cin or cout % cin or cout == cin or c.get("hasOutputShape"):
        return 0
    w = node.param.get("weight")
    shape = g.tensors.get(node.outputs[0])
    if w is None or np.asarray(w).size != cout * int(c["kernelX"]) * int(c["kernelY"]) or shape is None or \
            shape.shape is None or len(shape.shape) != 4 or not all(isinstance(d, int) for d in shape.shape):
        return 0
    return cout // cin


def _split(g: Graph, node: Node, m: int) -> list[Node]:
    c = node.param["common"]
    cin = int(c["inputCount"])
    n, _, h, w = g.tensors[node.outputs[0]].shape
    weight = np.asarray(node.param["weight"], np.float32).reshape(cin * m, -1)
    bias = np.asarray(node.param.get("bias", np.zeros(cin * m)), np.float32).reshape(-1)
    parts, nodes = [], []
    for j in range(m):      # output channel i m + j is input channel i's j-th filter
        out = g.fresh_name(f"{node.outputs[0]}_dw{j}")
        common = dict(c, group=cin, outputCount=cin, inputCount=cin)
        param = dict(node.param, common=common, weight=np.ascontiguousarray(weight[j::m]).reshape(-1),
                     bias=np.ascontiguousarray(bias[j::m]))
        nodes.append(Node("ConvolutionDepthwise", list(node.inputs), [out], g.fresh_name(f"{node.name}_dw{j}"),
                          param))
        g.info(out).shape = (n, cin, h, w)
        parts.append(out)
    cat, split, perm = (g.fresh_name(f"{node.outputs[0]}_{k}") for k in ("cat", "split", "perm"))
    to5 = g.add_const(f"{node.outputs[0]}_split_shape", np.array([n, m, cin, h, w], np.int32))
    to4 = g.add_const(f"{node.outputs[0]}_merge_shape", np.array([n, m * cin, h, w], np.int32))
    nodes += [Node("Concat", parts, [cat], cat, {"axis": 1}),
              Node("Reshape", [cat, to5], [split], split, {"dimType": "NCHW"}),
              Node("Permute", [split], [perm], perm, {"dims": [0, 2, 1, 3, 4]}),
              Node("Reshape", [perm, to4], list(node.outputs), g.fresh_name(f"{node.name}_merge"),
                   {"dimType": "NCHW"})]
    return nodes


class SplitGroupedConvPass:
    name = "split_grouped_conv"

    def __call__(self, g: Graph) -> bool:
        return expand_each(g, _multiplier, _split)
