"""Control flow: ops whose bodies are subgraphs (`Node.graphs`), with MNN's meaning.

If: inputs [cond, captured...]; `aliases_inputs[i]` names the branch inputs that op input i feeds,
`aliases_outputs[k]` = [then output, else output] for op output k.
While in ONNX Loop form (no cond_graph): inputs [max trip count, cond, carried...]; the body takes
[iteration, cond, carried...] and gives [cond, carried..., scan outputs...]; the op's outputs are the
final carried values, then each scan output stacked on a new first axis. Values the body reads from
outside ride along as carried values the body passes through unchanged.

The binding lives here once; `run` (a graph and its input values -> its output values) is the
reference interpreter for constant folding and the runtime's sessions for execution.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from . import Val, define
from .evaluate import infer_values, run_graph

Runner = Callable[[object, list], list]


def _truthy(x) -> bool:
    return bool(np.asarray(x).reshape(-1)[0]) if np.size(x) else False


def branch_inputs(node, sub, xs: list) -> list:
    """The branch's input values, in its input order, from the op's."""
    feeds: list = [None] * len(sub.inputs)
    pos = {name: k for k, name in enumerate(sub.inputs)}
    for i, entry in enumerate(node.param.get("aliases_inputs") or []):
        for name in (entry or {}).get("data") or []:
            if name in pos and i < len(xs):
                feeds[pos[name]] = xs[i]
    missing = [sub.inputs[k] for k, v in enumerate(feeds) if v is None]
    if missing:
        raise ValueError(f"If '{node.name}': branch input '{missing[0]}' is fed by no operand")
    return feeds


def if_binding(then_g, then_in: list[str], else_g, else_in: list[str]) -> tuple[list[str], dict]:
    """For two bodies and the outer tensors each reads (bound by name: each body's input is named like
    the outer tensor): the op's operands after the condition, and its IfParam."""
    captured = then_in + [c for c in else_in if c not in then_in]
    return captured, {"then_graph": then_g.name, "else_graph": else_g.name,
                      "aliases_inputs": [{}] + [{"data": [c]} for c in captured],
                      "aliases_outputs": [{"data": [t, e]} for t, e in zip(then_g.outputs, else_g.outputs)]}


def _branch_outputs(node, sub, side: int, outs: list) -> list:
    """The op's outputs from one branch's (`side` 0: then, 1: else), by aliases_outputs."""
    pos = {name: k for k, name in enumerate(sub.outputs)}
    return [outs[pos[(pair or {}).get("data", [])[side]]] for pair in node.param.get("aliases_outputs") or []]


def run_if(node, xs: list, run: Runner) -> list:
    side = 0 if _truthy(xs[0]) else 1
    sub = node.graphs["then_graph" if side == 0 else "else_graph"]
    return _branch_outputs(node, sub, side, run(sub, branch_inputs(node, sub, xs)))


def check_loop(node) -> None:
    if node.param.get("cond_graph"):
        raise ValueError(f"While '{node.name}': the form with a condition graph (TensorFlow's) is not supported")


def run_while(node, xs: list, run: Runner) -> list:
    check_loop(node)
    body = node.graphs["body_graph"]
    limit, cond = int(np.asarray(xs[0]).reshape(-1)[0]), _truthy(xs[1])
    n = len(xs) - 2
    k = len(node.outputs) - n
    carried, spans, step = list(xs[2:]), [[] for _ in range(k)], 0
    while step < limit and cond:
        outs = run(body, [np.array(step, np.int32), xs[1]] + carried)
        carried = list(outs[1:1 + n])
        for j in range(k):
            spans[j].append(outs[1 + n + j])
        cond = _truthy(outs[0])
        step += 1
    return carried + [np.stack(s) if s else np.zeros((0,), np.float32) for s in spans]


def _infer_body(sub, ins: list[Val]):
    vals = infer_values(sub, ins)
    return [vals.get(o, Val(None)) for o in sub.outputs]


@define("If", param="IfParam", inputs=("cond", "captured*"), kind="control")
class If:
    def infer(node, ins):
        sides = [0] if ins[0].value is not None and _truthy(ins[0].value) else \
            [1] if ins[0].value is not None else [0, 1]
        results = []
        for side in sides:
            sub = node.graphs["then_graph" if side == 0 else "else_graph"]
            results.append(_branch_outputs(node, sub, side, _infer_body(sub, branch_inputs(node, sub, ins))))
        if len(results) == 1:
            return results[0]
        return [Val(a.shape if a.shape == b.shape else None, a.dtype) for a, b in zip(*results)]

    def compute(node, xs):
        return run_if(node, xs, run_graph)


@define("While", param="WhileParam", inputs=("max_trip_count", "cond", "carried*"), kind="control")
class While:
    def infer(node, ins):
        check_loop(node)
        n = len(ins) - 2
        outs = _infer_body(node.graphs["body_graph"], [Val((), "int32"), ins[1]] + [Val(v.shape, v.dtype) for v in ins[2:]])
        carried = [Val(o.shape if o.shape == i.shape else None, i.dtype) for i, o in zip(ins[2:], outs[1:1 + n])]
        scans = [Val(None, o.dtype) for o in outs[1 + n:]]
        return carried + scans[:len(node.outputs) - n]

    def compute(node, xs):
        return run_while(node, xs, run_graph)
