"""A graph evaluated op by op on the definitions themselves: its values (`run_graph`, what constant
folding and the bodies of control-flow ops use where no runtime is at hand) and what shape inference
knows of each tensor (`infer_values`). It sits inside the registry's package, below the control-flow
definitions that evaluate their bodies with it, so nothing here imports back up."""
from __future__ import annotations

import numpy as np

from . import REGISTRY, Val, grows

SMALL_VALUE = 64    # elements: values this small are carried along (shape arithmetic), larger ones are not


def run_graph(g, feeds: list) -> list[np.ndarray]:
    """The graph's outputs, in order, from its inputs' values, in order."""
    env: dict = dict(g.constants)
    env.update(zip(g.inputs, feeds))
    for node in g.nodes:
        opdef = REGISTRY.get(node.op)
        if opdef is None:
            raise ValueError(f"{node.op} '{node.name}': no definition to run it by")
        outs = opdef.evaluate(node, [env[i] if i else None for i in node.inputs])
        env.update(zip(node.outputs, outs))
    return [env[o] for o in g.outputs]


def _numel(shape) -> float:
    n = 1.0
    for d in shape:
        n *= d if isinstance(d, int) and d >= 0 else np.inf
    return n


def infer_node(node, ins: list[Val]) -> list[Val]:
    """The node's output Vals; unknown (shape None) where its definition cannot tell. Small outputs of
    small known inputs get their values too (shape arithmetic); an op that may grow its output is
    evaluated only when its output shape is known."""
    outs = [Val(None)] * len(node.outputs)
    opdef = REGISTRY.get(node.op)
    if opdef is None:
        return outs
    if all(v.shape is not None for v in ins):
        try:
            inferred = list(opdef.infer(node, ins))
            outs = inferred + outs[len(inferred):]
        except (ValueError, KeyError, IndexError, TypeError, ZeroDivisionError, AttributeError):
            outs = [Val(None)] * len(node.outputs)
    # the inputs' test first: it fails at once for the many nodes fed by activations (planning at every
    # new input shape runs this for each node)
    if (node.op != "Input" and outs and ins and all(v.value is not None and np.size(v.value) <= SMALL_VALUE for v in ins)
            and all(v.value is None for v in outs)
            and all(_numel(v.shape) <= SMALL_VALUE if v.shape is not None else not grows(node.op) for v in outs)):
        try:
            with np.errstate(all="ignore"):
                values = opdef.evaluate(node, [np.asarray(v.value) for v in ins])
        except (ValueError, IndexError, TypeError, KeyError, ZeroDivisionError, AttributeError):
            values = None
        if values is not None and len(values) == len(node.outputs) and all(v.size <= SMALL_VALUE for v in values):
            outs = [Val(tuple(v.shape), str(v.dtype), v) for v in values]
    return outs


def infer_values(g, inputs: list[Val] | None = None) -> dict[str, Val]:
    """Every tensor's Val from the inputs' (the graph's declared ones when not given); the graph is not
    touched (a loop body is inferred once per distinct operand shape)."""
    vals: dict[str, Val] = {}
    for k, name in enumerate(g.inputs):
        if inputs is not None and k < len(inputs):
            vals[name] = inputs[k]
        else:
            t = g.tensors.get(name)
            vals[name] = Val(t.shape, t.dtype) if t is not None else Val(None)
    for name, value in g.constants.items():
        vals[name] = Val(tuple(value.shape), str(value.dtype), value)
    for node in g.nodes:
        ins = [vals.get(i, Val(None)) for i in node.inputs]
        for name, v in zip(node.outputs, infer_node(node, ins)):
            vals[name] = v
    return vals
