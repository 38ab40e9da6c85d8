"""The fixture models the suite and `make demo` lean on have outputs that depend on their inputs, and
activations that neither vanish nor saturate, judged in onnxruntime (an independent reference; the Keras
fixtures in TensorFlow and the Caffe ones in OpenCV, outputs only). The LLM checkpoints
(fixtures/llm_checkpoints.py) are checked by their own tests (greedy decoding wanders, a trained model).

A fixture whose output ignores its input makes every comparison on it vacuous: the MobileNetV2 fixture's
outputs for zeros, N(0,1) and 100x inputs once agreed to 4.5e-7, so `verify` and the int8 cosines quoted
on it measured only the last layer's bias. Thresholds:
- outputs: for every pair of the inputs below (zeros, N(0,1), N(0,1) scaled by 3 and shifted by 1, an
  image-like smooth picture normalised as ImageNet's; ids: different draws), the relative difference
  |y_a - y_b| / max(|y_a|, |y_b|) >= 0.05. The fixtures give 0.28 (the detector's boxes, anchored to their
  grid) to 1.3; the broken MobileNetV2 gave 2e-7.
- every float tensor downstream of an input (so not anchor grids or masks built from shapes), on N(0,1):
  its standard deviation over its finite elements within [0.01, 1000] (the input's is 1; boxes in pixels
  reach ~100), its relative difference between the zeros and the N(0,1) input >= 0.05 (the broken
  MobileNetV2 fell to 2.6e-7 by its last layer, below 0.05 by its fourth block), sigmoid / tanh / ReLU6
  outputs with at most half their elements at a bound (within 1e-3 of 0 or 1, -1 or 1, exactly 6), and
  softmax outputs not flat: their standard deviation along the softmax axis over its mean (1/n) >= 0.25
  (the BERT fixture's attention: 0.34; a uniform softmax, whose logits vanished: 0).
"""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

MIN_OUTPUT_SPREAD = 0.05
MIN_LAYER_DEPENDENCE = 0.05
STD_BAND = (0.01, 1000.0)
MIN_SOFTMAX_VARIATION = 0.25
MAX_AT_BOUND = 0.5


def image_like(shape, rng) -> np.ndarray:
    """A smooth picture in [0, 1] (bands of colour and a little noise) normalised with ImageNet's mean and
    std, as a camera image reaches a classifier."""
    n, c, h, w = shape
    yy, xx = np.mgrid[0:h, 0:w] / max(h, w)
    planes = np.stack([np.sin(6 * xx + k) * 0.5 + np.cos(4 * yy * (k + 1)) * 0.3 for k in range(c)])
    x = np.clip(planes[None] * 0.5 + 0.45 + 0.05 * rng.standard_normal(shape), 0, 1)
    mean = np.resize(np.array([0.485, 0.456, 0.406]), c).reshape(1, c, 1, 1)
    std = np.resize(np.array([0.229, 0.224, 0.225]), c).reshape(1, c, 1, 1)
    return ((x - mean) / std).astype(np.float32)


def float_inputs(shape, image: bool = True) -> dict:
    rng = np.random.default_rng(20261126)
    normal = rng.standard_normal(shape).astype(np.float32)
    out = {"zeros": np.zeros(shape, np.float32), "normal": normal,
           "scaled_shifted": (3 * rng.standard_normal(shape) + 1).astype(np.float32)}
    if image:
        out["image"] = image_like(shape, rng)
    return out


def id_inputs(shape, vocab) -> dict:
    rng = np.random.default_rng(20261126)
    return {"zeros": np.zeros(shape, np.int64), "draw 1": rng.integers(0, vocab, shape).astype(np.int64),
            "draw 2": rng.integers(0, vocab, shape).astype(np.int64)}


def _input_dependent(model) -> set[str]:
    """Names of the tensors computed from a graph input (not from initializers and shapes alone)."""
    seen = {i.name for i in model.graph.input} - {t.name for t in model.graph.initializer}
    for node in model.graph.node:        # ONNX nodes are topologically sorted
        if any(i in seen for i in node.input) and node.op_type not in ("Shape", "Size"):
            seen.update(node.output)
    return seen


def _with_every_tensor(path):
    """The model with every float intermediate tensor that depends on an input as an extra output, and each
    tensor's producing op type."""
    model = onnx.shape_inference.infer_shapes(onnx.load(str(path)))
    kinds = {v.name: v.type.tensor_type.elem_type for v in [*model.graph.value_info, *model.graph.output]}
    dependent = _input_dependent(model)
    present = {o.name for o in model.graph.output}
    producer = {}
    for node in model.graph.node:
        for name in node.output:
            producer[name] = node
            if name in dependent and name not in present and kinds.get(name) == onnx.TensorProto.FLOAT:
                model.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
                present.add(name)
    return model, producer, dependent


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(a), np.linalg.norm(b), 1e-30))


def _at_bound(node, y) -> float:
    """The fraction of a saturating op's outputs at its bounds (0.0 for an op that has none)."""
    if node.op_type == "Sigmoid":
        return float(np.mean((y < 1e-3) | (y > 1 - 1e-3)))
    if node.op_type == "Tanh":
        return float(np.mean(np.abs(y) > 1 - 1e-3))
    if node.op_type == "Clip":
        return float(np.mean(y >= y.max())) if np.isclose(y.max(), 6.0) else 0.0
    return 0.0


def check(path, inputs: dict[str, dict]) -> list[str]:
    """Problems of the model at `path` fed each of `inputs` (a name -> feeds), as lines naming the tensor."""
    model, producer, dependent = _with_every_tensor(path)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    finals = [o.name for o in onnx.load(str(path), load_external_data=False).graph.output]
    got = {k: dict(zip(names, sess.run(None, feeds))) for k, feeds in inputs.items()}
    problems = []
    keys = list(inputs)
    for out in finals:
        if out not in dependent:
            continue
        spread = min(_rel(got[a][out], got[b][out]) for i, a in enumerate(keys) for b in keys[i + 1:])
        if spread < MIN_OUTPUT_SPREAD:
            problems.append(f"output {out}: relative difference {spread:.2g} between inputs (< {MIN_OUTPUT_SPREAD})")
    zeros, normal = got[keys[0]], got[keys[1]]
    for name in names:
        y = normal[name]
        if name not in dependent or y.size < 16 or not np.issubdtype(y.dtype, np.floating):
            continue
        finite = np.isfinite(y) & np.isfinite(zeros[name])       # additive masks hold -inf
        std, dep = float(y[finite].std()), _rel(y[finite], zeros[name][finite])
        node = producer.get(name)
        bound = _at_bound(node, y) if node is not None else 0.0
        if node is not None and node.op_type == "Softmax":
            axis = next((att.i for att in node.attribute if att.name == "axis"), -1)
            variation = float((y.std(axis=axis) * y.shape[axis]).mean())
            if variation < MIN_SOFTMAX_VARIATION:
                problems.append(f"{name}: softmax nearly uniform (std x n {variation:.2g} < {MIN_SOFTMAX_VARIATION})")
        elif not STD_BAND[0] <= std <= STD_BAND[1]:
            problems.append(f"{name}: std {std:.3g} outside {STD_BAND}")
        if dep < MIN_LAYER_DEPENDENCE:
            problems.append(f"{name}: relative difference {dep:.2g} between zeros and N(0,1) input")
        if bound > MAX_AT_BOUND:
            problems.append(f"{name}: {bound:.0%} of {producer[name].op_type} outputs at a bound")
    return problems


def _images(name, shape):
    return {k: {name: v} for k, v in float_inputs(shape).items()}


def _decoder_inputs():
    rng = np.random.default_rng(20261126)
    past = (2, 1, 4, 5, 16)
    ids = id_inputs((1, 3), 97)
    kv = float_inputs(past, image=False)
    return {k: {"ids": ids[i], "past_k": kv[k], "past_v": kv[k] * 0.5 + rng.standard_normal(past).astype(np.float32)
                * (k != "zeros")} for i, k in zip(ids, kv)}


def _export(module, **kw):
    def make(fixture_model, folder):
        from importlib import import_module
        path = folder / f"{module}.onnx"
        import_module(f"fixtures.{module}").export(path, **kw)
        return path
    return make


def _zoo(name):
    def make(fixture_model, folder):
        from fixtures.zoo import ZOO, export, wrapped
        path = folder / f"{name}.onnx"
        export(ZOO[name], wrapped(ZOO[name].build().eval()), path, "legacy")
        return path
    return make


def _zoo_inputs(name):
    def make():
        from fixtures.zoo import ZOO
        entry = ZOO[name]
        x = entry.inputs()[0]
        if x.dtype.is_floating_point:
            return {k: {entry.names[0]: v} for k, v in float_inputs(tuple(x.shape)).items()}
        return {k: {entry.names[0]: v} for k, v in id_inputs(tuple(x.shape), 100).items()}
    return make


CASES = {
    "mobilenetv2": (lambda fm, _: fm("mobilenetv2"), lambda: _images("input", (1, 3, 224, 224))),
    "resnet18": (lambda fm, _: fm("resnet18"), lambda: _images("input", (1, 3, 224, 224))),
    "bert": (lambda fm, _: fm("bert"), lambda: {k: {"ids": v} for k, v in id_inputs((1, 128), 1000).items()}),
    "lstm": (lambda fm, _: fm("lstm"),
             lambda: {k: {"input": v} for k, v in float_inputs((16, 1, 32), image=False).items()}),
    "detector": (_export("detector"), lambda: _images("images", (1, 3, 128, 160))),
    "dbnet": (_export("dbnet"), lambda: _images("images", (1, 3, 160, 224))),
    "decoder": (_export("decoder", dynamo=False), _decoder_inputs),
    # the model-zoo entries tests/test_model_zoo.py runs (benchmarks/ run the rest of fixtures/zoo.py)
    **{f"zoo_{n}": (_zoo(n), _zoo_inputs(n)) for n in ("mobilenetv3_large_100", "bert", "gpt2")},
}


@pytest.mark.parametrize("name", CASES)
def test_fixture_depends_on_its_input(name, fixture_model, tmp_path):
    make, inputs = CASES[name]
    problems = check(make(fixture_model, tmp_path), inputs())
    assert not problems, f"{name}: {len(problems)} problems, first: " + "; ".join(problems[:5])


def test_a_fixture_that_ignores_its_input_fails(tmp_path):
    """The check itself: MobileNetV2 as the fixture once was (PyTorch's default init, BatchNorm statistics
    drawn at random instead of measured) is caught, at its output and at the layers where its signal
    fades."""
    import torch

    from fixtures.models import SEED, MobileNetV2
    torch.manual_seed(SEED)
    model = MobileNetV2().eval()
    g = torch.Generator().manual_seed(SEED)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) * 0.5 + 0.75)
    path = tmp_path / "faded.onnx"
    with torch.no_grad():
        torch.onnx.export(model, (torch.randn(1, 3, 96, 96),), str(path), input_names=["input"],
                          output_names=["output"], opset_version=17, dynamo=False)
    problems = check(path, _images("input", (1, 3, 96, 96)))
    assert any(p.startswith("output output: relative difference") for p in problems), problems
    assert sum("between zeros and N(0,1)" in p for p in problems) > 20, problems


def _spread(outputs: dict) -> float:
    keys = list(outputs)
    return min(_rel(outputs[a], outputs[b]) for i, a in enumerate(keys) for b in keys[i + 1:])


@pytest.mark.parametrize("name", ["mobilenetv2", "resnet"])
def test_keras_fixture_depends_on_its_input(name):
    """The Keras fixtures (fixtures/tf_models.py), judged in TensorFlow, their own framework: outputs only
    (the per-layer check above needs an ONNX graph). Keras MobileNetV2 with random batch-norm statistics
    gave 4e-8; measured, 0.41."""
    pytest.importorskip("tensorflow")
    import tensorflow as tf

    from fixtures.tf_models import build
    from tests.conftest import CACHE
    path = build(name, CACHE)
    if name == "mobilenetv2":
        import keras
        model = keras.models.load_model(str(path))
        run, shape = (lambda x: model(x, training=False).numpy()), (1, 3, 224, 224)
    else:
        loaded = tf.saved_model.load(str(path))
        run, shape = (lambda x: loaded.serve(tf.constant(x)).numpy()), (1, 3, 96, 96)
    outputs = {k: run(np.ascontiguousarray(v.transpose(0, 2, 3, 1))) for k, v in float_inputs(shape).items()}
    assert _spread(outputs) >= MIN_OUTPUT_SPREAD, {k: v.ravel()[:4] for k, v in outputs.items()}


@pytest.mark.parametrize("name", ["mobilenetv2", "resnet18"])
def test_caffe_fixture_depends_on_its_input(name):
    """The Caffe fixtures (fixtures/caffe_models.py), judged in OpenCV's Caffe importer (the reference
    tests/frontends/test_caffe.py uses): outputs only. With drawn batch-norm statistics the Caffe
    MobileNetV2's softmax was the same one-hot vector for every input (difference 0); measured, 0.39."""
    cv2 = pytest.importorskip("cv2")

    from fixtures.caffe_models import build
    from tests.conftest import CACHE
    proto = build(name, CACHE)
    net = cv2.dnn.readNetFromCaffe(str(proto), str(proto.with_suffix(".caffemodel")))
    outputs = {}
    for key, x in float_inputs((1, 3, 224, 224)).items():
        net.setInput(x)
        outputs[key] = net.forward().copy()
    assert _spread(outputs) >= MIN_OUTPUT_SPREAD, {k: v.ravel()[:4] for k, v in outputs.items()}
