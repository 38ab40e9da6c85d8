"""ONNX ops that no converter handles, replaced by the function body the ONNX standard defines for them.

Many newer ops (Attention, RotaryEmbedding, Swish, CenterCropPad, ...) are specified as functions of
simpler ops; onnx's schemas carry those bodies, so an op without a converter of its own is inlined
into its definition before conversion, and converts when its parts do. The body comes from onnx's
schema (never from the model), and its attributes are the node's own.
"""
from __future__ import annotations

import onnx
from onnx import defs, helper


def _body(node, opset: int, types: dict):
    try:
        schema = defs.get_schema(node.op_type, opset, node.domain or "")
    except Exception:  # noqa: BLE001 - not a standard op: nothing to expand
        return None
    if schema.has_function and schema.function_body.node:
        return schema.function_body
    if schema.has_context_dependent_function:
        tb = []
        for name in node.input:
            t = types.get(name)
            if name and t is None:
                return None
            tb.append(t.SerializeToString() if name else onnx.TypeProto().SerializeToString())
        try:
            raw = schema.get_context_dependent_function(node.SerializeToString(), tb)
        except Exception:  # noqa: BLE001 - the builder refuses some attribute combinations
            return None
        fn = onnx.FunctionProto()
        fn.ParseFromString(raw)
        return fn if fn.node else None
    return None


def rename_captured(node, rename: dict) -> None:
    """Rename, inside the node's subgraph attributes (If branches, Loop and Scan bodies), the outer names a
    body reads that the enclosing inliner renamed; names the body defines itself stay."""
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for g in graphs:
            own = {i.name for i in g.input} | {i.name for i in g.initializer} | \
                {o for n in g.node for o in n.output}
            inner = {k: v for k, v in rename.items() if k not in own}
            for n in g.node:
                for k, name in enumerate(n.input):
                    if name in inner:
                        n.input[k] = inner[name]
                rename_captured(n, inner)
            for o in g.output:
                if o.name in inner:      # an output passed straight through from outside
                    o.name = inner[o.name]


def inline_graph(body, prefix: str, binding: dict | None = None):
    """The body's nodes with its inputs bound (binding: body name -> outer name) and its own tensors
    renamed apart; returns (nodes, initializers, rename)."""
    rename = dict(binding or {})
    local = {o for n in body.node for o in n.output if o} | {i.name for i in body.initializer}
    for n in local:
        rename[n] = prefix + n
    nodes, inits = [], []
    for init in body.initializer:
        t = onnx.TensorProto()
        t.CopyFrom(init)
        t.name = rename[init.name]
        inits.append(t)
    for k, inner in enumerate(body.node):
        n = onnx.NodeProto()
        n.CopyFrom(inner)
        del n.input[:]
        del n.output[:]
        n.input.extend(rename.get(i, i) for i in inner.input)
        n.output.extend(rename.get(o, o) for o in inner.output)
        n.name = prefix + (inner.name or f"{inner.op_type}_{k}")
        rename_captured(n, rename)
        nodes.append(n)
    return nodes, inits, rename



def _schema_defaults(node, opset: int) -> dict:
    """The attribute defaults the op's schema declares (a body may refer to attributes the node omits)."""
    try:
        schema = defs.get_schema(node.op_type, opset, node.domain or "")
    except Exception:  # noqa: BLE001
        return {}
    out = {}
    for name, attr in schema.attributes.items():
        if attr.default_value is not None and attr.default_value.type:
            out[name] = attr.default_value
    return out


def _inline(node, fn, prefix: str, schema_defaults: dict | None = None) -> list:
    """The function's nodes with its formal inputs/outputs bound to the node's and its attribute
    references resolved against the node's attributes."""
    rename = {f: a for f, a in zip(fn.input, node.input)}
    rename.update({f: "" for f in list(fn.input)[len(node.input):]})
    rename.update({f: a for f, a in zip(fn.output, node.output)})
    attrs = {a.name: a for a in node.attribute}
    defaults = dict(schema_defaults or {})
    defaults.update({a.name: a for a in fn.attribute_proto})

    def name_of(n):
        if n == "":
            return ""
        if n not in rename:
            rename[n] = f"{prefix}{n}"
        return rename[n]
    out = []
    for k, inner in enumerate(fn.node):
        new = onnx.NodeProto()
        new.CopyFrom(inner)
        del new.input[:]
        del new.output[:]
        new.input.extend(name_of(i) for i in inner.input)
        new.output.extend(name_of(o) for o in inner.output)
        new.name = f"{prefix}{inner.name or inner.op_type + str(k)}"
        del new.attribute[:]
        for a in inner.attribute:
            if a.ref_attr_name:
                src = attrs.get(a.ref_attr_name) or defaults.get(a.ref_attr_name)
                if src is None:
                    continue
                b = onnx.AttributeProto()
                b.CopyFrom(src)
                b.name = a.name
                new.attribute.append(b)
            else:
                new.attribute.append(a)
        rename_captured(new, rename)
        out.append(new)
    return out


def opset_of(model) -> int:
    """The model's default-domain opset (13 when it names none)."""
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=13)


def expand_functions(model: onnx.ModelProto, supported: set, rounds: int = 4) -> bool:
    """Inline every default-domain node whose op is not in `supported` but has a standard function body."""
    opset = opset_of(model)
    changed_any = False
    for r in range(rounds):
        targets = {k for k, n in enumerate(model.graph.node) if n.domain in ("", "ai.onnx") and n.op_type not in supported}
        if not targets:
            break
        try:
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
        except Exception:  # noqa: BLE001
            inferred = model
        types = {v.name: v.type for v in list(inferred.graph.input) + list(inferred.graph.value_info)
                 + list(inferred.graph.output)}
        for init in model.graph.initializer:
            types.setdefault(init.name, helper.make_tensor_type_proto(init.data_type, list(init.dims)))
        nodes, changed = [], False
        for k, node in enumerate(model.graph.node):
            fn = _body(node, opset, types) if k in targets else None
            if fn is None:
                nodes.append(node)
                continue
            nodes.extend(_inline(node, fn, f"{node.name or node.op_type}__{r}_{k}__", _schema_defaults(node, opset)))
            changed = True
        if not changed:
            break
        del model.graph.node[:]
        model.graph.node.extend(nodes)
        changed_any = True
    return changed_any
