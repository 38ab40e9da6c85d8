"""`mnntool debug reduce`: cut an ONNX model down to a small sub-graph that still fails, to attach to a
bug report (Polygraphy's `debug reduce`, for mnntool).

Why this shape. A model that converts wrongly usually does so because of one node; finding it by hand in
hundreds is slow. The source model is run once in onnxruntime with every tensor exposed (inputs drawn
with a seed, or given), so any cut has its inputs fed with the source's own values and its outputs
judged against the source's own values: no candidate needs onnxruntime again. Then, as delta debugging
does over a graph in topological order:
1. the shortest failing prefix (bisection; the prefix's outputs are every tensor it hands on) names the
   first failing node; its outputs alone become the outputs when they still fail;
2. the front is cut (bisection on the first kept node; the tensors that cross the cut become inputs);
3. each remaining node is tried away in turn (its outputs become inputs), kept away when it still fails.
The failure is one of: the command of `--check` exits non-zero on the candidate file; mnntool's converter
refuses it with the same message as the whole model (`convert`); or, converted, it runs in mnntool's
runtime (`numba`) or MNN's (`mnn`) with an output below `--min-cosine` (or above `--max-abs`) against
the source's values (`mismatch`). Bisection assumes that a failing cut stays failing as it grows; where
that does not hold the result is still a failing model, only perhaps not the smallest.
"""
from __future__ import annotations

import shlex
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from .errors import MnnToolError

CRITERIA = ("mismatch", "convert", "check")


class Subgraph:
    """The source graph's nodes (topological order, as ONNX requires) and what each reads and writes."""

    def __init__(self, model):
        self.model = model
        g = model.graph
        self.nodes = list(g.node)
        self.initializers = {t.name: t for t in g.initializer}
        self.reads = [_reads(n) for n in self.nodes]
        self.writes = [[o for o in n.output if o] for n in self.nodes]
        self.producer = {o: k for k, outs in enumerate(self.writes) for o in outs}
        self.outputs = [o.name for o in g.output]

    def frontier(self, kept: set) -> list:
        """The tensors the kept nodes hand on: read by a node not kept, a graph output, or read by none."""
        read_elsewhere = {t for k, r in enumerate(self.reads) if k not in kept for t in r}
        read_inside = {t for k in kept for t in self.reads[k]}
        out = []
        for k in sorted(kept):
            for t in self.writes[k]:
                if t in read_elsewhere or t in self.outputs or t not in read_inside:
                    out.append(t)
        return out

    def live(self, kept: set, outputs: list) -> set:
        """The kept nodes the outputs depend on (through kept nodes only)."""
        need, live = set(outputs), set()
        for k in sorted(kept, reverse=True):
            if any(t in need for t in self.writes[k]):
                live.add(k)
                need.update(self.reads[k])
        return live

    def inputs_of(self, kept: set) -> list:
        """Tensors the kept nodes read that none of them writes and no initializer holds, in first-read order."""
        made = {t for k in kept for t in self.writes[k]}
        seen, out = set(), []
        for k in sorted(kept):
            for t in self.reads[k]:
                if t and t not in made and t not in self.initializers and t not in seen:
                    seen.add(t)
                    out.append(t)
        return out


def _reads(node) -> list:
    """A node's inputs, with the outer-scope names its If/Loop/Scan bodies read."""
    out = [i for i in node.input if i]
    for attr in node.attribute:
        for body in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
            inner = {i.name for i in body.input} | {t.name for t in body.initializer}
            for n in body.node:
                out += [t for t in _reads(n) if t not in inner and t not in out]
                inner.update(n.output)
    return out


def _value_info(name: str, value: np.ndarray):
    from onnx import helper
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape))


def build(sub: Subgraph, kept: set, outputs: list, values: dict):
    """The candidate as an ONNX model: the live kept nodes, their cut inputs typed from the source's values."""
    from onnx import helper
    live = sub.live(kept, outputs)
    inputs = sub.inputs_of(live)
    used = {t for k in live for t in sub.reads[k]}
    g = helper.make_graph([sub.nodes[k] for k in sorted(live)], sub.model.graph.name or "reduced",
                          [_value_info(t, values[t]) for t in inputs],
                          [_value_info(t, values[t]) for t in outputs],
                          [sub.initializers[t] for t in sub.initializers if t in used])
    m = helper.make_model(g, opset_imports=list(sub.model.opset_import), producer_name="mnntool debug reduce")
    m.ir_version = sub.model.ir_version
    for f in sub.model.functions:
        m.functions.append(f)
    return m, live, inputs


def source_values(model, feeds: dict) -> dict:
    """Every tensor of the model as onnxruntime computes it for these feeds (and the feeds)."""
    import onnx
    import onnxruntime as ort
    wide = onnx.ModelProto()
    wide.CopyFrom(model)
    names = [o for n in wide.graph.node for o in n.output if o]
    del wide.graph.output[:]
    wide.graph.output.extend(onnx.ValueInfoProto(name=n) for n in dict.fromkeys(names))
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL    # every tensor as the graph says
    opts.log_severity_level = 3
    try:
        sess = ort.InferenceSession(wide.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        outs = sess.run(None, feeds)
    except Exception as e:      # noqa: BLE001 - onnxruntime's errors are many; one line says which
        raise MnnToolError(f"onnxruntime cannot run the source model ({type(e).__name__}: "
                           f"{' '.join(str(e).split())[:200]})") from None
    values = dict(feeds)
    for o, v in zip([o.name for o in sess.get_outputs()], outs):
        if isinstance(v, np.ndarray):
            values[o] = v
    return values


def random_feeds(model, shapes: dict, seed: int) -> dict:
    """N(0,1) floats, integers uniform in [0, 100), bools at random; open dims from `shapes` or 1."""
    from onnx import helper
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for inp in model.graph.input:
        if inp.name in inits:
            continue
        t = inp.type.tensor_type
        dims = shapes.get(inp.name) or tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1
                                             for d in t.shape.dim)
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type))
        if dtype.kind == "f":
            feeds[inp.name] = rng.standard_normal(dims).astype(dtype)
        elif dtype.kind == "b":
            feeds[inp.name] = rng.integers(0, 2, dims).astype(bool)
        else:
            feeds[inp.name] = rng.integers(0, 100, dims).astype(dtype)
    return feeds


class Judge:
    """Whether a candidate shows the failure; each answer cached by (nodes, outputs)."""

    def __init__(self, criterion: str, values: dict, workdir: Path, backend: str = "numba",
                 min_cosine: float = 0.999, max_abs: float | None = None, check: str | None = None,
                 timeout: float = 600):
        self.criterion, self.values, self.dir = criterion, values, workdir
        self.backend, self.min_cosine, self.max_abs, self.check = backend, min_cosine, max_abs, check
        self.timeout = timeout
        self.cache: dict = {}
        self.signature: str | None = None       # the whole model's refusal (convert)
        self.tries = 0
        self.last_detail = ""

    def __call__(self, sub: Subgraph, kept: set, outputs: list) -> bool:
        if not outputs:
            return False
        model, live, inputs = build(sub, kept, outputs, self.values)
        key = (frozenset(live), tuple(outputs))
        if key not in self.cache:
            self.tries += 1
            path = self.dir / f"candidate_{self.tries}.onnx"
            import onnx
            onnx.save(model, str(path))
            self.cache[key] = self._fails(path, inputs, outputs)
            path.unlink(missing_ok=True)
        return self.cache[key]

    def _fails(self, path: Path, inputs: list, outputs: list) -> bool:
        if self.criterion == "check":
            cmd = self.check.replace("{}", shlex.quote(str(path)))
            try:
                p = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=self.timeout)
            except subprocess.TimeoutExpired:
                return False
            return p.returncode != 0
        from . import api
        mnn = path.with_suffix(".mnn")
        try:
            api.convert(str(path), str(mnn))
        except MnnToolError as e:
            said = str(e).replace(str(path), "MODEL")
            if self.criterion == "convert":
                if self.signature is None:
                    self.signature = said
                return said == self.signature
            return False
        if self.criterion == "convert":
            mnn.unlink(missing_ok=True)
            return False
        try:
            return self._mismatch(mnn, inputs, outputs)
        finally:
            mnn.unlink(missing_ok=True)
            Path(str(mnn) + ".weight").unlink(missing_ok=True)

    def _mismatch(self, mnn: Path, inputs: list, outputs: list) -> bool:
        from .compare import metrics
        from .runners import backend_runner
        try:
            got = backend_runner(mnn, self.backend, 1).run({t: self.values[t] for t in inputs})
        except MnnToolError:
            return False
        for name in outputs:
            if name not in got:
                return False
            m = metrics(self.values[name], got[name])
            if m["cosine"] < self.min_cosine or (self.max_abs is not None and m["max_abs"] > self.max_abs):
                self.last_detail = f"{name}: cosine {m['cosine']:.6f}, max abs {m['max_abs']:.3g}"
                return True
        return False


def reduce_graph(sub: Subgraph, fails, progress=None) -> tuple[set, list]:
    """(kept node indices, outputs) of a small cut that still fails; `fails(sub, kept, outputs)`."""
    n = len(sub.nodes)
    step = progress or (lambda: None)
    # 1. the shortest failing prefix: its last node is the first that fails
    lo, hi = 0, n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        step()
        if fails(sub, set(range(mid)), sub.frontier(set(range(mid)))):
            hi = mid
        else:
            lo = mid
    kept = set(range(hi))
    outputs = sub.frontier(kept)
    step()
    if fails(sub, kept, sub.writes[hi - 1]):
        outputs = list(sub.writes[hi - 1])
    kept = sub.live(kept, outputs)
    # 2. cut the front: the latest first node that still fails
    order = sorted(kept)
    lo, hi = 0, len(order) - 1      # order[lo:] fails; find the largest such lo
    while hi > lo:
        mid = (lo + hi + 1) // 2
        step()
        if fails(sub, set(order[mid:]), outputs):
            lo = mid
        else:
            hi = mid - 1
    kept = sub.live(set(order[lo:]), outputs)
    # 3. each remaining node away in turn (the nodes that write the outputs stay)
    for k in sorted(kept, reverse=True):
        if k in kept and not any(t in outputs for t in sub.writes[k]):
            step()
            trial = sub.live(kept - {k}, outputs)
            if fails(sub, trial, outputs):
                kept = trial
    return kept, outputs


def reduce(model_path, out_path, criterion: str = "mismatch", check: str | None = None, backend: str = "numba",
           min_cosine: float = 0.999, max_abs: float | None = None, input_shapes: dict | None = None,
           seed: int = 0, feeds: dict | None = None, save_inputs: bool = False, progress=None,
           input_specs: list | None = None) -> dict:
    """Reduce the ONNX model at `model_path` to a small model that still fails (see the module's
    docstring); writes it to `out_path` (and with `save_inputs`, the source's values of its inputs to
    OUT.inputs.npz); returns the report. The source runs on `feeds` and the `--input` files of
    `input_specs` (NAME=file.npy, or a .npz of inputs by name); inputs given by neither are drawn."""
    import onnx

    from .format.writer import atomic_write, check_output
    from .frontends.onnx import read_model
    t0 = time.perf_counter()
    model_path, out_path = Path(model_path), Path(out_path)
    if criterion not in CRITERIA:
        raise MnnToolError(f"--fails {criterion}: expected one of {', '.join(CRITERIA[:2])}")
    if criterion == "check" and (not check or "{}" not in check):
        raise MnnToolError("--check needs a command with {} where the candidate model's path goes")
    if not 0.0 <= min_cosine <= 1.0:
        raise MnnToolError(f"--min-cosine must be in [0, 1], got {min_cosine}")
    if out_path.suffix.lower() != ".onnx":
        raise MnnToolError(f"{out_path}: the reduced model is an ONNX file; give a name ending in .onnx")
    check_output(out_path, [model_path])
    inputs_path = out_path.with_suffix(".inputs.npz")
    if save_inputs:
        check_output(inputs_path, [model_path])
    read_model(model_path)          # mnntool's own checks first: one line for a file that is not ONNX
    try:
        model = onnx.load(str(model_path))      # external data included: onnxruntime runs it from memory
    except Exception as e:      # noqa: BLE001 - protobuf and file errors alike
        raise MnnToolError(f"{model_path}: cannot read it ({type(e).__name__}: "
                           f"{' '.join(str(e).split())[:160]})") from None
    if not model.graph.node:
        raise MnnToolError(f"{model_path}: not a valid ONNX model (no graph nodes)")
    given = dict(feeds or {})
    if input_specs:
        from .inputs import input_files, load_feeds
        from .ir.graph import Graph
        for f in input_files(input_specs):
            check_output(out_path, [model_path, f])       # an input file is never the output either
        inits = {t.name for t in model.graph.initializer}
        names = [i.name for i in model.graph.input if i.name not in inits]
        given.update(load_feeds(input_specs, Graph(inputs=names)))
    shapes = {**(input_shapes or {}), **{k: tuple(v.shape) for k, v in given.items()}}
    feeds = {**random_feeds(model, shapes, seed), **given}
    values = source_values(model, feeds)
    sub = Subgraph(model)
    with tempfile.TemporaryDirectory(prefix="mnntool_reduce_") as tmp:
        judge = Judge(criterion, values, Path(tmp), backend, min_cosine, max_abs, check)
        everything = set(range(len(sub.nodes)))
        if not judge(sub, everything, sub.outputs):
            what = {"check": f"`{check}` exits 0 on it", "convert": "mnntool converts it",
                    "mismatch": f"its outputs reach cosine >= {min_cosine} in {backend}"}[criterion]
            raise MnnToolError(f"{model_path}: the model does not fail ({what}); nothing to reduce")
        kept, outputs = reduce_graph(sub, judge, progress)
        reduced, live, inputs = build(sub, kept, outputs, values)
        judge(sub, live, outputs)       # the saved model's own figures (cached when already tried)
        detail = judge.last_detail if criterion == "mismatch" else ""
    atomic_write(out_path, reduced.SerializeToString(), [model_path])
    if save_inputs:
        import io
        buf = io.BytesIO()
        np.savez(buf, **{t: values[t] for t in inputs})
        atomic_write(inputs_path, buf.getvalue(), [model_path])
    ops: dict = {}
    for k in sorted(live):
        ops[sub.nodes[k].op_type] = ops.get(sub.nodes[k].op_type, 0) + 1
    return {"model": str(model_path), "out": str(out_path), "criterion": criterion,
            "check": check, "backend": backend if criterion == "mismatch" else None,
            "nodes_before": len(sub.nodes), "nodes_after": len(live), "op_types": ops,
            "nodes": [sub.nodes[k].name or sub.nodes[k].output[0] for k in sorted(live)],
            "inputs": inputs, "outputs": outputs, "detail": detail, "candidates_tried": judge.tries,
            "inputs_file": str(inputs_path) if save_inputs else None, "seed": seed,
            "fed": {"files": list(input_specs or []), "given": sorted(given), "random": sorted(set(feeds) - set(given))},
            "seconds": round(time.perf_counter() - t0, 2)}


def summary(r: dict) -> str:
    """The one line the CLI prints."""
    ops = ", ".join(f"{op} x{n}" if n > 1 else op for op, n in r["op_types"].items())
    why = f" ({r['detail']})" if r["detail"] else ""
    return (f"reduced {r['model']} from {r['nodes_before']} to {r['nodes_after']} node(s) [{ops}] that still fail "
            f"{r['criterion']}{why}: {r['out']}")

