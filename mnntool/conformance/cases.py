"""The node test cases of the installed onnx package, written to disk once, and how outputs are judged."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np

# Domains an inference runtime implements; training ops and ai.onnx.ml are out of scope.
DOMAINS = {"", "ai.onnx"}


def _tensor_io(model) -> bool:
    """Only tensor inputs and outputs: sequences and optionals are not something a .mnn can carry."""
    for vi in list(model.graph.input) + list(model.graph.output):
        if vi.type.WhichOneof("value") != "tensor_type":
            return False
    return True


def applicable(case) -> bool:
    model = case.model
    if model is None:
        return False
    if any(n.domain not in DOMAINS for n in model.graph.node):
        return False
    if any(op.domain not in DOMAINS and op.domain != "ai.onnx.preview.training"
           for op in model.opset_import) and any(n.domain for n in model.graph.node):
        return False
    return _tensor_io(model) and bool(case.data_sets)


def group_of(name: str, model) -> str:
    """The op a node test exercises (its first node of the default domain); 'expanded' tests and
    function bodies count under the op they expand."""
    ops = [n.op_type for n in model.graph.node]
    return ops[0] if len(ops) == 1 else ("expanded" if "expanded" in name else (ops[0] if ops else "?"))


def as_array(v) -> np.ndarray:
    """A data set's tensor as a numpy array numpy can save: TensorProtos decoded; bfloat16, float8 and
    float4 (ml_dtypes) carried as float32, int4/uint4 as int8/uint8 (MNN has none of these types)."""
    import onnx
    if isinstance(v, onnx.TensorProto):
        from onnx import numpy_helper
        v = numpy_helper.to_array(v)
    a = np.asarray(v)
    if a.dtype.kind == "V" or a.dtype.name in ("bfloat16",) or "float8" in a.dtype.name or "float4" in a.dtype.name:
        return a.astype(np.float32)
    if a.dtype.name in ("int4", "int2"):
        return a.astype(np.int8)
    if a.dtype.name in ("uint4", "uint2"):
        return a.astype(np.uint8)
    return a


def materialize(root: Path, only: list[str] | None = None) -> list[dict]:
    """Write every applicable node case under root/<name>/ (once) and return their index entries."""
    root = Path(root)
    index_file = root / "index.json"
    if index_file.exists() and only is None:
        return json.loads(index_file.read_text())
    import onnx
    from onnx.backend.test.case.node import collect_testcases
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases()
    entries = []
    for case in cases:
        if only is not None and case.name not in only:
            continue
        if not applicable(case):
            continue
        d = root / case.name
        d.mkdir(parents=True, exist_ok=True)
        onnx.save(case.model, str(d / "model.onnx"))
        for k, (ins, outs) in enumerate(case.data_sets):
            names_in = [i.name for i in case.model.graph.input]
            names_out = [o.name for o in case.model.graph.output]
            np.savez(d / f"data_{k}.npz", **{f"in:{n}": as_array(v) for n, v in zip(names_in, ins)},
                     **{f"out:{n}": as_array(v) for n, v in zip(names_out, outs)})
        entries.append({"name": case.name, "op": group_of(case.name, case.model),
                        "opset": max((o.version for o in case.model.opset_import if o.domain in DOMAINS), default=0),
                        "data_sets": len(case.data_sets), "rtol": case.rtol, "atol": case.atol})
    if only is None:
        index_file.write_text(json.dumps(entries, indent=0))
    return entries


MODEL_GROUPS = ("light", "pytorch-converted", "pytorch-operator", "simple")


def _light_input(vi) -> np.ndarray:
    """The input onnx's own runner feeds the 'light' models (arange / n in the input's shape)."""
    shape = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in vi.type.tensor_type.shape.dim)
    n = int(np.prod(shape))
    return (np.arange(n).reshape(shape) / n).astype(np.float32)


def materialize_models(root: Path) -> list[dict]:
    """The stored model groups of the onnx package (the nine 'light' CNNs and the pytorch-converted,
    pytorch-operator and simple models), written like node cases as root/<group>__<name>/."""
    import onnx
    from onnx import numpy_helper
    data = Path(onnx.__file__).parent / "backend" / "test" / "data"
    entries = []
    for group in MODEL_GROUPS:
        gdir = data / group
        if not gdir.is_dir():
            continue
        items = sorted(gdir.glob("*.onnx")) if group == "light" else sorted(p for p in gdir.iterdir() if p.is_dir())
        for item in items:
            name = f"{group}__{item.stem if group == 'light' else item.name}"
            d = Path(root) / name
            model_path = item if group == "light" else item / "model.onnx"
            try:
                model = onnx.load(str(model_path))
            except Exception:  # noqa: BLE001
                continue
            init = {i.name for i in model.graph.initializer}
            ins = [i for i in model.graph.input if i.name not in init]
            outs = [o.name for o in model.graph.output]
            sets = []
            if group == "light":
                exp = [numpy_helper.to_array(onnx.load_tensor(str(item.with_name(f"{item.stem}_output_{k}.pb"))))
                       for k in range(len(outs))]
                sets.append(([_light_input(i) for i in ins], exp))
            else:
                for ds in sorted(item.glob("test_data_set_*")):
                    xs = [numpy_helper.to_array(onnx.load_tensor(str(ds / f"input_{k}.pb"))) for k in range(len(ins))]
                    ys = [numpy_helper.to_array(onnx.load_tensor(str(ds / f"output_{k}.pb"))) for k in range(len(outs))]
                    sets.append((xs, ys))
            if not sets or not _tensor_io(model):
                continue
            d.mkdir(parents=True, exist_ok=True)
            onnx.save(model, str(d / "model.onnx"))
            for k, (xs, ys) in enumerate(sets):
                np.savez(d / f"data_{k}.npz", **{f"in:{i.name}": as_array(v) for i, v in zip(ins, xs)},
                         **{f"out:{n}": as_array(v) for n, v in zip(outs, ys)})
            entries.append({"name": name, "op": group, "group": group, "data_sets": len(sets)})
    return entries


def tolerance(expected: np.ndarray) -> tuple[float, float]:
    """allclose(rtol, atol) for float outputs: rtol 1e-3, atol 1e-4 x max(1, max|expected|) (the
    float32 rounding of a runtime that sums in another order); integers and booleans must be exact."""
    finite = np.abs(expected[np.isfinite(expected)]) if expected.size else np.zeros(1)
    scale = max(1.0, float(finite.max()) if finite.size else 1.0)
    return 1e-3, 1e-4 * scale


def judge(expected: np.ndarray, got: np.ndarray) -> str | None:
    """None when `got` matches `expected`, else a short reason."""
    expected, got = np.asarray(expected), np.asarray(got)
    if expected.shape != got.shape:
        if expected.size == got.size and expected.size <= 1 and expected.ndim + got.ndim <= 1:
            got = got.reshape(expected.shape)    # a scalar carried as [1] (MNN has no rank-0 Input)
        else:
            return f"shape {list(got.shape)} != expected {list(expected.shape)}"
    if expected.dtype.kind in "iub" or expected.dtype == object:
        if expected.dtype == object:
            return "string output"
        if got.dtype.kind == "f" and not np.all(np.isfinite(got)):
            return "non-finite value for an integer output"
        ok = np.array_equal(expected.astype(np.int64), np.asarray(got).astype(np.int64))
        return None if ok else "integer values differ"
    exp = expected.astype(np.float64)
    g = got.astype(np.float64)
    rtol, atol = tolerance(exp)
    if np.allclose(g, exp, rtol=rtol, atol=atol, equal_nan=True):
        return None
    bad = ~np.isclose(g, exp, rtol=rtol, atol=atol, equal_nan=True)
    return f"values differ at {int(bad.sum())}/{bad.size} (max abs {float(np.nanmax(np.abs(g - exp)[bad])):.3g})"


def feeds_of(data: dict) -> tuple[dict, dict]:
    ins = {k[3:]: v for k, v in data.items() if k.startswith("in:")}
    outs = {k[4:]: v for k, v in data.items() if k.startswith("out:")}
    return ins, outs
