"""Caffe (.prototxt + .caffemodel) -> IR, without Caffe: the layers come from the text prototxt, the blobs
from the binary caffemodel, both read with the project's own caffe.proto subset."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ...errors import MnnToolError
from ...ir.graph import Graph
from ...ir.ops import rows_at_run_time
from ..shape_tracking import ShapedCtx, T, given_shape
from . import detection, structural  # noqa: F401  (they register layers)
from .layers import LAYERS
from .proto import messages

SKIPPED = {"Input", "Accuracy", "SoftmaxWithLoss", "EuclideanLoss", "Silence"}
NOT_FOR_INFERENCE = {"Data", "ImageData", "HDF5Data", "MemoryData", "WindowData", "Python"}


def supported_layers() -> list[str]:
    return sorted(set(LAYERS) | {"Input"})


def find_pair(path: Path, weights: str | Path | None = None) -> tuple[Path, Path]:
    """The (prototxt, caffemodel) pair for either file: the other one has the same stem."""
    if path.suffix.lower() == ".caffemodel":
        proto, model = path.with_suffix(".prototxt"), path
    else:
        proto, model = path, Path(weights) if weights else path.with_suffix(".caffemodel")
    for p, what in ((proto, "prototxt"), (model, "caffemodel")):
        if not p.exists():
            raise MnnToolError(f"{path}: Caffe needs the {what} next to it: {p} does not exist")
    return proto, model


def _blob_array(blob) -> np.ndarray:
    data = np.asarray(blob.data, np.float32) if len(blob.data) else np.asarray(blob.double_data, np.float32)
    dims = [int(d) for d in blob.shape.dim] if blob.HasField("shape") else \
        [d for d in (blob.num, blob.channels, blob.height, blob.width) if d]
    if dims and int(np.prod(dims)) == data.size:
        return data.reshape(dims)
    return data


def read_net(proto: Path):
    from google.protobuf import text_format
    net = messages()["NetParameter"]()
    try:
        text_format.Parse(proto.read_text(errors="replace"), net, allow_unknown_field=True)
    except text_format.ParseError as e:
        raise MnnToolError(f"{proto}: not a Caffe prototxt ({str(e).splitlines()[0][:120]})") from None
    if len(net.layers) and not len(net.layer):
        upgrade_v1(proto, net)
    return net


def _v1_type(enum_name: str) -> str:
    """CONVOLUTION -> Convolution, INNER_PRODUCT -> InnerProduct; the irregular names from a table."""
    special = {"ABSVAL": "AbsVal", "BNLL": "BNLL", "LRN": "LRN", "MVN": "MVN", "RELU": "ReLU", "TANH": "TanH",
               "ARGMAX": "ArgMax", "HDF5_DATA": "HDF5Data", "HDF5_OUTPUT": "HDF5Output", "IM2COL": "Im2col",
               "SOFTMAX_LOSS": "SoftmaxWithLoss", "DUMMY_DATA": "DummyData"}
    return special.get(enum_name) or "".join(w.capitalize() for w in enum_name.split("_"))


def upgrade_v1(proto: Path, net) -> None:
    """A V1 net (`layers { type: CONVOLUTION ... }`) rewritten as `layer` messages, as Caffe's
    upgrade_net_proto_text does: the enum type becomes its name, the parameters are copied over."""
    v1 = list(net.layers)
    enum = messages()["V1LayerParameter"].DESCRIPTOR.enum_types_by_name["LayerType"]
    for old in v1:
        if not old.type:
            raise MnnToolError(f"{proto}: V1 layer '{old.name}' has no type")
        new = net.layer.add(name=old.name, type=_v1_type(enum.values_by_number[old.type].name))
        new.bottom.extend(old.bottom)
        new.top.extend(old.top)
        new.include.extend(old.include)
        new.exclude.extend(old.exclude)
        new.blobs.extend(old.blobs)
        for field, value in old.ListFields():
            if field.name.endswith("_param"):
                getattr(new, field.name).CopyFrom(value)
    del net.layers[:]


def read_weights(model: Path) -> dict[str, list[np.ndarray]]:
    weights = messages()["NetWeights"]()
    try:
        weights.ParseFromString(model.read_bytes())
    except Exception as e:
        raise MnnToolError(f"{model}: not a Caffe caffemodel ({type(e).__name__})") from None
    layers = list(weights.layer) or list(weights.layers)
    return {lay.name: [_blob_array(b) for b in lay.blobs] for lay in layers}


def _active(lay) -> bool:
    """Deploy-time (TEST phase) layers only."""
    if any(rule.HasField("phase") and rule.phase != 1 for rule in lay.include):
        return False
    return not any(rule.HasField("phase") and rule.phase == 1 for rule in lay.exclude)


def _input_specs(net) -> list[tuple[str, list[int] | None]]:
    specs = []
    for k, name in enumerate(net.input):
        if k < len(net.input_shape):
            specs.append((name, [int(d) for d in net.input_shape[k].dim]))
        elif len(net.input_dim) >= 4 * (k + 1):
            specs.append((name, [int(d) for d in net.input_dim[4 * k:4 * k + 4]]))
        else:
            specs.append((name, None))
    for lay in net.layer:
        if lay.type == "Input" and _active(lay):
            shapes = list(lay.input_param.shape)
            for k, top in enumerate(lay.top):
                s = shapes[k] if k < len(shapes) else (shapes[0] if shapes else None)
                specs.append((top, [int(d) for d in s.dim] if s is not None else None))
    return specs


def load_caffe(path, input_shapes: dict, weights=None) -> Graph:
    proto, model = find_pair(Path(path), weights)
    net = read_net(proto)
    blobs = read_weights(model)
    layers = [lay for lay in net.layer if _active(lay)]
    bad = [f"{lay.type} ('{lay.name}')" for lay in layers
           if lay.type not in LAYERS and lay.type not in SKIPPED]
    if bad:
        hint = " (a training net: convert the deploy prototxt)" if any(
            lay.type in NOT_FOR_INFERENCE for lay in layers) else ""
        raise MnnToolError(f"{proto}: unsupported Caffe layers{hint}: {', '.join(bad)}")
    g = Graph(source="CAFFE", name=net.name or proto.stem)
    ctx = ShapedCtx(g, str(proto))
    env: dict[str, T] = {}
    specs = _input_specs(net)
    if not specs:
        raise MnnToolError(f"{proto}: the net declares no input (an Input layer or input/input_shape)")
    for name, shape in specs:
        if name in input_shapes:        # a Caffe net reshapes to any size: only the rank is kept
            shape = given_shape(proto, name, None if not shape else [None] * len(shape), input_shapes[name])
        elif shape and any(d <= 0 for d in shape):      # 0 or -1: left open by the exporter
            shown = "x".join(str(d) if d > 0 else "?" for d in shape)
            raise MnnToolError(f"{proto}: input '{name}' has shape {shown}; give --input-shape {name}:...")
        if not shape:
            raise MnnToolError(f"{proto}: input '{name}' has no shape; give --input-shape {name}:1x3x224x224")
        env[name] = ctx.add_input(name, shape)
    extra = set(input_shapes) - {n for n, _ in specs}
    if extra:
        raise MnnToolError(f"{proto}: --input-shape names {', '.join(sorted(extra))}, but the inputs are "
                           f"{', '.join(n for n, _ in specs)}")
    # a blob written several times (in-place layers) keeps its name for the last write only
    last_writer = {}
    for k, lay in enumerate(layers):
        for top in lay.top:
            last_writer[top] = k
    for k, lay in enumerate(layers):
        if lay.type in SKIPPED:
            continue
        missing = [b for b in lay.bottom if b not in env]
        if missing:
            raise MnnToolError(f"{proto}: layer '{lay.name}' reads blob(s) {', '.join(missing)} that no layer makes")
        bottoms = [env[b] for b in lay.bottom]
        tops = [top if last_writer[top] == k and top not in g.tensors else g.fresh_name(f"{lay.name}__{top}")
                for top in lay.top]
        try:
            outs = LAYERS[lay.type](ctx, lay, blobs.get(lay.name, []), bottoms, tops)
        except MnnToolError:
            raise
        except Exception as e:
            raise MnnToolError(f"{proto}: {lay.type} layer '{lay.name}': cannot convert "
                               f"({type(e).__name__}: {e})") from None
        for top, out in zip(lay.top, outs):
            env[top] = T(out)
    sized_at_run_time = {o: n.op for n in g.nodes if rows_at_run_time(n.op) for o in n.outputs}
    for n in g.nodes:
        for i in n.inputs:
            if i in sized_at_run_time:
                raise MnnToolError(f"{proto}: layer '{n.name}' reads a {sized_at_run_time[i]}'s result: MNN sizes "
                                   "the layers after it before it runs, so it must be an output of the net")
    used = {i for n in g.nodes for i in n.inputs}
    for lay in layers:
        for top in lay.top:
            t = env.get(top)
            if t is not None and t not in used and t not in g.outputs and t not in g.inputs:
                g.outputs.append(str(t))
    if not g.outputs:
        raise MnnToolError(f"{proto}: the net has no output")
    ctx.drop_unused_constants()
    return g
