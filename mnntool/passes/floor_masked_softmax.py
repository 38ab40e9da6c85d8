"""Floor a masked softmax's probabilities at 2^-60, so no denormal number reaches the matmul after it.

An attention mask added as a large negative constant (Swin's shifted windows: -100; causal and padding
masks: -1e4, the float minimum or -inf) leaves the masked probabilities at exp(-100)-sized values; MNN's
exp clamps its input near -88, so every masked probability comes out denormal (swin_tiny: 256k of them per
run). x86 cores without flush-to-zero take a microcode assist for each vector operation that reads or
writes one: on a 16-core Intel Xeon MNN's attn @ v (its While loops) took 92 ms of swin_tiny's 297 ms
against 5 ms on an AMD EPYC, and with the thread's FTZ/DAZ bits set the whole run took 201 ms. A ReLU6
clamp to [2^-60, FLT_MAX] after such a softmax (one elementwise pass: 0.12 ms for swin_tiny's five masked
blocks in MNN on the EPYC) lifts them to normal numbers whose products with any value above 2^-66 stay
normal.

Meaning: each output of attn @ v moves by at most n * 2^-60 * max|v| (n keys): for n up to 10^5 that is
below 2^-43 * max|v|, under a millionth of fp32's rounding step at max|v|. Only a softmax whose input adds
a finite constant with a value at or below -80 and whose one reader is the matmul by v is floored: there
MNN writes the denormals; elsewhere (no mask, a run-time
mask, a -inf mask whose fully masked rows are NaN, probabilities read by anything else, such as a NaN
guard) the probabilities are left exactly as computed. mnntool's runtime fuses Softmax -> floor -> MatMul
into its FusedAttention step as it fuses Softmax -> MatMul (runtime/plan/fuse_attention.py).
"""
from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Node
from ..ir.ops import keeps_values

FLOOR = 2.0 ** -60
MASK_AT_MOST = -80.0


def _masked(g: Graph, t: str, producers: dict, depth: int = 8) -> bool:
    """Whether `t` is (through views and additions) a sum with a constant holding a value <= -80."""
    n = producers.get(t)
    while n is not None and keeps_values(n.op) and depth > 0:     # views and permutes
        n, depth = producers.get(n.inputs[0]), depth - 1
    if n is None or depth <= 0 or n.op != "BinaryOp" or n.param.get("opType") != "ADD":
        return False
    for i in n.inputs:
        c = g.constants.get(i)
        if c is not None:
            c = np.asarray(c)
            if c.dtype.kind == "f" and c.size and np.isfinite(c).all() and float(c.min()) <= MASK_AT_MOST:
                return True
    return any(_masked(g, i, producers, depth - 1) for i in n.inputs if i not in g.constants)


def is_floor(n: Node) -> bool:
    """The ReLU6 this pass writes."""
    return n.op == "ReLU6" and float(n.param.get("minValue", 0.0)) == FLOOR


class FloorMaskedSoftmaxPass:
    """Softmax(x + finite mask constant <= -80) read by MatMul(p, v)  ->  ReLU6[2^-60, FLT_MAX] between them;
    the probabilities' tensor name moves to the floor's output."""
    name = "floor_masked_softmax"

    def __call__(self, g: Graph) -> bool:
        producers, readers = g.producers(), g.consumers()
        changed = False
        for sm in [n for n in g.nodes if n.op == "Softmax"]:
            y = sm.outputs[0]
            users = readers.get(y, [])
            if g.info(y).dtype not in (None, "float32") or y in g.outputs or len(users) != 1 or \
                    users[0].op != "MatMul" or users[0].inputs[0] != y or not _masked(g, sm.inputs[0], producers):
                continue
            raw = g.fresh_name(f"{y}__probabilities")
            info, src = g.info(raw), g.info(y)
            info.shape, info.dtype, info.layout = src.shape, src.dtype, src.layout
            sm.outputs = [raw]
            floor = Node("ReLU6", [raw], [y], f"{sm.name or y}__floor",
                         {"minValue": FLOOR, "maxValue": float(np.finfo(np.float32).max)})
            g.nodes.insert(g.nodes.index(sm) + 1, floor)
            changed = True
        return changed
