"""Function calls in a GraphDef replaced by the functions' bodies, as protobuf data.

TF2 SavedModels keep their computation in the function library, behind (Stateful)PartitionedCall nodes.
TensorFlow would inline them by building and running a graph; this does it on the messages alone, so
nothing of the model runs while it is converted."""
from __future__ import annotations

from ...errors import MnnToolError

CALLS = {"StatefulPartitionedCall", "PartitionedCall"}
MAX_NODES = 2_000_000       # a library that calls itself would otherwise inline forever
MAX_DEPTH = 64


def _op_def(op: str):
    from tensorflow.python.framework import op_def_registry
    return op_def_registry.get(op)


def _arg_count(node, arg) -> int:
    if arg.number_attr:
        return node.attr[arg.number_attr].i
    if arg.type_list_attr:
        return len(node.attr[arg.type_list_attr].list.type)
    return 1


def _output_starts(node, functions) -> dict:
    """output arg name -> index of its first tensor among the node's flat outputs."""
    fdef = functions.get(node.op)
    args = fdef.signature.output_arg if fdef is not None else getattr(_op_def(node.op), "output_arg", None)
    if args is None:
        return {}
    starts, k = {}, 0
    for arg in args:
        starts[arg.name] = k
        k += 1 if fdef is not None else _arg_count(node, arg)
    return starts


def flat_body(fdef, functions):
    """The body's nodes with GraphDef-style inputs ('node:k'), and the tensor each output arg returns.
    Argument references stay as the bare argument name."""
    args = {a.name for a in fdef.signature.input_arg}
    starts = {n.name: None for n in fdef.node_def}

    def flat(ref: str) -> str:
        if ref.startswith("^"):
            return ref
        parts = ref.split(":")
        if parts[0] in args:
            return parts[0]
        if len(parts) == 1:
            return f"{parts[0]}:0"
        if parts[0] not in starts:
            raise MnnToolError(f"function {fdef.signature.name}: '{ref}' names no node")
        if starts[parts[0]] is None:
            starts[parts[0]] = _output_starts(by_name[parts[0]], functions)
        base = starts[parts[0]].get(parts[1])
        if base is None:
            raise MnnToolError(f"function {fdef.signature.name}: '{ref}' names no output of its node")
        return f"{parts[0]}:{base + int(parts[2] if len(parts) > 2 else 0)}"

    by_name = {n.name: n for n in fdef.node_def}
    nodes = []
    for n in fdef.node_def:
        c = type(n)()
        c.CopyFrom(n)
        del c.input[:]
        c.input.extend(flat(i) for i in n.input)
        nodes.append(c)
    ret = {a.name: flat(fdef.ret[a.name]) for a in fdef.signature.output_arg}
    return nodes, [ret[a.name] for a in fdef.signature.output_arg]


def _callee(node, functions):
    if node.op in CALLS:
        return functions.get(node.attr["f"].func.name)
    return functions.get(node.op)


class Flattened:
    """A GraphDef's nodes by name, calls inlined on demand, and what each call's outputs became."""

    def __init__(self, gd, path):
        self.path = path
        self.functions = {f.signature.name: f for f in gd.library.function}
        self.nodes = {n.name: n for n in gd.node}
        self.alias: dict[str, str] = {}

    def resolve(self, ref: str) -> str:
        ref = ref if ":" in ref else f"{ref}:0"
        seen = 0
        while ref in self.alias:
            ref = self.alias[ref]
            seen += 1
            if seen > MAX_NODES:
                raise MnnToolError(f"{self.path}: function outputs refer to each other in a cycle")
        return ref

    def inline(self, call, depth: int) -> None:
        fdef = _callee(call, self.functions)
        if fdef is None:
            raise MnnToolError(f"{self.path}: {call.op} '{call.name}' calls a function the library lacks")
        if depth > MAX_DEPTH:
            raise MnnToolError(f"{self.path}: function calls nest deeper than {MAX_DEPTH} ('{call.name}')")
        body, rets = flat_body(fdef, self.functions)
        data_inputs = [i for i in call.input if not i.startswith("^")]
        args = [a.name for a in fdef.signature.input_arg]
        if len(data_inputs) != len(args):
            raise MnnToolError(f"{self.path}: '{call.name}' passes {len(data_inputs)} inputs to "
                               f"{fdef.signature.name}, which takes {len(args)}")
        bind = dict(zip(args, data_inputs))
        prefix = f"{call.name}/"

        def outer(ref: str) -> str:
            if ref.startswith("^"):
                return "" if ref[1:] in bind else "^" + prefix + ref[1:]
            return bind[ref] if ref in bind else prefix + ref

        del self.nodes[call.name]
        if len(self.nodes) + len(body) > MAX_NODES:
            raise MnnToolError(f"{self.path}: inlining function calls passes {MAX_NODES} nodes")
        for n in body:
            inputs = [outer(i) for i in n.input]
            n.name = prefix + n.name
            del n.input[:]
            n.input.extend(i for i in inputs if i)
            n.attr["_inline_depth"].i = depth + 1
            self.nodes[n.name] = n
        for k, r in enumerate(rets):
            self.alias[f"{call.name}:{k}"] = outer(r)

    def needed(self, refs):
        """The nodes the given tensors depend on, in dependency order, with every call on the way inlined."""
        while True:
            order = self._walk(refs)
            calls = [n for n in order if _callee(n, self.functions) is not None]
            if not calls:
                for n in order:
                    inputs = [i if i.startswith("^") else self.resolve(i) for i in n.input]
                    del n.input[:]
                    n.input.extend(inputs)
                return order
            for n in calls:
                self.inline(n, n.attr["_inline_depth"].i if "_inline_depth" in n.attr else 0)

    def _walk(self, refs):
        order, seen = [], set()
        for ref in refs:
            stack = [(self.resolve(ref).split(":")[0], False)]
            while stack:
                name, done = stack.pop()
                if done:
                    order.append(self.nodes[name])
                    continue
                if name in seen or name not in self.nodes:
                    continue
                seen.add(name)
                stack.append((name, True))
                for i in self.nodes[name].input:
                    if not i.startswith("^"):
                        stack.append((self.resolve(i).split(":")[0], False))
        return order
