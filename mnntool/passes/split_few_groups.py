"""A convolution of 2 to 4 groups (ResNeSt's split attention: radix 2) becomes what MNN's converter
writes: a channel Slice, one ordinary convolution per group, and a channel Concat, all in NC4HW4 (the
layout pass keeps channel slices and concats packed). MNN 3.6.1 runs the grouped form slower than the
split one (ResNeSt-14d, EPYC, 1 thread: our file 1.047x MNN's converter's with its 4 group-2 convolutions,
a first cause measured by rewriting them). Groups of one input channel are depthwise or
split_grouped_conv's; many small groups (RegNet) stay grouped (MNN's file splits them too, no faster)."""
from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Node
from .util import expand_each

MAX_GROUPS = 4


def _groups(g: Graph, node: Node) -> int:
    if node.op != "Convolution" or len(node.inputs) != 1 or node.param.get("quanParameter") is not None:
        return 0
    c = node.param.get("common") or {}
    groups, cin, cout = int(c.get("group", 1)), int(c.get("inputCount", 0)), int(c.get("outputCount", 0))
    if not 1 < groups <= MAX_GROUPS or cin % groups or cout % groups or cin == groups or c.get("hasOutputShape"):
        return 0
    w = node.param.get("weight")
    shapes = [g.tensors.get(t) for t in (node.inputs[0], node.outputs[0])]
    if w is None or np.asarray(w).size != cout * (cin // groups) * int(c["kernelX"]) * int(c["kernelY"]) or \
            any(s is None or s.shape is None or len(s.shape) != 4 or not all(isinstance(d, int) for d in s.shape)
                for s in shapes):
        return 0
    return groups


def _split(g: Graph, node: Node, groups: int) -> list[Node]:
    c = node.param["common"]
    cin, cout = int(c["inputCount"]), int(c["outputCount"])
    n, _, h, w = g.tensors[node.inputs[0]].shape
    on, _, oh, ow = g.tensors[node.outputs[0]].shape
    weight = np.asarray(node.param["weight"], np.float32).reshape(cout, -1)
    bias = np.asarray(node.param.get("bias", np.zeros(cout)), np.float32).reshape(-1)
    gi, go = cin // groups, cout // groups
    pieces = [g.fresh_name(f"{node.inputs[0]}_g{j}") for j in range(groups)]
    for p in pieces:
        g.info(p).shape = (n, gi, h, w)
    nodes = [Node("Slice", [node.inputs[0]], pieces, g.fresh_name(f"{node.name}_slice"),
                  {"axis": 1, "slicePoints": [gi * j for j in range(1, groups)], "sourceType": "CAFFE"})]
    parts = []
    for j, p in enumerate(pieces):
        out = g.fresh_name(f"{node.outputs[0]}_g{j}")
        param = dict(node.param, common=dict(c, group=1, inputCount=gi, outputCount=go),
                     weight=np.ascontiguousarray(weight[j * go:(j + 1) * go]).reshape(-1),
                     bias=np.ascontiguousarray(bias[j * go:(j + 1) * go]))
        nodes.append(Node("Convolution", [p], [out], g.fresh_name(f"{node.name}_g{j}"), param))
        g.info(out).shape = (on, go, oh, ow)
        parts.append(out)
    nodes.append(Node("Concat", parts, list(node.outputs), g.fresh_name(f"{node.name}_cat"), {"axis": 1}))
    return nodes


class SplitFewGroupsPass:
    name = "split_few_groups"

    def __call__(self, g: Graph) -> bool:
        return expand_each(g, _groups, _split)
