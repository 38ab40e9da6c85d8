"""Express MatMul/Gemm with a constant weight as MNN's converter does: a 1x1 Convolution between two
Reshapes, the bias Add folded into the convolution (MNN runs 1x1 convolutions on its fastest path, and
weight-only quantization stores convolution weights). Leading dims that are open at convert time (a
decoder's sequence length) are read at run time: the output shape is Shape(x)[:-1] ++ [N]."""
from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Node
from .util import sole_user


def _bias_of(g: Graph, add: Node, y: str, n_out: int):
    """The bias an Add puts on every row of the product y: a float constant of n_out values along the
    last axis, on either side (PyTorch exports Linear as Add(bias, MatMul)); else None."""
    if add.op != "BinaryOp" or add.param.get("opType") != "ADD" or len(add.inputs) != 2 or y not in add.inputs:
        return None
    other = add.inputs[1] if add.inputs[0] == y else add.inputs[0]
    c = g.constants.get(other)
    if c is None or c.dtype.kind != "f" or c.size != n_out or (c.ndim and c.shape[-1] != n_out):
        return None
    return c.reshape(-1).astype(np.float32)


def _out_shape(g: Graph, x: str, shape: tuple | None, n_out: int, out: str) -> tuple[list[Node], str]:
    """The product's shape: a constant when x's dims are known, else Shape(x)[:-1] ++ [N] at run time
    (any rank: a vector times the weight gives [N])."""
    if shape is not None:
        return [], g.add_const(f"{out}_shape", np.array(list(shape[:-1]) + [n_out], np.int32))
    full, lead, new = (g.fresh_name(f"{out}_{k}") for k in ("xshape", "lead", "shape"))
    const = lambda k, v: g.add_const(g.fresh_name(f"{out}_{k}"), np.array(v, np.int32))   # noqa: E731
    return [Node("Shape", [x], [full], full, {}, fmt="NCHW"),
            Node("StridedSlice", [full, const("begin", [0]), const("end", [-1]), const("axes", [0]),
                                  const("steps", [1])], [lead], lead, {"fromType": 1, "T": "DT_INT32"}),
            Node("Concat", [lead, const("n", [n_out])], [new], new, {"axis": 0})], new


class MatMulToConvPass:
    name = "matmul_to_conv"

    def __call__(self, g: Graph) -> bool:
        changed = False
        for mm in [n for n in g.nodes if n.op == "MatMul"]:
            w = g.constants.get(mm.inputs[1])
            a = g.tensors.get(mm.inputs[0])
            if w is None or w.ndim != 2 or w.dtype.kind != "f" or mm.param.get("transposeA") or a is None:
                continue
            if sum(n.inputs.count(mm.inputs[1]) for n in g.nodes) > 1:
                continue     # a shared weight (e.g. an unrolled RNN's recurrence) stays one constant
            weight = w.T if mm.param.get("transposeB") else w      # (K, N)
            k, n_out = weight.shape
            shape = a.shape if a.shape and len(a.shape) >= 2 else None     # else read at run time
            if shape is not None and isinstance(shape[-1], int) and shape[-1] != k:
                continue
            static = shape is not None and all(isinstance(d, int) for d in shape)
            bias = np.zeros(n_out, np.float32)
            last, relu = mm, False
            add = sole_user(g, mm)
            b = _bias_of(g, add, mm.outputs[0], n_out) if add is not None else None
            if b is not None:
                bias = b
                last, relu = add, int(add.param.get("activationType", 0)) == 1   # a ReLU fused into the add
            out = last.outputs[0]
            rows = int(np.prod(shape[:-1])) if static else -1
            flat = g.fresh_name(f"{mm.inputs[0]}__as_nchw")
            conv_out = g.fresh_name(f"{out}__conv")
            shape_nodes, out_shape = _out_shape(g, mm.inputs[0], shape if static else None, n_out, out)
            common = {"kernelX": 1, "kernelY": 1, "strideX": 1, "strideY": 1, "dilateX": 1, "dilateY": 1,
                      "padMode": "CAFFE", "group": 1, "outputCount": int(n_out), "inputCount": int(k),
                      "relu": relu, "relu6": False}
            new = [
                Node("Reshape", [mm.inputs[0], g.add_const(f"{flat}_shape", np.array([rows, k, 1, 1], np.int32))],
                     [flat], flat, {"dimType": "NCHW"}),
                Node("Convolution", [flat], [conv_out], mm.name,
                     {"common": common, "weight": np.ascontiguousarray(weight.T, np.float32).reshape(-1),
                      "bias": bias}),
                *shape_nodes,
                Node("Reshape", [conv_out, out_shape], [out], out, {"dimType": "NCHW"}),
            ]
            at = g.nodes.index(mm)
            g.nodes.remove(mm)
            if last is not mm:
                g.nodes.remove(last)
            g.nodes[at:at] = new
            if mm.inputs[1] not in g.outputs:
                del g.constants[mm.inputs[1]]      # now inside the convolution: not held twice until dead_code
            changed = True
        return changed
