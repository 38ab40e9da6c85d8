"""Keras applications (random weights, random batch-norm statistics) saved as .keras, converted by mnntool
and run in mnntool's runtime and in MNN, against Keras itself. Prints one row per model: conversion
result, cosine and max abs error in each runtime. `python -m benchmarks.keras_zoo [--json] [name ...]`."""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

MODELS = ["MobileNetV3Small", "EfficientNetB0", "EfficientNetV2B0", "DenseNet121", "ResNet50V2", "Xception",
          "InceptionV3", "NASNetMobile", "ConvNeXtTiny", "VGG16", "InceptionResNetV2", "MobileNetV3Large"]


def _metrics(ref, got):
    ref, got = ref.reshape(-1).astype(np.float64), np.asarray(got).reshape(-1).astype(np.float64)
    cos = float(ref @ got / (np.linalg.norm(ref) * np.linalg.norm(got) + 1e-30))
    return cos, float(np.abs(ref - got).max())


def _random_statistics(model, rng):
    """Batch norms with random statistics (and scale/offset where the layer has them), so that a wrong
    fold shows: the last two weights are the moving mean and variance."""
    import keras
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            ws = layer.get_weights()
            c = ws[-1].shape[0]
            new = [rng.random(c) * 0.5 + 0.75 if k == 0 and len(ws) == 4 else rng.standard_normal(c) * 0.1
                   for k in range(len(ws) - 2)]
            layer.set_weights(new + [rng.standard_normal(c) * 0.1, rng.random(c) * 0.5 + 0.75])


def run_one(name: str, work: Path) -> dict:
    import keras

    import mnntool
    from fixtures.tf_models import SEED
    from mnntool import api
    from mnntool.runtime.mnn_backend import MnnSession
    keras.utils.set_random_seed(SEED)
    kwargs = {"input_shape": (224, 224, 3)} if name != "NASNetMobile" else {}
    m = getattr(keras.applications, name)(weights=None, **kwargs)
    _random_statistics(m, np.random.default_rng(SEED))
    src = work / f"{name}.keras"
    m.save(str(src))
    x = np.random.default_rng(1).uniform(0, 255, (1,) + tuple(m.input.shape[1:])).astype(np.float32)
    ref = m(x, training=False).numpy()
    dst = work / f"{name}.mnn"
    row = {"model": name}
    t = time.perf_counter()
    try:
        api.convert(src, dst)
    except Exception as e:
        return row | {"convert": f"{type(e).__name__}: {str(e)[:200]}"}
    row["convert"] = f"ok {time.perf_counter() - t:.1f}s"
    sess = mnntool.load(dst)
    key, out = sess.graph.inputs[0], sess.graph.outputs[0]
    row["mnntool_cos"], row["mnntool_max_abs"] = _metrics(ref, sess.run({key: x})[out])
    row["mnn_cos"], row["mnn_max_abs"] = _metrics(ref, MnnSession(str(dst), [key], [out]).run({key: x})[out])
    return row


def main(argv):
    as_json = "--json" in argv
    names = [a for a in argv if not a.startswith("--")] or MODELS
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for n in names:
            rows.append(run_one(n, Path(d)))
            if not as_json:
                r = rows[-1]
                print(f"{n:20s} {r['convert'][:60]:60s} " + (
                    f"mnntool cos {r['mnntool_cos']:.6f} max {r['mnntool_max_abs']:.2e}  "
                    f"MNN cos {r['mnn_cos']:.6f} max {r['mnn_max_abs']:.2e}" if "mnn_cos" in r else ""), flush=True)
    if as_json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
