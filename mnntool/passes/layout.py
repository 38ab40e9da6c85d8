"""Mark which tensors live in NC4HW4 and insert the ConvertTensor ops MNN expects around them.

Convolutions, pooling, Scale and Interp read and write NC4HW4 in MNN; activations between them stay
in NC4HW4; everything else reads NCHW. One conversion per tensor and target layout is shared.
"""
from __future__ import annotations

from ..ir.graph import Graph, Node
from ..ir.ops.index import RUN_TIME_ROWS

NC4HW4_OPS = {"Convolution", "ConvolutionDepthwise", "Deconvolution", "DeconvolutionDepthwise", "Pooling",
              "Scale", "Interp", "PReLU", "GridSample", "ROIPooling", "DetectionOutput"}
# MNN reads ROIPooling's regions (R, 5, 1, 1) and all of DetectionOutput's inputs in NC4HW4 as well
ALL_NC4HW4_INPUTS = {"ROIPooling", "DetectionOutput"}
AGNOSTIC_OPS = {"ReLU", "ReLU6", "Sigmoid", "TanH", "UnaryOp"}


class LayoutPass:
    name = "layout"

    def __call__(self, g: Graph) -> bool:
        if any(n.op == "ConvertTensor" for n in g.nodes):
            return False
        layout = {name: "NCHW" for name in list(g.inputs) + list(g.constants)}
        converted: dict[tuple[str, str], str] = {}
        nodes: list[Node] = []

        def want(name: str, fmt: str) -> str:
            if layout.get(name, "NCHW") == fmt:
                return name
            key = (name, fmt)
            if key not in converted:
                out = g.fresh_name(f"{name}__{fmt.lower()}")
                g.info(out).layout = fmt
                nodes.append(Node("ConvertTensor", [name], [out], out,
                                  {"source": layout.get(name, "NCHW"), "dest": fmt}))
                layout[out] = fmt
                converted[key] = out
            return converted[key]

        for n in g.nodes:
            if n.op in NC4HW4_OPS:
                rest = [want(i, "NC4HW4") for i in n.inputs[1:]] if n.op in ALL_NC4HW4_INPUTS else n.inputs[1:]
                n.inputs = [want(n.inputs[0], "NC4HW4")] + rest
                fmt = "NC4HW4"
            elif n.op in AGNOSTIC_OPS and layout.get(n.inputs[0]) == "NC4HW4":
                fmt = "NC4HW4"
            elif (n.op == "BinaryOp" and len(n.inputs) == 2 and all(layout.get(i) == "NC4HW4" for i in n.inputs)
                  and g.info(n.inputs[0]).shape == g.info(n.inputs[1]).shape
                  and g.info(n.inputs[0]).shape is not None):
                fmt = "NC4HW4"
            else:
                n.inputs = [want(i, "NCHW") if i else i for i in n.inputs]
                fmt = "NCHW"
            nodes.append(n)
            for o in n.outputs:
                layout[o] = fmt
                g.info(o).layout = fmt
        # graph outputs must be NCHW and keep their names, except those whose row count MNN sets as the op
        # runs: a conversion after them was sized before, and would read stale rows
        sized_at_run_time = {o for n in nodes if n.op in RUN_TIME_ROWS for o in n.outputs}
        for k, out in enumerate(g.outputs):
            if layout.get(out) == "NC4HW4" and out not in sized_at_run_time:
                producer = next(n for n in nodes if out in n.outputs)
                inner = g.fresh_name(f"{out}__nc4hw4")
                producer.outputs[producer.outputs.index(out)] = inner
                for n in nodes:
                    n.inputs = [inner if i == out else i for i in n.inputs]
                g.info(inner).layout = "NC4HW4"
                g.info(inner).shape = g.info(out).shape
                nodes.append(Node("ConvertTensor", [inner], [out], out, {"source": "NC4HW4", "dest": "NCHW"}))
                g.info(out).layout = "NCHW"
        g.nodes = nodes
        return True
