"""A child process that runs conformance cases one at a time: a JSON request a line on stdin, a JSON
result a line on the protocol pipe (stdout is redirected to stderr so that runtime banners cannot
corrupt it). `python -m mnntool.conformance.worker mnntool|mnn`."""
from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

import numpy as np

from .cases import feeds_of, judge


def _cause(e: BaseException) -> str:
    from ..errors import MnnToolError
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    if not isinstance(e, MnnToolError):
        tb = traceback.extract_tb(e.__traceback__)
        where = f"{Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else "?"
        text = f"{type(e).__name__} at {where}: {text}"
    return text[:400]


def _datasets(case: Path):
    for f in sorted(case.glob("data_*.npz")):
        with np.load(f, allow_pickle=True) as z:   # our own case files (string tensors are object arrays)
            yield feeds_of(dict(z))


def _compare(outs_expected: dict, got: dict) -> str | None:
    for name, exp in outs_expected.items():
        if name not in got:
            return f"output '{name}' missing"
        why = judge(exp, got[name])
        if why:
            return f"{name}: {why}"
    return None


def _run_sets(case: Path, run) -> dict:
    """Every data set of the case through `run` (inputs -> outputs by name), judged; the first mismatch
    or error ends it."""
    try:
        for ins, outs in _datasets(case):
            why = _compare(outs, run(ins))
            if why:
                return {"status": "fail", "stage": "compare", "reason": why}
    except Exception as e:  # noqa: BLE001 - every failure is a result here
        return {"status": "fail", "stage": "run", "reason": _cause(e)}
    return {"status": "pass"}


def run_mnntool(case: Path, mnn: Path) -> dict:
    from ..api import convert
    from ..format import reader
    from ..runtime.session import Session
    try:    # the suite checks each op's meaning: GELU in its exact erf form (convert --exact-gelu)
        convert(case / "model.onnx", mnn, exact_gelu=True)
    except Exception as e:  # noqa: BLE001 - every failure is a result here
        return {"status": "fail", "stage": "convert", "reason": _cause(e)}
    try:
        sess = Session(reader.load(mnn))
    except Exception as e:  # noqa: BLE001
        return {"status": "fail", "stage": "run", "reason": _cause(e)}
    return _run_sets(case, sess.run)


def run_mnn(case: Path, mnn: Path) -> dict:
    import onnx

    from ..runtime.mnn_backend import MnnSession
    if not mnn.exists():
        return {"status": "fail", "stage": "convert", "reason": "no .mnn (mnntool's convert failed)"}
    model = onnx.load(str(case / "model.onnx"), load_external_data=False)
    init = {i.name for i in model.graph.initializer}
    inputs = [i.name for i in model.graph.input if i.name not in init]
    outputs = [o.name for o in model.graph.output]
    try:
        sess = MnnSession(str(mnn), inputs, outputs)
    except Exception as e:  # noqa: BLE001
        return {"status": "fail", "stage": "run", "reason": _cause(e)}
    return _run_sets(case, sess.run)


def run_mnn_converter(case: Path, mnn: Path) -> dict:
    """MNN's own converter on the same case (the bar to beat), its JSON dump kept beside the file."""
    from ..mnn_tools import mnnconvert
    own = mnn.with_name(mnn.stem + ".mnnconv.mnn")
    try:
        mnnconvert("-f", "ONNX", "--modelFile", case / "model.onnx", "--MNNModel", own, "--bizCode", "conf")
        if not own.exists():
            raise RuntimeError("MNN's converter wrote no file")
        mnnconvert("-f", "MNN", "--modelFile", own, "--JsonFile", own.with_suffix(".json"))
    except Exception as e:  # noqa: BLE001
        return {"status": "fail", "stage": "convert", "reason": _cause(e)}
    return run_mnn(case, own)


def run_onnxruntime(case: Path, mnn: Path) -> dict:
    """onnxruntime on the source model (the bar the issue sets), inputs as stored."""
    import onnxruntime as ort
    try:
        sess = ort.InferenceSession(str(case / "model.onnx"), providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001
        return {"status": "fail", "stage": "convert", "reason": _cause(e)}
    import onnx
    from onnx import helper
    names = [o.name for o in sess.get_outputs()]
    model = onnx.load(str(case / "model.onnx"))
    types = {i.name: helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type) for i in model.graph.input
             if i.type.tensor_type.elem_type}

    def run(ins):
        feeds = {k: (v.astype(types[k]) if k in types and v.dtype != object else v) for k, v in ins.items()}
        return dict(zip(names, sess.run(None, feeds)))
    return _run_sets(case, run)


MODES = {"mnntool": run_mnntool, "mnn": run_mnn, "mnnconvert": run_mnn_converter, "onnxruntime": run_onnxruntime}


def main(mode: str) -> None:
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    run = MODES[mode]
    for line in sys.stdin:
        req = json.loads(line)
        import warnings
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            res = run(Path(req["case"]), Path(req["mnn"]))
        proto.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
