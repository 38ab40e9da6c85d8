"""The source model run in its own framework, for `verify`: each returns (tensors by name, [(name, source
op)] in graph order). Names follow the frontends' naming, so tensors match the converted graph's."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .errors import MnnToolError
from .frontends import detect


def reference(source, feeds: dict, shapes: dict):
    source = Path(source)
    if source.suffix.lower() == ".mnn":
        raise MnnToolError(f"{source}: the source must be the original model (.onnx, .pt, .prototxt, .pb, .keras "
                           "or a SavedModel directory), not a .mnn file")
    fw = detect(source)
    fn = {"onnx": onnx_reference, "caffe": caffe_reference, "torchscript": torch_reference,
          "tensorflow": tf_reference}.get(fw)
    if fn is None:
        raise MnnToolError(f"{source}: verify cannot run {fw} models")
    return fn(source, feeds, shapes)


def onnx_reference(source: Path, feeds: dict, shapes: dict):
    """Every tensor, made a graph output, from onnxruntime with its graph optimizations off."""
    import onnxruntime as ort
    from onnx import helper, shape_inference

    from .frontends.onnx import _fix_input_shapes, _read
    model = _read(source)
    _fix_input_shapes(source, model, shapes)
    try:
        inferred = shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:
        inferred = model
    typed = {vi.name: vi for vi in inferred.graph.value_info}
    existing = {o.name for o in model.graph.output}
    order = []
    for node in model.graph.node:
        for o in node.output:
            if not o:
                continue
            order.append((o, node.op_type))
            if o not in existing:
                model.graph.output.append(typed[o] if o in typed else helper.make_empty_tensor_value_info(o))
                existing.add(o)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    except Exception as e:
        raise MnnToolError(f"{source}: onnxruntime cannot load it ({str(e)[:160]})") from None
    ort_inputs = {i.name: i.type for i in sess.get_inputs()}
    missing = [n for n in ort_inputs if n not in feeds]
    if missing:
        raise MnnToolError(f"{source}: no data for input(s) {', '.join(missing)}")
    ort_feeds = {k: (v.astype(np.int64) if "int64" in ort_inputs[k] else v.astype(np.float32) if "float" in
                     ort_inputs[k] else v) for k, v in feeds.items() if k in ort_inputs}
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, ort_feeds))), order


def caffe_reference(source: Path, feeds: dict, shapes: dict):
    """OpenCV's Caffe importer (fusion off, so each layer's own output), one tensor per blob's last writer."""
    try:
        import cv2
    except ImportError:
        raise MnnToolError("verifying Caffe models needs OpenCV: pip install opencv-python-headless") from None
    from .frontends.caffe import _active, find_pair, read_net
    proto, model = find_pair(source)
    layers = [lay for lay in read_net(proto).layer if _active(lay) and lay.type not in ("Input", "Dropout", "Split")]
    last = {}
    for lay in layers:
        for top in lay.top:
            last[top] = lay
    try:
        net = cv2.dnn.readNetFromCaffe(str(proto), str(model))
    except cv2.error as e:
        raise MnnToolError(f"{proto}: OpenCV cannot load it ({str(e).strip().splitlines()[-1][:120]})") from None
    net.enableFusion(False)
    for name, x in feeds.items():
        net.setInput(np.ascontiguousarray(x, np.float32), name)
    known = set(net.getLayerNames())
    order = [(top, lay.type) for top, lay in last.items() if lay.name in known and lay.top[0] == top]
    outs = net.forward([last[top].name for top, _ in order])
    return {top: np.asarray(v) for (top, _), v in zip(order, outs)}, order


def torch_reference(source: Path, feeds: dict, shapes: dict):
    """torch.jit.load'ed module: the final outputs, named as the TorchScript frontend names them."""
    try:
        import torch
    except ImportError:
        raise MnnToolError("verifying TorchScript models needs torch: pip install 'mnntool[torch]'") from None
    module = torch.jit.load(str(source), map_location="cpu").eval()
    names = [v.debugName().split(".")[0] for v in module.graph.inputs()][1:]
    args = [torch.from_numpy(np.asarray(feeds[n])) for n in names]
    with torch.no_grad():
        out = module(*args)
    flat = list(out) if isinstance(out, (tuple, list)) else [out]
    flat = [o.numpy() for o in flat]
    names = ["output"] if len(flat) == 1 else [f"output_{k}" for k in range(len(flat))]
    return dict(zip(names, flat)), [(n, "output") for n in names]


def tf_reference(source: Path, feeds: dict, shapes: dict):
    """TensorFlow/Keras itself: the final outputs, named as the TensorFlow frontend names them."""
    from .frontends.tensorflow import _tf
    tf = _tf()
    if source.is_dir():
        fn = tf.saved_model.load(str(source)).signatures["serving_default"]
        out = fn(**{k: tf.constant(v) for k, v in feeds.items()})
        ref = {k: v.numpy() for k, v in out.items()}
    elif source.suffix.lower() in (".keras", ".h5", ".hdf5"):
        import keras
        model = keras.models.load_model(str(source), compile=False)
        names = [t.name.split(":")[0] for t in model.inputs]
        xs = [feeds[n] for n in names]
        out = model(xs if len(xs) > 1 else xs[0], training=False)
        flat = [o.numpy() for o in (out if isinstance(out, (list, tuple)) else [out])]
        ref = dict(zip(["output"] if len(flat) == 1 else [f"output_{k}" for k in range(len(flat))], flat))
    else:
        from .frontends.tensorflow import _from_graphdef
        gd, specs, outputs = _from_graphdef(tf, source, shapes)
        fn = tf.compat.v1.wrap_function(lambda: tf.graph_util.import_graph_def(gd, name=""), [])
        pruned = fn.prune([fn.graph.get_tensor_by_name(f"{op}:0") for op, _, _ in specs],
                          [fn.graph.get_tensor_by_name(ref) for ref, _ in outputs])
        vals = pruned(*[tf.constant(feeds[public]) for _, public, _ in specs])
        ref = {public: v.numpy() for (_, public), v in zip(outputs, vals)}
    return ref, [(n, "output") for n in ref]
