"""Express MatMul/Gemm with a constant weight as MNN's converter does: a 1x1 Convolution between two
Reshapes, the bias Add folded into the convolution (MNN runs 1x1 convolutions on its fastest path)."""
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


class MatMulToConvPass:
    name = "matmul_to_conv"

    def __call__(self, g: Graph) -> bool:
        changed = False
        for mm in [n for n in g.nodes if n.op == "MatMul"]:
            w = g.constants.get(mm.inputs[1])
            a = g.tensors.get(mm.inputs[0])
            if w is None or w.ndim != 2 or w.dtype.kind != "f" or mm.param.get("transposeA") or a is None or \
                    a.shape is None or len(a.shape) < 2 or not all(isinstance(d, int) for d in a.shape):
                continue
            if sum(n.inputs.count(mm.inputs[1]) for n in g.nodes) > 1:
                continue     # a shared weight (e.g. an unrolled RNN's recurrence) stays one constant
            weight = w.T if mm.param.get("transposeB") else w      # (K, N)
            k, n_out = weight.shape
            if a.shape[-1] != k:
                continue
            bias = np.zeros(n_out, np.float32)
            last, relu = mm, False
            add = sole_user(g, mm)
            b = _bias_of(g, add, mm.outputs[0], n_out) if add is not None else None
            if b is not None:
                bias = b
                last, relu = add, int(add.param.get("activationType", 0)) == 1   # a ReLU fused into the add
            out = last.outputs[0]
            rows = int(np.prod(a.shape[:-1]))
            flat = g.fresh_name(f"{mm.inputs[0]}__as_nchw")
            conv_out = g.fresh_name(f"{out}__conv")
            common = {"kernelX": 1, "kernelY": 1, "strideX": 1, "strideY": 1, "dilateX": 1, "dilateY": 1,
                      "padMode": "CAFFE", "group": 1, "outputCount": int(n_out), "inputCount": int(k),
                      "relu": relu, "relu6": False}
            new = [
                Node("Reshape", [mm.inputs[0], g.add_const(f"{flat}_shape", np.array([rows, k, 1, 1], np.int32))],
                     [flat], flat, {"dimType": "NCHW"}),
                Node("Convolution", [flat], [conv_out], mm.name,
                     {"common": common, "weight": np.ascontiguousarray(weight.T, np.float32).reshape(-1),
                      "bias": bias}),
                Node("Reshape", [conv_out, g.add_const(f"{out}_shape", np.array(list(a.shape[:-1]) + [n_out],
                                                                                   np.int32))],
                     [out], out, {"dimType": "NCHW"}),
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
