"""Apply an activation before the Reshape in front of it, and join a Reshape of a Reshape into one.

A Linear layer becomes a 1x1 convolution between two Reshapes (matmul_to_conv), so a transformer's MLP
reads Reshape(conv) -> GELU -> Reshape -> conv. The GELU between the Reshapes is an NCHW op in MNN's
file: the first convolution's NC4HW4 output is converted to NCHW for it and back to NC4HW4 for the next
convolution (CoaT-Lite-Tiny: 1 ms of MNN's Raster per MLP, 1.07x the time of MNN's converter's file).
An elementwise activation gives the same values on the Reshape's input, so it moves in front of the
Reshape, where it reads the convolution's NC4HW4 output in place (layout "either"); the two Reshapes then
meet, Reshape(Reshape(x)) reads x directly, and one back to x's own shape is dropped: the MLP's two
convolutions and its activation run in NC4HW4 with no conversion between them.
"""
from __future__ import annotations

from ..ir.graph import Graph
from ..ir.ops import layout_of
from .util import remove_passthrough


def _static(shape) -> bool:
    return shape is not None and all(isinstance(d, int) for d in shape)


def _hoist(g: Graph) -> bool:
    """Reshape(x) -> activation  =>  activation(x) -> Reshape, where x comes from an op that writes NC4HW4
    (or an activation of one): only there does the move save conversions."""
    producers, readers = g.producers(), g.consumers()
    for r in g.nodes:
        if r.op != "Reshape" or len(r.outputs) != 1:
            continue
        x, y = r.inputs[0], r.outputs[0]
        act = g.sole_consumer(y, readers)
        src = producers.get(x)
        if act is None or src is None or layout_of(act.op) != "either" or len(act.inputs) != 1 or \
                len(act.outputs) != 1 or act.inputs[0] != y or layout_of(src.op) not in ("NC4HW4", "NC4HW4-all", "either"):
            continue
        xi = g.tensors.get(x)
        if xi is None or not _static(xi.shape) or xi.dtype != "float32":
            continue
        z = act.outputs[0]
        moved = g.fresh_name(f"{z}__before_reshape")
        g.info(moved).shape, g.info(moved).dtype = tuple(xi.shape), xi.dtype
        act.inputs, act.outputs = [x], [moved]
        r.inputs, r.outputs = [moved] + r.inputs[1:], [z]
        i, j = g.nodes.index(r), g.nodes.index(act)
        g.nodes[i], g.nodes[j] = act, r
        return True
    return False


def _join(g: Graph) -> bool:
    """Reshape(Reshape(x), s) => Reshape(x, s) when s is a constant without 0 (0 copies the input's dim);
    one giving x's own shape is dropped."""
    producers = g.producers()
    for r2 in g.nodes:
        if r2.op != "Reshape" or len(r2.inputs) != 2:
            continue
        r1 = producers.get(r2.inputs[0])
        s = g.constants.get(r2.inputs[1])
        if r1 is None or r1.op != "Reshape" or s is None or (s == 0).any():
            continue
        x = r1.inputs[0]
        xi, wi = g.tensors.get(x), g.tensors.get(r2.outputs[0])
        if xi is None or wi is None or not _static(xi.shape) or not _static(wi.shape):
            continue
        r2.inputs = [x, r2.inputs[1]]
        if tuple(xi.shape) == tuple(wi.shape):
            remove_passthrough(g, r2)
        if not any(r1.outputs[0] in n.inputs for n in g.nodes) and r1.outputs[0] not in g.outputs:
            g.nodes.remove(r1)
        return True
    return False


class ActivationBeforeReshapePass:
    name = "activation_before_reshape"

    def __call__(self, g: Graph) -> bool:
        changed = False
        while _hoist(g) or _join(g):
            changed = True
        return changed
