"""Fuse the GELU (erf and tanh forms) and LayerNorm patterns that exporters unroll back into single ops."""
from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Node
from .util import sole_user


def _binary(n: Node | None, op: str) -> bool:
    return n is not None and n.op == "BinaryOp" and n.param.get("opType") == op


def _other(n: Node, name: str) -> str | None:
    """The input of a two-input node that is not `name`."""
    if n.inputs.count(name) != 1:
        return None
    return n.inputs[1] if n.inputs[0] == name else n.inputs[0]


def _half_x_times_one_plus(g: Graph, producers: dict, x: str, f: Node) -> tuple[list, Node] | None:
    """Both GELU forms' tail after f (erf or tanh): (1 + f) times x and 0.5, in either order -> (its
    nodes, the last of them), or None."""
    one = sole_user(g, f)
    if not _binary(one, "ADD") or g.scalar(_other(one, f.outputs[0]) or "") != 1.0:
        return None
    mul = sole_user(g, one)
    if not _binary(mul, "MUL"):
        return None
    partner = _other(mul, one.outputs[0])
    if partner == x:                    # ((1 + f) * x) * 0.5
        half = sole_user(g, mul)
        if not _binary(half, "MUL") or g.scalar(_other(half, mul.outputs[0]) or "") != 0.5:
            return None
        return [one, mul, half], half
    pre = producers.get(partner)        # (1 + f) * (x * 0.5)
    if not _binary(pre, "MUL") or _other(pre, x) is None or g.scalar(_other(pre, x)) != 0.5 or \
            len(g.consumers().get(pre.outputs[0], [])) != 1:
        return None
    return [one, mul, pre], mul


class FuseGeluPass:
    """x * 0.5 * (1 + erf(x / sqrt(2)))  ->  UnaryOp GELU_STANDARD."""
    name = "fuse_gelu"

    def __call__(self, g: Graph) -> bool:
        changed = False
        producers = g.producers()
        for erf in [n for n in g.nodes if n.op == "UnaryOp" and n.param.get("opType") == "ERF"]:
            scaled = producers.get(erf.inputs[0])
            if scaled is None or scaled not in g.nodes:
                continue
            k = g.scalar(scaled.inputs[1]) if len(scaled.inputs) == 2 else None
            if k is None or not ((_binary(scaled, "REALDIV") and abs(k - np.sqrt(2)) < 1e-3) or
                                 (_binary(scaled, "MUL") and abs(k - 1 / np.sqrt(2)) < 1e-3)):
                continue
            x = scaled.inputs[0]
            tail = _half_x_times_one_plus(g, producers, x, erf)
            if tail is None:
                continue
            chain, last = [scaled, erf] + tail[0], tail[1]
            if len(g.consumers().get(scaled.outputs[0], [])) != 1:
                continue
            out = last.outputs[0]
            index = g.nodes.index(last)
            g.nodes.insert(index, Node("UnaryOp", [x], [out], last.name, {"opType": "GELU_STANDARD", "T": "DT_FLOAT"}))
            for n in chain:
                g.nodes.remove(n)
            producers = g.producers()
            changed = True
        return changed


def _is_cube_of(g: Graph, n: Node | None, x: str) -> bool:
    """n computes x^3: Pow(x, 3) or (x * x) * x."""
    if _binary(n, "POW"):
        return n.inputs[0] == x and g.scalar(n.inputs[1]) == 3.0
    if not _binary(n, "MUL") or x not in n.inputs:
        return False
    sq = g.producers().get(_other(n, x) or "")
    return _binary(sq, "MUL") and sq.inputs == [x, x]


class FuseGeluTanhPass:
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))  ->  UnaryOp GELU (its tanh form, MNN's GELU): GPT-2's
    gelu_new as exporters unroll it, seven ops over the MLP's widest tensor, which then fuse into the Linear
    before them (tiny GPT-2: two 11 us elementwise programs a run)."""
    name = "fuse_gelu_tanh"

    def __call__(self, g: Graph) -> bool:
        changed = False
        for tanh in [n for n in g.nodes if n.op == "UnaryOp" and n.param.get("opType") == "TANH"]:
            producers = g.producers()
            scale = producers.get(tanh.inputs[0])
            if not _binary(scale, "MUL") or len(g.consumers().get(scale.outputs[0], [])) != 1:
                continue
            inner = next((i for i in scale.inputs if g.scalar(i) is None), None)
            k = g.scalar(_other(scale, inner) or "") if inner else None
            if k is None or abs(k - np.sqrt(2 / np.pi)) > 1e-4:
                continue
            add = producers.get(inner)
            if not _binary(add, "ADD") or len(g.consumers().get(add.outputs[0], [])) != 1:
                continue
            match = None
            for x in add.inputs:
                cubic = producers.get(_other(add, x) or "")
                if not _binary(cubic, "MUL") or len(g.consumers().get(cubic.outputs[0], [])) != 1:
                    continue
                cube = next((i for i in cubic.inputs if g.scalar(i) is None), None)
                c = g.scalar(_other(cubic, cube) or "") if cube else None
                if c is not None and abs(c - 0.044715) < 1e-6 and _is_cube_of(g, producers.get(cube), x) and \
                        len(g.consumers().get(cube, [])) == 1:
                    match = (x, cubic, producers[cube])
            if match is None:
                continue
            x, cubic, cube_node = match
            chain = [cube_node, cubic, add, scale, tanh]
            if _binary(cube_node, "MUL"):
                chain.insert(0, producers[_other(cube_node, x)])
            tail = _half_x_times_one_plus(g, producers, x, tanh)
            if tail is None:
                continue
            chain, last = chain + tail[0], tail[1]
            if any(len(g.consumers().get(n.outputs[0], [])) != 1 for n in chain if n is not last):
                continue
            index = g.nodes.index(last)
            g.nodes.insert(index, Node("UnaryOp", [x], [last.outputs[0]], last.name,
                                       {"opType": "GELU", "T": "DT_FLOAT"}))
            for n in chain:
                g.nodes.remove(n)
            changed = True
        return changed


class FuseLayerNormPass:
    """(x - mean(x)) / sqrt(mean((x - mean)^2) + eps) * gamma + beta over the last axis -> LayerNorm."""
    name = "fuse_layer_norm"

    def __call__(self, g: Graph) -> bool:
        changed = False
        producers = g.producers()
        for sub in [n for n in g.nodes if _binary(n, "SUB")]:
            if sub not in g.nodes:
                continue
            x, m = sub.inputs
            mean = producers.get(m)
            if mean is None or mean.op != "Reduction" or mean.param.get("operation") != "MEAN" or \
                    mean.inputs[0] != x or not mean.param.get("keepDims"):
                continue
            axes = [int(a) for a in (mean.param.get("dim") if mean.param.get("dim") is not None else [])]
            subs_users = g.consumers().get(sub.outputs[0], [])
            pow_ = next((n for n in subs_users if (_binary(n, "POW") and g.scalar(n.inputs[1]) == 2.0) or
                         (_binary(n, "MUL") and n.inputs[0] == n.inputs[1])), None)
            div = next((n for n in subs_users if _binary(n, "REALDIV") and n.inputs[0] == sub.outputs[0]), None)
            if pow_ is None or div is None or len(subs_users) != 2:
                continue
            var = sole_user(g, pow_)
            if var is None or var.op != "Reduction" or var.param.get("operation") != "MEAN" or \
                    [int(a) for a in var.param.get("dim", [])] != axes:
                continue
            add = sole_user(g, var)
            eps = g.scalar(_other(add, var.outputs[0]) or "") if _binary(add, "ADD") else None
            sqrt = sole_user(g, add) if eps is not None else None
            if sqrt is None or sqrt.op != "UnaryOp" or sqrt.param.get("opType") != "SQRT" or \
                    div.inputs[1] != sqrt.outputs[0]:
                continue
            chain = [mean, sub, pow_, var, add, sqrt, div]
            if any(len(g.consumers().get(o, [])) != (2 if o == sub.outputs[0] else 1)
                   for c in chain[:-1] for o in c.outputs) or mean.outputs[0] in g.outputs:
                continue
            tail, gamma, beta = div, None, None
            mul = sole_user(g, div)
            if _binary(mul, "MUL") and _other(mul, div.outputs[0]) in g.constants:
                gamma = g.constants[_other(mul, div.outputs[0])].reshape(-1)
                chain.append(mul)
                tail = mul
                bias = sole_user(g, mul)
                if _binary(bias, "ADD") and _other(bias, mul.outputs[0]) in g.constants:
                    beta = g.constants[_other(bias, mul.outputs[0])].reshape(-1)
                    chain.append(bias)
                    tail = bias
            param = {"axis": axes, "epsilon": eps, "group": 1, "useRMSNorm": False}
            if gamma is not None:
                param["gamma"] = gamma.astype(np.float32)
                param["beta"] = (beta if beta is not None else np.zeros_like(gamma)).astype(np.float32)
            g.nodes.insert(g.nodes.index(tail), Node("LayerNorm", [x], [tail.outputs[0]], tail.name, param))
            for n in chain:
                g.nodes.remove(n)
            producers = g.producers()
            changed = True
        return changed
