"""Per-channel range equalization of int8 tensors, folded exactly into the weights and float constants
around them.

MNN's int8 activation grids are per tensor (TensorQuantInfo: one scale, one zero point): a tensor whose
channels span very different ranges puts its few wide channels on the grid's range and its many narrow
ones on a handful of steps. Where every layer that writes such a tensor and every layer that reads it can
take a per-channel factor without rounding anything, the tensor is rescaled channel by channel before
calibration (cross-layer equalization, Nagel et al. 2019, restricted to the lossless cases):

- written by a convolution (its rows and bias divided: per-channel int8 weights round the same), through a
  ReLU, or by a float multiply by a constant (a learnable-affine or layer-scale Mul: the constant becomes
  per-channel), or by an add/sub of a constant after one of those;
- read by convolutions (their weight columns multiplied) or float multiplies by a constant, through
  layout conversions.

Where every reader takes the factors exactly (depthwise convolutions: each channel's own per-channel int8
weights; float layers; constants) every channel is brought to the widest one's range. Where an int8
reader mixes channels (a group-1 convolution: its columns share each row's weight scale) the factors
balance the tensor's ranges against that reader's column ranges (factors, ALPHA). The float model
computes the same function up to float rounding. PP-OCRv4's detector (learnable affine blocks around
every convolution, text pages): its stem's grids hold channels of range 10 beside channels of range 130;
cosine vs fp32 in MNN 0.984 -> 0.993 with this and ptq's rounded means (benchmarks/quant_accuracy.py
--ocr), nothing more kept float.
"""
from __future__ import annotations

import numpy as np

from ..ir.graph import Graph
from ..ir.ops import is_convolution

# the one view known to keep the channel axis at 1 whatever its parameters (NCHW <-> NC4HW4); a Reshape or
# Transpose may move it
LAYOUT_CONVERSION = "ConvertTensor"
MIN_FACTOR = 1.0 / 256      # no channel is scaled up more than this (a near-dead channel stays near zero)


def _const_operand(g: Graph, node, channels: int) -> int | None:
    """The index of `node`'s constant operand when it broadcasts per channel over NCHW (one value, or C
    values on axis 1), the other operand not constant."""
    if len(node.inputs) != 2:
        return None
    flags = [i in g.constants for i in node.inputs]
    if flags.count(True) != 1:
        return None
    k = flags.index(True)
    c = np.asarray(g.constants[node.inputs[k]])
    if c.size == 1:
        return k
    dims = [d for d in c.shape]
    while dims and dims[0] == 1 and len(dims) > 3:
        dims.pop(0)
    return k if c.size == channels and tuple(dims) in ((channels, 1, 1),) else None


def _binary(node, *types) -> bool:
    return node.op == "BinaryOp" and (node.param or {}).get("opType") in types


def _private(g: Graph, t: str, node, readers) -> bool:
    """`t` is read by `node` alone and is no graph output: rescaling it changes nothing else."""
    return t not in g.outputs and [r.name for r in readers.get(t, [])] == [node.name]


def _writers(g: Graph, t: str, channels: int, producers, readers) -> list | None:
    """What to divide so that `t` comes out divided channel by channel; None where something can't be."""
    node = producers.get(t)
    if node is None:
        return None
    if node.op in (LAYOUT_CONVERSION, "ReLU"):
        src = node.inputs[0]
        return _writers(g, src, channels, producers, readers) if _private(g, src, node, readers) else None
    if is_convolution(node.op) and node.param.get("weight") is not None and not node.param["common"].get("relu6") \
            and node.param["common"].get("outputCount") == channels and len(node.inputs) == 1:
        return [("rows", node, None)]
    if _binary(node, "MUL"):
        k = _const_operand(g, node, channels)
        return None if k is None else [("const", node, k)]
    if _binary(node, "ADD", "SUB"):
        k = _const_operand(g, node, channels)
        if k is None:
            return None
        src = node.inputs[1 - k]
        before = _writers(g, src, channels, producers, readers) if _private(g, src, node, readers) else None
        return None if before is None else before + [("const", node, k)]
    return None


def _readers(g: Graph, t: str, channels: int, readers, int8: set) -> list | None:
    """What to multiply so that every reader of `t` divided channel by channel computes what it did
    (a convolution's action says whether its weights will be rounded: it is in `int8`)."""
    if t in g.outputs or not readers.get(t):
        return None
    out = []
    for r in readers[t]:
        if r.op == LAYOUT_CONVERSION:
            more = _readers(g, r.outputs[0], channels, readers, int8)
            if more is None:
                return None
            out += more
        elif is_convolution(r.op) and r.inputs[0] == t and len(r.inputs) == 1 and r.param.get("weight") is not None \
                and r.param["common"].get("inputCount") == channels:
            out.append(("cols", r, r.name in int8))
        elif _binary(r, "MUL") and _const_operand(g, r, channels) is not None:
            out.append(("const", r, _const_operand(g, r, channels)))
        else:
            return None
    return out


def plans(g: Graph, tensors, int8: set) -> dict[str, tuple[list, list]]:
    """The tensors among `tensors` that can be rescaled per channel: tensor -> (writers, readers).
    `int8`: the layers that will have int8 weights (a float reader takes any factor exactly)."""
    producers, readers = g.producers(), g.consumers()
    out = {}
    for t in sorted(tensors):
        shape = g.info(t).shape
        if not shape or len(shape) != 4 or not isinstance(shape[1], int) or shape[1] < 2:
            continue
        w = _writers(g, t, shape[1], producers, readers)
        r = _readers(g, t, shape[1], readers, int8) if w is not None else None
        if w is not None and r is not None:
            out[t] = (w, r)
    return out


# The balance against an int8 reader's weight columns: divisor ~ range^ALPHA / column_max^(1-ALPHA), 0.5
# being cross-layer equalization's own (both sides' relative ranges made equal). On PP-OCRv4's detector
# 0.6-0.75 measured more accurate (0.9929-0.9915 against 0.9904 before the float-reader rule) but let a
# rounding tie of mnntool's int8 GEMM epilogue fall otherwise than MNN's (agreement 0.9997 on one page).
ALPHA = 0.5


def factors(channel_max: np.ndarray, weight_max: np.ndarray | None = None) -> np.ndarray:
    """Each channel's divisor: its range over the widest channel's, so every channel spans the widest's;
    with `weight_max` (the mixing int8 readers' per-channel column maxima) the balance ALPHA gives."""
    m = np.asarray(channel_max, np.float64)
    if weight_max is not None and np.all(weight_max > 0):
        m = m ** ALPHA / weight_max ** (1 - ALPHA)
    top = float(m.max()) if m.size else 0.0
    if top <= 0:
        return np.ones_like(m)
    return np.clip(m / top, MIN_FACTOR, 1.0)


def _scale_const(g: Graph, node, k: int, f: np.ndarray) -> None:
    c = np.asarray(g.constants[node.inputs[k]], np.float64)
    v = (c.reshape(-1) if c.size > 1 else np.full(f.size, float(c.reshape(-1)[0]))) * f
    node.inputs[k] = g.add_const(node.inputs[k] + "_eq", v.astype(np.float32).reshape(1, -1, 1, 1))


def _apply(g: Graph, action, f: np.ndarray) -> None:
    """Multiply what `action` names by f per channel (f = 1/k for writers, k for readers)."""
    kind, node, k = action
    if kind == "const":
        _scale_const(g, node, k, f)
        return
    p = node.param
    cout = p["common"]["outputCount"]
    w = np.asarray(p["weight"], np.float64).reshape(cout, -1)
    if kind == "rows":
        p["weight"] = (w * f[:, None]).astype(np.float32).reshape(-1)
        if p.get("bias") is not None:
            p["bias"] = (np.asarray(p["bias"], np.float64) * f).astype(np.float32)
    else:
        p["weight"] = (w.reshape(cout, -1, _taps(p)) * f[_columns(p)][:, :, None]).astype(np.float32).reshape(-1)


def _taps(p) -> int:
    return p["common"].get("kernelX", 1) * p["common"].get("kernelY", 1)


def _columns(p) -> np.ndarray:
    """(O, I/group): the input channel each weight column of a convolution reads."""
    c = p["common"]
    cout, cin, group = c["outputCount"], c["inputCount"], c.get("group", 1) or 1
    per = cin // group
    return (np.arange(cout)[:, None] // (cout // group)) * per + np.arange(per)[None, :]


def mixes(action) -> bool:
    """An int8 reader whose weight rows mix channels: scaling its columns moves rounding into its weights."""
    kind, node, rounded = action
    return kind == "cols" and rounded and \
        node.param["common"]["inputCount"] // (node.param["common"].get("group", 1) or 1) > 1


def column_max(actions, channels: int) -> np.ndarray:
    """Per input channel, the largest |weight| the mixing readers apply to it."""
    out = np.zeros(channels)
    for kind, node, _ in actions:
        if mixes((kind, node, True)):
            p = node.param
            w = np.abs(np.asarray(p["weight"], np.float64).reshape(p["common"]["outputCount"], -1, _taps(p))).max(-1)
            np.maximum.at(out, _columns(p).ravel(), w.ravel())
    return out


def divisors(g: Graph) -> dict[str, np.ndarray]:
    """tensor -> the per-channel divisors its convolution's output was rescaled by (equalize): what a
    per-layer comparison with the original model divides that model's tensor by first."""
    return getattr(g, "channel_divisors", {})


def equalize(g: Graph, plan: dict, channel_max: dict) -> int:
    """Rescale each planned tensor by its factors (channel_max: tensor -> per-channel max |x|); returns
    how many were rescaled. Constants no node reads any more are dropped; the divisors of the convolution
    outputs rescaled are kept on the graph (divisors)."""
    done, replaced, changed = 0, set(), []
    scaled = dict(divisors(g))
    producers = g.producers()
    for t, (writers, readers) in plan.items():
        lossy = [a for a in readers if mixes(a)]
        k = factors(channel_max[t], column_max(lossy, channel_max[t].size) if lossy else None)
        if np.all(k == 1.0):
            continue
        changed += _chain(g, t, producers)
        for f, actions in ((1.0 / k, writers), (k, readers)):
            for a in actions:
                if a[0] == "const":
                    replaced.add(a[1].inputs[a[2]])
                elif a[0] == "rows":
                    out = a[1].outputs[0]
                    scaled[out] = scaled.get(out, 1.0) / f
                _apply(g, a, f)
        done += 1
    g.channel_divisors = _renamed(g, changed, scaled)
    used = {i for n in g.nodes for i in n.inputs}
    for name in [c for c in replaced if c not in used and c not in g.outputs]:
        del g.constants[name]
        g.tensors.pop(name, None)
    return done


def _chain(g: Graph, t: str, producers) -> list[str]:
    """`t` and the tensors between it and its writers (through ReLU, ConvertTensor, constant Add/Sub):
    every tensor whose values the rescaling divides."""
    out, node = [t], producers.get(t)
    while node is not None:
        if node.op in (LAYOUT_CONVERSION, "ReLU"):
            src = node.inputs[0]
        elif _binary(node, "ADD", "SUB") and _const_operand(g, node, g.info(t).shape[1]) is not None:
            src = node.inputs[1 - _const_operand(g, node, g.info(t).shape[1])]
        else:
            break
        out.append(src)
        node = producers.get(src)
    return out


EQUALIZED = "/equalized"


def _renamed(g: Graph, changed: list, scaled: dict) -> dict:
    """Rescaled tensors take new names: they no longer hold the source model's values, so `verify`
    (which pairs tensors by name) leaves them unpaired instead of failing them; the report pairs them
    through `equalized_from`. Returns `scaled` under the new names."""
    names = {t: t + EQUALIZED for t in dict.fromkeys(changed) if t not in g.outputs and t not in g.inputs
             and not t.endswith(EQUALIZED)}
    if not names:
        return scaled
    for n in g.nodes:
        n.inputs = [names.get(i, i) for i in n.inputs]
        n.outputs = [names.get(o, o) for o in n.outputs]
    for old, new in names.items():
        if old in g.tensors:
            g.tensors[new] = g.tensors.pop(old)
            if hasattr(g.tensors[new], "name"):
                g.tensors[new].name = new
    origin = dict(getattr(g, "equalized_from", {}))
    origin.update({new: origin.get(old, old) for old, new in names.items()})
    g.equalized_from = origin
    return {names.get(k, k): d for k, d in scaled.items()}


def original_name(g: Graph, t: str) -> str:
    """The source model's name of a tensor equalization renamed (else `t`)."""
    return getattr(g, "equalized_from", {}).get(t, t)


class ChannelMax:
    """Per-channel max |x| of tensors over samples; merges exactly (a max), for sharded calibration."""

    def __init__(self):
        self.values: dict[str, np.ndarray] = {}
        self.count = 0

    def observe(self, t: str, x: np.ndarray) -> None:
        m = np.abs(np.asarray(x, np.float32)).max(axis=tuple(i for i in range(x.ndim) if i != 1))
        self.values[t] = m if t not in self.values else np.maximum(self.values[t], m)

    def merge(self, other: ChannelMax) -> None:
        for t, m in other.values.items():
            self.values[t] = m if t not in self.values else np.maximum(self.values[t], m)
        self.count += other.count
