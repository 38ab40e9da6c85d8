"""Shape inference at the plan's input shapes; every tensor checked against the size limit. A graph
whose output shapes depend on values known only at run time (a Reshape to a computed shape, NonZero)
is planned no further: it runs op by op (Session._run_eager)."""
from __future__ import annotations

import numpy as np

from ...errors import InvalidModel
from ...ir.ops import Val
from ...ir.shape_inference import infer_values
from ...ir.validate import MAX_TENSOR_BYTES
from .state import Planning

OPTIONAL = False


def check_size(name: str, v: Val) -> None:
    if v.shape is None or not all(isinstance(d, int) for d in v.shape):
        return
    size = 1
    for d in v.shape:
        size *= max(d, 0)
    nbytes = size * (np.dtype(v.dtype).itemsize if v.dtype else 4)
    if nbytes > MAX_TENSOR_BYTES:
        raise InvalidModel(f"tensor '{name}' would have shape {list(v.shape)} ({nbytes / 2**30:.1f} GB): "
                           "the model's shapes are corrupt or the input shape is far too large")


def run(p: Planning) -> None:
    g = p.graph
    # the Vals only: the graph's tensor facts are the session's, shared by its plans (Session._shaped)
    vals = infer_values(g)
    eager = False
    for n in g.nodes:
        for o in n.outputs:
            v = vals.get(o) if o else None
            if o and (v is None or v.shape is None or not all(isinstance(d, int) for d in v.shape)):
                eager = True
            elif o:
                check_size(o, v)
    for name in g.inputs:
        check_size(name, vals[name])
    p.vals, p.nodes = vals, list(g.nodes)
    for name in list(g.inputs) + list(g.constants):
        p.slot(name)
    p.eager = eager
