"""SavedModel directories read as data, as MNN's converter reads a .pb.

tf.saved_model.load runs the model's restore and initializer functions, which may hold any op (a
WriteFile, a PyFunc). Here the signature's functions are inlined from saved_model.pb, each variable is
matched to its checkpoint key through the restore function's RestoreV2/Assign pairs, and the values are
read from the variables' tensor bundle. Nothing in the model runs."""
from __future__ import annotations

from pathlib import Path

from ...errors import MnnToolError
from .inline import Flattened, _callee

# ops that reach files, processes or Python: never converted, named in the refusal
IO_OPS = frozenset({
    "ReadFile", "WriteFile", "MatchingFiles", "Save", "SaveV2", "SaveSlices", "Restore", "RestoreV2",
    "RestoreSlice", "MergeV2Checkpoints", "ShardedFilename", "PyFunc", "PyFuncStateless", "EagerPyFunc",
    "Print", "PrintV2", "ImmutableConst", "WholeFileReader", "WholeFileReaderV2", "TFRecordReader",
    "TFRecordReaderV2", "TextLineReader", "TextLineReaderV2", "FixedLengthRecordReader", "IdentityReader",
    "TFRecordDataset", "TextLineDataset", "FixedLengthRecordDataset", "WriteSummary", "WriteScalarSummary",
    "CreateSummaryFileWriter", "InitializeTableFromTextFile", "InitializeTableFromTextFileV2",
    "LoadAndRemapMatrix", "DebugIdentity", "DebugIdentityV2", "DebugIdentityV3", "Timestamp",
    "ExperimentalSleepDataset"})
VARIABLES = {"VariableV2", "Variable"}
MAX_PROTO_BYTES = 2**31 - 1


def refuse_io(path, nodes, why: str = "") -> None:
    bad = [n for n in nodes if n.op in IO_OPS]
    if bad:
        listed = ", ".join(f"{n.op} '{n.name}'" for n in bad[:3]) + (", ..." if len(bad) > 3 else "")
        raise MnnToolError(f"{path}: the graph calls ops that reach files or Python ({listed}); "
                           f"mnntool does not run them{why}")


def _saved_model(path: Path):
    from tensorflow.core.protobuf import saved_model_pb2
    pb = path / "saved_model.pb"
    if pb.stat().st_size > MAX_PROTO_BYTES:
        raise MnnToolError(f"{pb}: over 2 GB, more than a protobuf message can hold")
    sm = saved_model_pb2.SavedModel()
    try:
        sm.ParseFromString(pb.read_bytes())
    except Exception:
        raise MnnToolError(f"{pb}: not a SavedModel protobuf") from None
    graphs = [m for m in sm.meta_graphs if "serve" in m.meta_info_def.tags] or list(sm.meta_graphs)
    if not graphs:
        raise MnnToolError(f"{pb}: the SavedModel has no graph")
    return graphs[0]


def _signature(mg, path):
    sigs = {k: v for k, v in mg.signature_def.items() if not k.startswith("__")}
    key = "serving_default" if "serving_default" in sigs else next(iter(sorted(sigs)), None)
    if key is None:
        raise MnnToolError(f"{path}: the SavedModel has no serving signature")
    return sigs[key]


def _trace(flat, ref):
    """The node and output index a tensor comes from, looking through Identity."""
    for _ in range(10_000):
        name, _, k = flat.resolve(ref).partition(":")
        node = flat.nodes.get(name)
        if node is None or node.op != "Identity" or not node.input:
            return node, int(k or 0)
        ref = node.input[0]
    return None, 0


def _variable_id(node):
    if node is None:
        return None
    if node.op == "VarHandleOp":
        return node.attr["shared_name"].s.decode() or node.name
    return node.name if node.op in VARIABLES else None


def _checkpoint_keys(gd, mg, path) -> dict:
    """variable (VarHandleOp shared name or VariableV2 name) -> its key in the checkpoint."""
    from .ops import attr
    flat = Flattened(gd, path)
    restore = flat.nodes.get(mg.saver_def.restore_op_name.split(":")[0].lstrip("^"))
    if restore is not None and _callee(restore, flat.functions) is not None:
        flat.inline(restore, 0)
    keys = {}
    for n in list(flat.nodes.values()):
        if n.op not in ("AssignVariableOp", "Assign") or len(n.input) < 2:
            continue
        src, j = _trace(flat, n.input[1])
        if src is None or src.op not in ("RestoreV2", "Restore") or len(src.input) < 2:
            continue
        names_node, _ = _trace(flat, src.input[1])
        if names_node is None or names_node.op != "Const":
            continue
        names = attr(names_node, "value").reshape(-1)
        var = _variable_id(_trace(flat, n.input[0])[0])
        if var is not None and j < len(names):
            keys[var] = names[j].decode() if isinstance(names[j], bytes) else str(names[j])
    return keys


def read_saved_model(path: Path, resolve_shape, shapes: dict):
    """(nodes in dependency order, {Const node name: value}, input specs, outputs, function library)."""
    import tensorflow as tf
    mg = _saved_model(path)
    sig = _signature(mg, path)
    gd = mg.graph_def
    keys = _checkpoint_keys(gd, mg, path)     # before `needed` rewrites the shared nodes' inputs
    flat = Flattened(gd, path)
    outputs = [(sig.outputs[k].name, k) for k in sorted(sig.outputs)]
    refs = [r for r, _ in outputs]
    nodes = flat.needed(refs)
    reads = [n for n in nodes if n.op == "ReadVariableOp" or n.op in VARIABLES]
    values = {}
    if reads:
        prefix = path / "variables" / "variables"
        try:
            reader = tf.train.load_checkpoint(str(prefix))
        except Exception:
            raise MnnToolError(f"{path}: the variables' checkpoint (variables/variables.*) cannot be read") from None
        for n in reads:
            var = _variable_id(n if n.op in VARIABLES else _trace(flat, n.input[0])[0])
            if var not in keys:
                raise MnnToolError(f"{path}: {n.op} '{n.name}' reads a variable the restore function never sets")
            try:
                values[n.name] = reader.get_tensor(keys[var])
            except Exception:
                raise MnnToolError(f"{path}: the checkpoint lacks '{keys[var]}' (read by '{n.name}')") from None
            del n.input[:]
            n.op = "Const"
        nodes = flat.needed(refs)
    specs = []
    for key in sorted(sig.inputs):
        info = sig.inputs[key]
        node = info.name.split(":")[0]
        shape = info.tensor_shape
        declared = None if shape.unknown_rank else [d.size if d.size >= 0 else None for d in shape.dim]
        specs.append((node, key, resolve_shape(path, key, declared, shapes.get(key))))
    return nodes, values, specs, [(flat.resolve(r), k) for r, k in outputs], flat.functions


def _saver_parts(gd, mg) -> tuple[set, set]:
    """Main-graph nodes and library functions of the saver (its RestoreV2/SaveV2 are the checkpoint's own)."""
    nodes = {n.name: n for n in gd.node}
    functions = {f.signature.name: f for f in gd.library.function}
    roots = [mg.saver_def.restore_op_name, mg.saver_def.save_tensor_name] if mg is not None else []
    stack = [r.split(":")[0].lstrip("^") for r in roots if r]
    seen, called = set(), set()
    while stack:
        name = stack.pop()
        if name in seen or name not in nodes:
            continue
        seen.add(name)
        f = _callee(nodes[name], functions)
        if f is not None:
            called.add(f.signature.name)
        stack.extend(i.split(":")[0].lstrip("^") for i in nodes[name].input)
    todo = list(called)
    while todo:
        for n in functions[todo.pop()].node_def:
            f = _callee(n, functions)
            if f is not None and f.signature.name not in called:
                called.add(f.signature.name)
                todo.append(f.signature.name)
    return seen, called


def io_ops_in(path: Path) -> list:
    """Every op in a SavedModel or .pb that reaches files or Python, wherever TensorFlow might run it (on
    load, in initializers, in any function), the saver's own checkpoint reads and writes aside."""
    if path.is_dir():
        mg = _saved_model(path)
        gd = mg.graph_def
    else:
        from tensorflow.core.framework import graph_pb2
        mg, gd = None, graph_pb2.GraphDef()
        try:
            gd.ParseFromString(path.read_bytes())
        except Exception:
            raise MnnToolError(f"{path}: not a TensorFlow GraphDef (.pb)") from None
    saver_nodes, saver_functions = _saver_parts(gd, mg)
    found = [n for n in gd.node if n.name not in saver_nodes and n.op in IO_OPS]
    for f in gd.library.function:
        if f.signature.name not in saver_functions:
            found += [n for n in f.node_def if n.op in IO_OPS]
    return found
