"""ONNX Scan with a sequence length known at convert time, unrolled into its body's nodes once per step:
MNN has no Scan op, and both runtimes run the unrolled form. Each scan input is sliced per step, the
body is inlined with its states threaded through, and the per-step outputs are stacked again."""
from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper

from .expand import inline_graph

MAX_STEPS = 256


def _ints(vals, name, inits):
    inits.append(numpy_helper.from_array(np.asarray(vals, np.int64), name))
    return name


def unroll_scan(node, shapes: dict, opset: int):
    """(nodes, initializers) replacing the Scan, or None when it cannot be unrolled (opset-8 form, unknown
    or too long a sequence)."""
    if opset < 9:
        return None
    a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
    body = a["body"]
    m = int(a["num_scan_inputs"])
    n_states = len(node.input) - m
    k_outs = len(body.output) - n_states
    in_axes = list(a.get("scan_input_axes", [0] * m))
    in_dirs = list(a.get("scan_input_directions", [0] * m))
    out_axes = list(a.get("scan_output_axes", [0] * k_outs))
    out_dirs = list(a.get("scan_output_directions", [0] * k_outs))
    scans = list(node.input[n_states:])
    lengths = set()
    for name, ax in zip(scans, in_axes):
        shape = shapes.get(name)
        if shape is None or not isinstance(shape[ax % len(shape)], int):
            return None
        lengths.add(shape[ax % len(shape)])
    if len(lengths) != 1 or not 0 < next(iter(lengths)) <= MAX_STEPS:
        return None
    steps = lengths.pop()
    base = (node.name or "scan") + "__"
    nodes, inits = [], []
    states = list(node.input[:n_states])
    collected = [[None] * steps for _ in range(k_outs)]
    for t in range(steps):
        binding = {}
        for j, (name, ax, rev) in enumerate(zip(scans, in_axes, in_dirs)):
            pos = steps - 1 - t if rev else t
            rank = len(shapes[name])
            sl, sq = f"{base}s{j}_t{t}", f"{base}x{j}_t{t}"
            nodes.append(helper.make_node("Slice", [name, _ints([pos], sl + "_b", inits), _ints([pos + 1], sl + "_e", inits),
                                                    _ints([ax % rank], sl + "_a", inits)], [sl], name=sl))
            if opset >= 13:
                nodes.append(helper.make_node("Squeeze", [sl, _ints([ax % rank], sq + "_ax", inits)], [sq], name=sq))
            else:
                nodes.append(helper.make_node("Squeeze", [sl], [sq], name=sq, axes=[ax % rank]))
            binding[body.input[n_states + j].name] = sq
        for s, name in enumerate(states):
            binding[body.input[s].name] = name
        body_nodes, body_inits, rename = inline_graph(body, f"{base}t{t}__", binding)
        nodes += body_nodes
        inits += body_inits
        states = [rename.get(o.name, o.name) for o in body.output[:n_states]]
        for k, o in enumerate(body.output[n_states:]):
            collected[k][t] = rename.get(o.name, o.name)
    for s, out in enumerate(node.output[:n_states]):
        if out:
            nodes.append(helper.make_node("Identity", [states[s]], [out], name=f"{base}state{s}"))
    for k, out in enumerate(node.output[n_states:]):
        if not out:
            continue
        parts = collected[k][::-1] if out_dirs[k] else collected[k]
        ax = int(out_axes[k])
        ups = []
        for t, p in enumerate(parts):
            u = f"{base}o{k}_u{t}"
            if opset >= 13:
                nodes.append(helper.make_node("Unsqueeze", [p, _ints([ax], u + "_ax", inits)], [u], name=u))
            else:
                nodes.append(helper.make_node("Unsqueeze", [p], [u], name=u, axes=[ax]))
            ups.append(u)
        nodes.append(helper.make_node("Concat", ups, [out], name=f"{base}out{k}", axis=ax))
    return nodes, inits
