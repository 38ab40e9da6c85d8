"""Express MatMul/Gemm with a constant weight as MNN's converter does: a 1x1 Convolution between two
Reshapes, the bias Add folded into the convolution (MNN runs 1x1 convolutions on its fastest path)."""
from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Node
from .util import sole_user


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
            if add is not None and add.op == "BinaryOp" and add.param.get("opType") == "ADD" and \
                    add.inputs[0] == mm.outputs[0] and add.inputs[1] in g.constants and \
                    g.constants[add.inputs[1]].size == n_out and g.constants[add.inputs[1]].dtype.kind == "f":
                bias = g.constants[add.inputs[1]].reshape(-1).astype(np.float32)
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
                     {"common": common, "weight": np.ascontiguousarray(weight.T).astype(np.float32).reshape(-1),
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
            changed = True
        return changed
