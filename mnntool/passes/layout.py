"""Mark which tensors live in NC4HW4 and insert the ConvertTensor ops MNN expects around them.

The ops' definitions say which: convolutions, pooling, Scale and Interp read and write NC4HW4 in MNN
(layout "NC4HW4"), activations between them stay in NC4HW4 ("either"); everything else reads NCHW.
One conversion per tensor and target layout is shared.
"""
from __future__ import annotations

from ..ir.graph import Graph, Node
from ..ir.ops import layout_of, rows_at_run_time


def _per_channel(g: Graph, name: str, channels) -> bool:
    """A float constant that broadcasts along channels only: a scalar, (C, 1, 1) or (1, C, 1, 1)."""
    c = g.constants.get(name)
    if c is None or c.dtype.kind != "f":
        return False
    dims = [int(d) for d in c.shape]
    return c.size == 1 or (len(dims) in (3, 4) and dims[-3] == channels and c.size == channels)


def _gate(shapes, out) -> bool:
    """Two 4-D tensors of one batch and channel count, one of them 1x1 in H and W (a squeeze-excite gate
    times its feature map): MNN's converter keeps the product in NC4HW4, which saves converting the
    feature map to NCHW and back around it (TinyNet-A: 32 such pairs of ConvertTensor)."""
    a, b = shapes
    if a is None or b is None or len(a) != 4 or len(b) != 4 or not all(isinstance(d, int) for d in (*a, *b)):
        return False
    small, big = (a, b) if a[2] * a[3] == 1 else (b, a)
    return small[:2] == big[:2] and small[2] * small[3] == 1 and out is not None and tuple(out) == tuple(big)


def _stays_packed(g: Graph, n: Node, layout: dict) -> bool:
    """A BinaryOp computes in NC4HW4 when both inputs are NC4HW4 tensors of one shape, or one is and the
    other a per-channel or scalar constant (a layer scale, a normalisation's affine): as MNN's converter
    writes it, and without the two conversions around it (FastViT-T8: 68 ConvertTensor against MNN's
    file's 6, 1.8x its time in MNN). mnntool's runtime keeps NCHW memory under either tag."""
    if len(n.inputs) != 2:
        return False
    packed = [layout.get(i) == "NC4HW4" for i in n.inputs]
    shapes = [g.info(i).shape for i in n.inputs]
    if all(packed):
        return shapes[0] is not None and (shapes[0] == shapes[1] or _gate(shapes, g.info(n.outputs[0]).shape))
    if not any(packed):
        return False
    k = packed.index(True)
    shape, other = shapes[k], n.inputs[1 - k]
    return shape is not None and len(shape) == 4 and isinstance(shape[1], int) and \
        _per_channel(g, other, shape[1]) and g.info(n.outputs[0]).shape == shape


def _moves_packed(g: Graph, n: Node, layout: dict) -> bool:
    """A Concat along channels of NC4HW4 tensors, or a Slice/StridedSlice (ONNX Slice or Split, constant
    bounds) of one, stays in NC4HW4 as MNN's converter writes it: RexNet's partial residual (a channel slice,
    an add, a concat) otherwise converts the feature map to NCHW and back around each block."""
    def packed4(name):
        shape = g.info(name).shape
        return layout.get(name) == "NC4HW4" and shape is not None and len(shape) == 4

    outs4 = all(g.info(o).shape is not None and len(g.info(o).shape) == 4 for o in n.outputs)
    if n.op == "Concat":
        return bool(n.inputs) and all(packed4(i) for i in n.inputs) and outs4 and \
            int(n.param.get("axis", 0)) in (1, -3)
    if n.op == "StridedSlice":
        return int(n.param.get("fromType", 0)) == 1 and packed4(n.inputs[0]) and outs4 and \
            all(i in g.constants for i in n.inputs[1:] if i)
    if n.op == "Slice":
        return len(n.inputs) == 1 and packed4(n.inputs[0]) and outs4
    return False


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
            runs_on = layout_of(n.op)
            if runs_on in ("NC4HW4", "NC4HW4-all"):
                rest = [want(i, "NC4HW4") for i in n.inputs[1:]] if runs_on == "NC4HW4-all" else n.inputs[1:]
                n.inputs = [want(n.inputs[0], "NC4HW4")] + rest
                fmt = "NC4HW4"
            elif runs_on == "either" and layout.get(n.inputs[0]) == "NC4HW4":
                fmt = "NC4HW4"
            elif n.op == "BinaryOp" and _stays_packed(g, n, layout) or _moves_packed(g, n, layout):
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
        sized_at_run_time = {o for n in nodes if rows_at_run_time(n.op) for o in n.outputs}
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
