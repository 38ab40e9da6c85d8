"""TensorFlow (SavedModel directories, frozen GraphDef .pb, Keras .keras/.h5) -> IR.

SavedModels and .pb files are read as protobuf data (function calls inlined, variables read from the
checkpoint: the model's own code never runs); Keras files are loaded in Keras's safe mode and frozen with
TensorFlow. The GraphDef is then walked op by op from the outputs back, so only what they need is
converted."""
from __future__ import annotations

import os
from pathlib import Path


from ...errors import MnnToolError
from ...native_output import redirected_fd
from ...ir.graph import Graph
from ..shape_tracking import T
from .context import TfCtx
from .inline import Flattened
from . import array_ops, math_ops, nn_ops  # noqa: F401  (they register converters)
from .functions import IGNORED, LIST_HANDLES, ref as ref_of, run_nodes
from .ops import CONST_EVAL, OPS
from .saved_model import read_saved_model, refuse_io

SKIP = {"SaveV2", "RestoreV2", "VarHandleOp", "AssignVariableOp"}     # the saver's, never on an output's path


def supported_ops() -> list[str]:
    return sorted(set(OPS) | set(CONST_EVAL) | IGNORED | {"Placeholder", "Const"})


def _tf():
    """TensorFlow, imported with its C++ start-up log lines kept off the user's stderr."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    try:
        with redirected_fd(2):
            import tensorflow as tf
    except ImportError:
        raise MnnToolError("TensorFlow models need TensorFlow: pip install 'mnntool[tf]'") from None
    return tf


def _resolve_shape(path, name, declared, given):
    if given is not None:
        if declared is not None and len(declared) != len(given):
            raise MnnToolError(f"{path}: --input-shape {name} has rank {len(given)}, the model's input has "
                               f"rank {len(declared)}")
        return [int(d) for d in given]
    if declared is None:
        raise MnnToolError(f"{path}: input '{name}' has an unknown shape; give --input-shape {name}:1x224x224x3")
    dims = list(declared)
    if dims and dims[0] is None:
        dims[0] = 1                          # batch 1 unless told otherwise
    if any(d is None or d < 0 for d in dims):
        shown = "x".join("?" if d is None or d < 0 else str(d) for d in dims)
        raise MnnToolError(f"{path}: input '{name}' has shape {shown}; give --input-shape {name}:...")
    return dims


def _freeze(tf, fn):
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2
    frozen = convert_variables_to_constants_v2(fn, lower_control_flow=False)     # While/If stay functional
    inputs = [t for t in frozen.inputs if t.dtype != tf.resource]
    return frozen.graph.as_graph_def(), inputs, list(frozen.outputs)


def _from_keras(tf, path, shapes):
    import keras
    try:
        model = keras.models.load_model(str(path), compile=False, safe_mode=True)
    except Exception as e:
        raise MnnToolError(f"{path}: Keras cannot load it ({type(e).__name__}: {str(e)[:120]})") from None
    names = [getattr(t, "name", f"input_{k}").split(":")[0] for k, t in enumerate(model.inputs)]
    specs = []
    for name, t in zip(names, model.inputs):
        dims = _resolve_shape(path, name, list(t.shape), shapes.get(name))
        specs.append(tf.TensorSpec(dims, t.dtype, name=name))
    fn = tf.function(lambda *xs: model(list(xs) if len(xs) > 1 else xs[0], training=False))
    gd, inputs, outputs = _freeze(tf, fn.get_concrete_function(*specs))
    out_names = ["output"] if len(outputs) == 1 else [f"output_{k}" for k in range(len(outputs))]
    return gd, [(t.op.name, n, list(s.shape)) for t, n, s in zip(inputs, names, specs)], \
        [(t.name, n) for t, n in zip(outputs, out_names)]


def _from_graphdef(tf, path, shapes):
    gd = tf.compat.v1.GraphDef()
    try:
        gd.ParseFromString(Path(path).read_bytes())
    except Exception:
        raise MnnToolError(f"{path}: not a TensorFlow GraphDef (.pb)") from None
    if not len(gd.node):
        raise MnnToolError(f"{path}: the GraphDef has no nodes")
    used = {i.lstrip("^").split(":")[0] for n in gd.node for i in n.input}
    specs = []
    for n in gd.node:
        if n.op == "Placeholder":
            shape_attr = n.attr["shape"].shape
            declared = None if shape_attr.unknown_rank else [d.size if d.size >= 0 else None for d in shape_attr.dim]
            specs.append((n.name, n.name, _resolve_shape(path, n.name, declared, shapes.get(n.name))))
    outputs = [(f"{n.name}:0", n.name) for n in gd.node
               if n.name not in used and n.op not in SKIP | IGNORED | LIST_HANDLES | {"Const", "Placeholder"}]
    if not outputs:
        raise MnnToolError(f"{path}: no output found")
    return gd, specs, outputs


def _body_functions(nodes, functions) -> list:
    """The library functions control-flow nodes run (While/If/Case bodies and the calls inside them)."""
    seen, todo = {}, [n for n in nodes]
    while todo:
        n = todo.pop()
        for key in n.attr:
            a = n.attr[key]
            names = [a.func.name] if a.HasField("func") else [f.name for f in a.list.func]
            for name in names:
                if name in functions and name not in seen:
                    seen[name] = functions[name]
                    todo.extend(functions[name].node_def)
    return list(seen.values())


def _refuse_unsupported(path, nodes) -> None:
    bad = {}
    for n in nodes:
        if n.op not in OPS and n.op not in CONST_EVAL and n.op not in ("Placeholder", "Const") \
                and n.op not in SKIP | IGNORED:
            bad.setdefault(n.op, []).append(n.name)
    if bad:
        listed = "; ".join(f"{op} ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
                           for op, names in sorted(bad.items()))
        raise MnnToolError(f"{path}: unsupported TensorFlow ops: {listed}")


def load_tensorflow(path, input_shapes: dict) -> Graph:
    path = Path(path)
    if not path.exists():
        raise MnnToolError(f"{path}: no such file or directory")
    tf = _tf()
    values: dict = {}
    if path.is_dir():
        nodes, values, specs, outputs, functions = read_saved_model(path, _resolve_shape, input_shapes)
    else:
        reader = _from_keras if path.suffix.lower() in (".keras", ".h5", ".hdf5") else _from_graphdef
        gd, specs, outputs = reader(tf, path, input_shapes)
        flat = Flattened(gd, path)
        nodes = flat.needed([r for r, _ in outputs])
        outputs = [(flat.resolve(r), k) for r, k in outputs]
        functions = flat.functions
    bodies = _body_functions(nodes, functions)
    inner = [n for f in bodies for n in f.node_def]
    refuse_io(path, nodes)
    refuse_io(path, inner, " (inside a loop or branch body)")
    unknown = set(input_shapes) - {public for _, public, _ in specs}
    if unknown:
        raise MnnToolError(f"{path}: --input-shape names {', '.join(sorted(unknown))}, but the inputs are "
                           f"{', '.join(p for _, p, _ in specs)}")
    _refuse_unsupported(path, nodes + inner)
    g = Graph(source="TENSORFLOW", name=path.stem)
    ctx = TfCtx(g, str(path))
    ctx.functions = functions
    env: dict[str, object] = {f"{name}:0": v for name, v in values.items()}
    dtypes = {n.name: n.attr["dtype"].type for n in nodes if n.op == "Placeholder"}
    for op_name, public, shape in specs:
        dtype = "int32" if dtypes.get(op_name) in (3, 9) else "float32"   # DT_INT32, DT_INT64
        env[f"{op_name}:0"] = ctx.add_input(public, shape, dtype)
    for n in nodes:
        if n.op == "Placeholder" and f"{n.name}:0" not in env:
            raise MnnToolError(f"{path}: placeholder '{n.name}' is not a model input")
    run_nodes(ctx, [n for n in nodes if n.op not in SKIP and n.op != "Placeholder"], env)
    for ref, public in outputs:
        v = env[ref_of(ref)]
        if not isinstance(v, T):
            raise MnnToolError(f"{path}: output '{public}' is a constant")
        ctx.publish(ctx.as_nhwc(v), public)
    ctx.drop_unused_constants()
    return g
