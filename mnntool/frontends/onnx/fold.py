"""Constant folding and shape inference on the ONNX graph itself, before any converter runs.

Exporters compute Reshape shapes, Slice ends and Resize scales with Shape/Gather/Concat/Cast
arithmetic; once the input shapes are fixed these are constants, and folding them first (as
onnx-simplifier does) lets every converter see a constant wherever one exists. Nodes are evaluated by
onnx's own reference implementation, never by code from the model. What cannot be folded stays a
run-time operand.
"""
from __future__ import annotations

import warnings

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

from .expand import inline_graph, opset_of

# Larger results stay computed at run time: a 10^5 x 10^5 ConstantOfShape must not be materialised
# at convert time (37 GB), and big folded tensors only make the file larger.
MAX_FOLD_ELEMENTS = 1 << 24
NEVER = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Bernoulli", "Multinomial",
         "If", "Loop", "Scan", "SequenceConstruct", "SequenceEmpty", "Optional", "ImageDecoder",
         "StringNormalizer", "RegexFullMatch", "StringConcat", "StringSplit", "Dropout"}


def _static(shape) -> bool:
    return shape is not None and all(isinstance(d, int) and d >= 0 for d in shape)


def shapes_of(model, dtypes: dict | None = None) -> dict:
    """Tensor name -> shape tuple (ints, or the dim_param name / None where unknown); fills `dtypes`
    (name -> numpy type name) when given."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            inferred = shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001 - a model onnx cannot infer still converts where its shapes are given
        inferred = model
    out = {}
    infos = []
    graphs = [inferred.graph]
    while graphs:       # bodies of If/Loop too: their names are unique in the model, as ONNX requires
        gr = graphs.pop()
        infos += list(gr.value_info) + list(gr.input) + list(gr.output)
        for n in gr.node:
            for a in n.attribute:
                graphs += [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
    for vi in infos:
        tt = vi.type.tensor_type
        if vi.type.WhichOneof("value") != "tensor_type":
            continue
        if tt.HasField("shape"):
            out[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                                 for d in tt.shape.dim)
        if dtypes is not None and tt.elem_type:
            try:
                dtypes[vi.name] = helper.tensor_dtype_to_np_dtype(tt.elem_type).name
            except (KeyError, TypeError, ValueError):
                pass
    for init in model.graph.initializer:
        if dtypes is not None:
            try:
                dtypes.setdefault(init.name, helper.tensor_dtype_to_np_dtype(init.data_type).name)
            except (KeyError, TypeError, ValueError):
                pass
    return out


def _size_bound(node, vals: dict, shapes: dict) -> int | None:
    """An upper bound of the elements the node would produce, None when unknown."""
    op = node.op_type
    ins = [vals.get(i) for i in node.input]
    if op == "ConstantOfShape":
        return int(np.prod(ins[0].astype(np.float64))) if ins[0].size else 1
    if op == "Expand":
        shape = np.broadcast_shapes(ins[0].shape, tuple(int(d) for d in ins[1].reshape(-1)))
        return int(np.prod(shape, dtype=np.float64))
    if op == "Tile":
        return int(ins[0].size * np.prod(ins[1].astype(np.float64)))
    if op == "Range":
        start, limit, delta = (float(np.asarray(v).reshape(-1)[0]) for v in ins[:3])
        return int(max(np.ceil((limit - start) / delta), 0)) if delta else None
    sizes = [int(np.prod(shapes[o], dtype=np.float64)) for o in node.output if o and _static(shapes.get(o))]
    if len(sizes) == len([o for o in node.output if o]):
        return sum(sizes)
    return max((v.size for v in ins if v is not None), default=0) * 4


def _evaluate(node, vals, opset):
    from onnx.reference import ReferenceEvaluator
    feeds = {i: vals[i] for i in node.input if i}
    ev = ReferenceEvaluator(node, opsets={"": opset})
    return ev.run(None, feeds)


class _Initializers(dict):
    """Initializer values read when a fold needs them: most weights are never folded, and reading them
    all here would hold the model twice."""

    def __init__(self, tensors, weights):
        super().__init__()
        self.tensors, self.weights = tensors, weights

    def __contains__(self, name):
        return dict.__contains__(self, name) or name in self.tensors

    def __getitem__(self, name):
        if not dict.__contains__(self, name):
            t = self.tensors[name]
            self[name] = self.weights.array(t) if self.weights is not None else numpy_helper.to_array(t)
        return dict.__getitem__(self, name)

    def get(self, name, default=None):
        return self[name] if name in self else default


def fold(model: onnx.ModelProto, weights=None, rounds: int = 8) -> onnx.ModelProto:
    """The model with every constant-computable node replaced by an initializer (in place). `weights`
    reads initializers whose data stayed in the file (weights.Weights)."""
    g = model.graph
    opset = opset_of(model)
    graph_inputs = {i.name for i in g.input}
    # an initializer that is also a graph input may be fed at run time: not a constant (ONNX IR rule)
    vals = _Initializers({i.name: i for i in g.initializer if i.name not in graph_inputs}, weights)
    outputs = {o.name for o in g.output}
    changed_any = False
    for _ in range(rounds):
        shapes = shapes_of(model)
        keep, new_inits, changed = [], [], False
        for node in g.node:
            if node.op_type == "Scan" and node.domain in ("", "ai.onnx"):
                from .unroll import unroll_scan
                unrolled = unroll_scan(node, shapes, opset)
                if unrolled is not None:
                    keep.extend(unrolled[0])
                    new_inits.extend(unrolled[1])
                    changed = True
                    continue
            if node.op_type == "If" and node.domain in ("", "ai.onnx") and node.input[0] in vals:
                keep.extend(_inline_if(node, bool(np.asarray(vals[node.input[0]]).reshape(-1)[0]), new_inits))
                changed = True
                continue
            if node.domain not in ("", "ai.onnx") or node.op_type in NEVER or any(
                    a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
                keep.append(node)
                continue
            result = None
            if node.op_type == "Constant":
                try:
                    result = _evaluate(node, vals, opset)
                except Exception:  # noqa: BLE001 - an attribute onnx's reference cannot read: the converter says so
                    result = None
            elif node.op_type in ("Shape", "Size") and _static(shapes.get(node.input[0])):
                shape = np.array(shapes[node.input[0]], np.int64)
                if node.op_type == "Size":
                    result = [np.array(shape.prod(), np.int64)]
                else:
                    a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
                    start, end = a.get("start", 0), a.get("end", None)
                    result = [shape[slice(start, end)]]
            elif node.input and all(i in vals for i in node.input if i):
                bound = _size_bound(node, vals, shapes)
                if bound is not None and bound <= MAX_FOLD_ELEMENTS:
                    try:
                        with warnings.catch_warnings(), np.errstate(all="ignore"):
                            warnings.simplefilter("ignore")
                            result = _evaluate(node, vals, opset)
                    except Exception:  # noqa: BLE001 - left for the converter, which names the problem
                        result = None
            if result is None or any(r is None or not isinstance(r, np.ndarray) or r.dtype == object
                                     or r.size > MAX_FOLD_ELEMENTS for r in result):
                keep.append(node)
                continue
            for name, value in zip(node.output, result):
                if not name:
                    continue
                vals[name] = value
                new_inits.append(numpy_helper.from_array(np.asarray(value), name))
            changed = True
        if not changed:
            break
        changed_any = True
        del g.node[:]
        g.node.extend(keep)
        g.initializer.extend(new_inits)
    if changed_any:
        used = {i for n in g.node for i in n.input} | outputs | _subgraph_inputs(g)
        live = [i for i in g.initializer if i.name in used or i.name in graph_inputs]
        del g.initializer[:]
        g.initializer.extend(live)
    return model


def _inline_if(node, cond: bool, new_inits: list) -> list:
    """The branch an If with a known condition takes, as nodes of the enclosing graph: its own tensors
    renamed apart, its outputs copied to the If's outputs."""
    branch = next(helper.get_attribute_value(a) for a in node.attribute
                  if a.name == ("then_branch" if cond else "else_branch"))
    prefix = f"{node.name or 'if'}__{'then' if cond else 'else'}__"
    nodes, inits, rename = inline_graph(branch, prefix)
    new_inits.extend(inits)
    for src, dst in zip(branch.output, node.output):
        if dst:
            nodes.append(helper.make_node("Identity", [rename.get(src.name, src.name)], [dst], name=f"{prefix}out_{dst}"))
    return nodes


def _subgraph_inputs(g) -> set:
    """Names that nodes inside If/Loop/Scan bodies read from the enclosing graph."""
    names = set()
    for n in g.node:
        for a in n.attribute:
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                for m in sub.node:
                    names.update(m.input)
                names |= _subgraph_inputs(sub)
    return names
