"""Compare a .mnn file's outputs with its source model's (final outputs, real MNN runtime)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .compare import metrics
from .errors import MnnToolError
from .format import reader


def random_inputs(sess, shapes: dict | None = None, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs for an onnxruntime session: normal floats, small non-negative ints for ids."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for i in sess.get_inputs():
        shape = (shapes or {}).get(i.name) or [d if isinstance(d, int) else 1 for d in i.shape]
        if "int" in i.type:
            feeds[i.name] = rng.integers(0, 100, size=shape).astype(np.int64 if "64" in i.type else np.int32)
        else:
            feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def verify_outputs(source, model, shapes: dict | None = None, feeds: dict | None = None,
                   min_cosine: float = 0.999, max_abs: float | None = None) -> dict:
    import onnxruntime as ort

    from .runtime.mnn_backend import MnnSession
    source, model = Path(source), Path(model)
    if source.suffix.lower() != ".onnx":
        raise MnnToolError(f"{source}: verify takes an ONNX source for now")
    try:
        sess = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"])
    except Exception as e:
        raise MnnToolError(f"{source}: onnxruntime cannot load it ({str(e)[:120]})") from None
    g = reader.load(model)
    feeds = feeds or random_inputs(sess, shapes)
    ref = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    got = MnnSession(str(model), g.inputs, g.outputs).run(feeds)
    outputs, ok = [], True
    for name in g.outputs:
        if name not in ref:
            raise MnnToolError(f"{model}: output '{name}' is not an output of {source}")
        m = metrics(ref[name], got[name].reshape(ref[name].shape) if got[name].size == ref[name].size else got[name])
        m["name"] = name
        m["pass"] = m["cosine"] >= min_cosine and (max_abs is None or m["max_abs"] <= max_abs)
        ok &= m["pass"]
        outputs.append(m)
    return {"source": str(source), "model": str(model), "backend": "mnn", "outputs": outputs, "pass": ok}
