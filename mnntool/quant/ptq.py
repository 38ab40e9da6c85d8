"""Full int8 post-training quantization in MNN's representation.

Convolutions get int8 per-channel weights (quanParameter with scaleIn/scaleOut) and symmetricQuan;
their input and output tensors get a TensorQuantInfo scale and zero point from the chosen calibrator
(one-sided grids for tensors that are never negative, see calibrate). Before calibration, tensors whose
writers and readers can take per-channel factors exactly are equalized channel by channel (equalize.py).
Bias correction removes the mean output shift that weight rounding and the input grid's rounding cause,
using the calibration inputs' per-channel means (ROUNDED_MEANS).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np

from ..errors import MnnToolError
from ..ir.graph import Graph
from ..ir.ops import int8_weights, is_view, kind_of, runs_int8, spreads_grid
from ..runtime.session import Session
from . import shards
from .calibrate import QMAX, Histogram, make
from .equalize import ChannelMax, equalize, plans
from ..format.idst import dequantize
from .weights import idst_table, quantize_weight

SYMMETRIC = {"method": "DEFAULT", "nbits": 8, "zeroPoint": 0, "outputZeroPoint": 0, "clampMin": -127,
             "clampMax": 127, "outputDataType": "DT_INT8"}
Grid = tuple[float, int]     # (scale, zero point)


GELUS = {"GELU", "GELU_STANDARD"}


def _computed_by(tensor: str, producers):
    """The node that computes `tensor`, looking through data movement; None for a graph input."""
    node = producers.get(tensor)
    while node is not None and is_view(node.op):
        node = producers.get(node.inputs[0])
    return node


def _one_sided(tensor: str, producers, gridded: set) -> bool:
    """Whether MNN reads `tensor` correctly on a one-sided grid: its producer handles zero points, and a
    pooling does only when its own input is an int8 tensor. MNN's int8 max pooling of a float tensor
    onto a one-sided grid gives other values than pooling then rounding (squeezenet's pool after a
    Concat: MNN and mnntool's runtime agreed at cosine 0.986 on that layer, 0.990 at the output)."""
    node = _computed_by(tensor, producers)
    if node is None:
        return True
    if node.op == "Pooling":
        return node.inputs[0] in gridded
    # only ops MNN runs on int8 values (ir/ops: int8) handle a one-sided grid (zero point -127); its int8
    # BinaryOp clamps a fused ReLU at q = 0, which is real 0 only on a symmetric grid (ResNet-18: output
    # cosine 0.80 vs 0.9999)
    return runs_int8(node.op)


def _float_product(tensor: str, producers, gridded: set, constants) -> bool:
    """Whether MNN computes `tensor` in float and its int8 readers quantize it as they read it, with any
    zero point: a BinaryOp with an operand that has no grid (a SiLU's x * sigmoid(x)). Such a tensor may
    take an offset grid (calibrate.OFFSET_FRACTION)."""
    node = _computed_by(tensor, producers)
    return node is not None and node.op == "BinaryOp" and \
        any(i not in gridded and i not in constants for i in node.inputs)


def max_pooled(g: Graph) -> set[str]:
    """Tensors a max pooling reads or writes, through data movement. MNN 3.6's x86 int8 max pooling
    compares the signed bytes as unsigned, so -1 beats 127: it is right only on bytes 0..127 (measured:
    on a zero-point-0 grid its result equals an unsigned max of the two's-complement bytes at every
    output; resnext26ts's stem pool 0.55 cosine, the whole model 0.72)."""
    producers, readers = g.producers(), g.consumers()
    out: set[str] = set()
    for n in g.nodes:
        if n.op != "Pooling" or (n.param or {}).get("type", "MAXPOOL") != "MAXPOOL" or not n.inputs:
            continue
        t = n.inputs[0]
        while t is not None:
            out.add(t)
            p = producers.get(t)
            t = p.inputs[0] if p is not None and is_view(p.op) else None
        t = n.outputs[0]
        while t is not None:
            out.add(t)
            nxt = readers.get(t, [])
            t = nxt[0].outputs[0] if len(nxt) == 1 and is_view(nxt[0].op) else None
    return out


def _conv_before(tensor: str, producers) -> str | None:
    """The convolution that produces `tensor` through data movement only, if any."""
    node = _computed_by(tensor, producers)
    return node.name if node is not None and int8_weights(node.op) else None


def _averages(n) -> bool:
    p = n.param or {}
    return (n.op == "Pooling" and p.get("type", "MAXPOOL") == "AVEPOOL") or \
        (n.op == "Reduction" and p.get("operation") == "MEAN")


LOCAL_AVERAGE = 9      # values a local average pooling takes at most to be rounded like any activation


def _averages_many(n) -> bool:
    """An average over more values than a local pooling window (a global pool, a mean, a window of more
    than LOCAL_AVERAGE): its result has a finer resolution than its input's grid, which rounding it
    back to that grid would lose (float_layers). A 2x2 or 3x3 average's result is rounded like any
    other int8 activation (DenseNet-121's transitions: their three 1x1 convolutions before 2x2 pools,
    5.8 ms of a 31.5 ms int8 run in float, one Zen 4 core; pooled_on_input_grid)."""
    p = n.param or {}
    return _averages(n) and (n.op == "Reduction" or bool(p.get("isGlobal"))
                             or int(p.get("kernelX", 1)) * int(p.get("kernelY", 1)) > LOCAL_AVERAGE)


def _reads_gelu(n, producers) -> bool:
    src = _computed_by(n.inputs[0], producers) if n.inputs else None
    return src is not None and src.op == "UnaryOp" and (src.param or {}).get("opType") in GELUS


def float_layers(g: Graph) -> set[str]:
    """Convolutions that stay float.

    Those whose result reaches a graph output through data movement only: an int8 output grid would
    flatten the small logit differences that decide the top-1. Those whose result is averaged (an
    average pooling, a mean): MNN runs such a pool on its input's int8 grid and rounds each mean back
    to that grid, which costs a global pool most of its precision (MobileNetV2: output cosine 0.99989
    in MNN, 0.9999993 with the last convolution float; int8_before_average gives most of those an int8
    layer with a float output instead, the same for the average; a local 2x2 or 3x3 average rounds as
    any int8 activation, _averages_many). And those that read a GELU's output (a
    transformer MLP's second Linear): that input has a long one-sided tail a uniform int8 grid serves
    poorly (PTQ4ViT's post-GELU activations), and it is the model's widest tensor, so the grid's
    rounding there turns the ulp-sized differences of the float operators before it into the largest
    share of what two runtimes disagree on (ViT-tiny, 100 held-out images: cosine vs fp32 in MNN
    0.99938 -> 0.99969, agreement of mnntool's runtime and MNN 0.99958 -> 0.99992).

    And the two convolutions of a squeeze-excitation gate (the one that reads a global average and the
    one that reads its result): the average is a float sum the two runtimes add in different orders,
    so rounding it (or the gate computed from it) to a grid turns ulp differences into whole steps
    wherever a value sits near a rounding boundary, and the gate multiplies a whole channel by the
    flipped value. They are 1x1 layers on a 1x1 map: float costs no time. (PP-OCRv4's detector on text
    pages: agreement of the two runtimes 0.9994 -> 0.99998 on a held-out page.)
    """
    producers = g.producers()
    mlp = [n.name for n in g.nodes if int8_weights(n.op) and _reads_gelu(n, producers)]
    return _heads_and_averaged(g, producers) | {name for name in mlp + _gates(g, producers)}


def _heads_and_averaged(g: Graph, producers) -> set[str]:
    """Convolutions whose result reaches a graph output or an average through data movement only."""
    heads = [_conv_before(out, producers) for out in g.outputs]
    pooled = [_conv_before(n.inputs[0], producers) for n in g.nodes if _averages_many(n) and n.inputs]
    return {name for name in heads + pooled if name}


def _gates(g: Graph, producers) -> list[str]:
    """The convolutions of squeeze-excitation gates: one reading a global average and one reading its
    result (see float_layers). A classifier's single Linear after the pool is no gate."""
    def global_average(n) -> bool:
        return n is not None and _averages(n) and (n.op == "Reduction" or bool((n.param or {}).get("isGlobal")))
    first = {n.name for n in g.nodes if int8_weights(n.op) and n.inputs and
             global_average(_computed_by(n.inputs[0], producers))}
    def conv_before(t):
        """The node computing t through data movement and a ReLU (a separate op where not fused)."""
        src = _computed_by(t, producers)
        return _computed_by(src.inputs[0], producers) if src is not None and src.op in ("ReLU", "ReLU6") \
            and src.inputs else src
    pairs = [(src.name, n.name) for n in g.nodes if int8_weights(n.op) and n.inputs
             for src in [conv_before(n.inputs[0])] if src is not None and src.name in first]
    return sorted({name for pair in pairs for name in pair})




def _unspread(g: Graph, nodes: list) -> list:
    """`nodes` without those reading a grid MNN would spread (spread_grids): they stay float."""
    while True:
        spoiled = spread_grids(g, {n.inputs[0] for n in nodes} | {n.outputs[0] for n in nodes})
        if not spoiled:
            return nodes
        nodes = [n for n in nodes if n.inputs[0] not in spoiled]


def _spreads(op: str) -> bool:
    """MNN 3.6 hands a tensor's int8 grid through this op to a neighbour the file gives none (the op's
    definition: spreads_grid; Pipeline::encode's scale propagation and Raster data movement)."""
    return spreads_grid(op)


def spread_grids(g: Graph, gridded: set) -> set[str]:
    """The gridded tensors whose grid MNN would spread onto a tensor that means something else without it.

    MNN (Pipeline::encode) gives a tensor without a TensorQuantInfo the grid of its neighbour across a
    grid-spreading op: backwards from the op's output to each float input without one, and on through
    that input's own producer when it spreads too. Such an input then reaches every other reader on
    that grid: an average pooling's int8 output grid, calibrated for the mean, handed back to the
    feature map it averages, clamped that map for the upsampling and the additions reading it
    (PP-OCRv4's detector neck: cosine vs fp32 0.99 in mnntool's runtime, 0.115 in MNN). mnntool's
    runtime reads only the file's grids, so such a grid is not written: the int8 layers reading it stay
    float. Where the op is the input's only reader, the input's other meaning is what the op reads
    anyway (an int8 pooling of a float tensor rounds it to its grid, in both runtimes), and so on back
    through data movement, which only moves the rounded values. Not through another computing op: PP-OCR's
    classifier pools a hard-swish output with a max pooling then a global average; the average's grid
    reached the hard-swish through both, and MNN's int8 max pooling then ran on its signed bytes (see
    max_pooled): class probabilities 0.45/0.55 for 0.99/0.01. (A ReLU passes it on harmlessly: the
    ReLU of the rounded values is the rounded ReLU.)"""
    producers, readers = g.producers(), g.consumers()

    def open_inputs(node) -> list[str]:
        return [x for x in node.inputs if x and x not in gridded and x not in g.constants]

    def spoils(node) -> bool:
        for x in open_inputs(node):
            if any(r is not node for r in readers.get(x, [])) or x in g.outputs:
                return True
            before = producers.get(x)
            if before is not None and _spreads(before.op) and open_inputs(before) and \
                    (not _rounds_through(before.op) or spoils(before)):
                return True
        return False

    return {t for t in gridded if producers.get(t) is not None and _spreads(producers[t].op) and spoils(producers[t])}


def _rounds_through(op: str) -> bool:
    """MNN's int8 form of the op gives its float result rounded: data movement, ReLU, ReLU6."""
    return kind_of(op) == "movement" or op in ("ReLU", "ReLU6")


def float_report(g: Graph, q: Graph, skip: set[str], auto_skipped: list) -> list[dict]:
    """Each convolution the int8 file computes in float, why, and how its weights are stored."""
    keep, pooled, producers = float_layers(g), max_pooled(g), g.producers()
    gates = set(_gates(g, producers)) - _heads_and_averaged(g, producers)
    gridded = {t for t, info in q.tensors.items() if info is not None and info.quant}
    rows = []
    for n in q.nodes:
        if not int8_weights(n.op) or "symmetricQuan" in n.param:
            continue
        why = ("asked (--skip)" if n.name in skip or n.outputs[0] in skip else
               "auto-skip" if n.name in auto_skipped else
               "reads a GELU's output" if n.name in keep and _reads_gelu(n, producers) else
               "computes a squeeze-excitation gate from a global average" if n.name in gates else
               "feeds an output or an average" if n.name in keep else
               "reads or writes a max pooling's negative values (MNN's x86 int8 max pooling compares "
               "bytes as unsigned)" if {n.inputs[0], n.outputs[0]} & pooled else
               "its input's grid would spread in MNN to a tensor other layers read in float" if
               n.inputs and n.inputs[0] not in gridded and n.inputs[0] in spread_grids(q, gridded | {n.inputs[0]})
               else "no weights to quantize")
        qp = n.param.get("quanParameter")
        rows.append({"name": n.name, "reason": why, "weights": "int8" if qp is not None else "fp32"})
    return rows


def int8_before_average(g: Graph, skip: set[str]) -> set[str]:
    """Convolutions float_layers keeps float only because an average reads their result, that run int8
    with a float output instead (float_outputs gives them DT_FLOAT): a group-1 convolution whose input
    an int8 convolution (or depthwise one) writes, so int8 bytes already, and that reads no GELU and
    gates nothing. The average then reads float values, as from a float layer, and the layer's multiply-adds are
    integer ones: RepVGG-A0's last 3x3 (192 -> 1280 channels, 108M multiply-adds, before the global
    mean) took 2.3 ms of 10.5 a run in float (one Zen 4 core), 0.7 in int8."""
    producers = g.producers()
    kept = float_layers(g)
    other = {_conv_before(out, producers) for out in g.outputs} | set(_gates(g, producers))   # heads, gates
    out = set()
    for n in g.nodes:
        if n.op != "Convolution" or n.name not in kept or n.name in other or n.name in skip or \
                (n.param["common"].get("group", 1) or 1) != 1 or _reads_gelu(n, producers) or \
                not any(_averages(r) for r in _readers_past_views(g, n.outputs[0])):
            continue
        src = _computed_by(n.inputs[0], producers) if n.inputs else None
        if src is not None and src.op in ("Convolution", "ConvolutionDepthwise") and src.name not in kept \
                and src.name not in skip and src.param.get("weight") is not None:
            out.add(n.name)
    return out


def _readers_past_views(g: Graph, tensor: str) -> list:
    """The operators that read `tensor`, looking through data movement."""
    readers, todo, out = g.consumers(), [tensor], []
    while todo:
        for r in readers.get(todo.pop(), []):
            if is_view(r.op):
                todo.extend(r.outputs)
            else:
                out.append(r)
    return out


def targets(g: Graph, skip: set[str]) -> list:
    keep_float = float_layers(g) - int8_before_average(g, skip)
    out = []
    for n in g.nodes:
        if int8_weights(n.op) and n.name not in skip and n.outputs[0] not in skip and n.name not in keep_float \
                and n.param.get("weight") is not None:
            out.append(n)
    return out


MEAN_FRACTION_BITS = 40     # the fixed point of the summed per-sample means (integers add in any order)


@dataclass
class Statistics:
    """What calibration keeps of the samples: a histogram per tensor and each layer's per-channel input
    means summed in fixed point, so statistics of shards of the data merge into exactly those of the
    whole (`--workers N` writes the single process's file bit for bit)."""
    hists: dict = field(default_factory=dict)       # tensor -> calibrate.Histogram
    sums: dict = field(default_factory=dict)        # layer -> list of ints (means * 2^MEAN_FRACTION_BITS)
    count: int = 0

    def merge(self, other: Statistics) -> None:
        for t, h in other.hists.items():
            if t in self.hists:
                self.hists[t].merge(h)
            else:
                self.hists[t] = h
        for k, v in other.sums.items():
            self.add_sum(k, v)
        self.count += other.count

    def add_sum(self, layer: str, fixed: list) -> None:
        mine = self.sums.get(layer)
        self.sums[layer] = fixed if mine is None else [a + b for a, b in zip(mine, fixed)]

    def means(self) -> dict[str, np.ndarray]:
        scale = float(2 ** MEAN_FRACTION_BITS) * self.count
        return {k: np.array([float(v) for v in s]) / scale for k, s in self.sums.items()}


def _fixed(m: np.ndarray) -> list:
    return [int(v) for v in np.rint(m.astype(np.float64) * 2.0 ** MEAN_FRACTION_BITS)]


def collect(g: Graph, samples, names: list, layers: list, threads: int = 1, progress=None,
            sess: Session | None = None) -> Statistics:
    """Run the samples (a stream: one at a time) and keep only their statistics.

    `layers`: (name, input tensor) of the layers whose input means bias correction needs."""
    stats = Statistics({t: Histogram() for t in names})
    sess = sess or Session(g, threads)
    for feeds in samples:
        stats.count += 1
        every = sess.run(feeds, keep_all=True)
        for t in names:
            if t not in every:
                raise MnnToolError(f"tensor '{t}' was not computed during calibration")
            try:
                stats.hists[t].observe(every[t])
            except ValueError as e:
                raise MnnToolError(f"tensor '{t}' has {e} on a calibration sample") from None
        for name, tensor in layers:
            x = every[tensor]
            m = x.mean(axis=(0, 2, 3)) if x.ndim == 4 else x.reshape(-1, x.shape[-1]).mean(0)
            stats.add_sum(name, _fixed(m))
        if progress:
            progress(1)
    return stats


def _collect_chunk(chunk, g: Graph, names: list, layers: list, threads: int) -> Statistics:
    """collect() of one chunk of the samples, in a worker process or a Ray task (shards.merged)."""
    # one Session per worker for all its chunks (shards.kept): a new one costs a plan and packed weights
    sess = shards.kept(g, ("session", threads), lambda: Session(g, threads))
    return collect(g, chunk, names, layers, threads, sess=sess)


def calibrate(g: Graph, samples, method: str, nodes, progress=None,
              asymmetric: bool = True, threads: int = 1, workers: int = 1,
              ray: str | None = None, stats: Statistics | None = None) -> tuple[dict[str, Grid], dict]:
    """Per-tensor int8 grids for the inputs and outputs of `nodes`, and per-channel input means. A
    tensor a max pooling touches gets a zero-point-0 grid (bytes 0..127 where it is never negative);
    where it has negative values it gets none: the layers on it stay float (see max_pooled)."""
    names = sorted({n.inputs[0] for n in nodes} | {n.outputs[0] for n in nodes})
    layers = [(n.name, n.inputs[0]) for n in nodes]
    with shards.pool(workers, ray) as on:       # None: this process
        if stats is not None:       # collected once for many quantizations (quant.skip_budget), a superset
            pass
        elif on is not None:
            stats = shards.merge_on(on, _collect_chunk, samples, (g, names, layers, threads), Statistics(), progress)
        else:
            stats = collect(g, samples, names, layers, threads, progress)
        if stats.count == 0:
            raise MnnToolError("no calibration samples")
        producers, gridded, pooled = g.producers(), set(names), max_pooled(g)
        cals = {}
        for t in names:
            if t in pooled and stats.hists[t].negative:
                continue
            zero_point = asymmetric and t not in pooled      # its readers may take a grid with a zero point
            cal = make(method, zero_point and _one_sided(t, producers, gridded),
                       offset=zero_point and _float_product(t, producers, gridded, g.constants))
            cal.hist = stats.hists[t]
            cals[t] = cal
        # the grid search follows the samples (EfficientNet-B0, 155 tensors: KL 61 s, mse 1.8 s): on the pool too
        todo = list(cals.values())
        found = shards.split_map(on, _grids, todo) if on is not None else _grids(todo)
    return dict(zip(cals, found)), stats.means()


def _channel_max(chunk, g: Graph, names: list, threads: int, progress=None) -> ChannelMax:
    """Per-channel max |x| of `names` over a chunk of the samples (in a worker process or a Ray task)."""
    stats, sess = ChannelMax(), Session(g, threads)
    for feeds in chunk:
        stats.count += 1
        every = sess.run(feeds, keep_all=True)
        for t in names:
            stats.observe(t, every[t])
        if progress:
            progress(1)
    return stats


def equalize_channels(q: Graph, samples, nodes, threads: int = 1, workers: int = 1, ray: str | None = None,
                      progress=None) -> int:
    """Rescale per channel the int8 tensors of `nodes` whose writers and readers take it exactly
    (equalize.py), from one pass over the samples. Returns how many tensors were rescaled."""
    plan = plans(q, {n.inputs[0] for n in nodes} | {n.outputs[0] for n in nodes}, {n.name for n in nodes})
    if not plan:
        return 0
    names = sorted(plan)
    with shards.pool(workers, ray) as on:
        stats = shards.merge_on(on, _channel_max, samples, (q, names, threads), ChannelMax(), progress) \
            if on is not None else _channel_max(samples, q, names, threads, progress)
    return equalize(q, plan, stats.values)


# Bias correction also removes the mean shift that rounding each layer's INPUT to its grid causes:
# W * mean(x) - Wq * mean(grid(x)) per output channel, from one more pass over the samples once the grids
# are known. Where a tensor's values sit on a few levels (a text page is mostly flat background, so each
# channel holds one value over most of the map), that rounding is a bias over the whole map, not noise:
# PP-OCRv4's detector on 4 held-out pages, cosine vs fp32 0.9895 -> 0.9904 (with equalization); with
# only its second convolution int8, the output over input grids 0.6x..2x the chosen one ranged
# 0.9886..0.9983 without this and 0.9978..0.9989 with it.
ROUNDED_MEANS = True


def _collect_rounded(chunk, g: Graph, layers: list, threads: int, progress=None) -> Statistics:
    """Per-channel means of each layer's input as its grid rounds it (in a worker process or a Ray task)."""
    stats, sess = Statistics(), Session(g, threads)
    for feeds in chunk:
        stats.count += 1
        every = sess.run(feeds, keep_all=True)
        for name, tensor, (scale, zero) in layers:
            x = np.clip(np.rint(every[tensor].astype(np.float64) / scale + zero), -QMAX, QMAX)
            x = (x - zero) * scale
            m = x.mean(axis=(0, 2, 3)) if x.ndim == 4 else x.reshape(-1, x.shape[-1]).mean(0)
            stats.add_sum(name, _fixed(m))
        if progress:
            progress(1)
    return stats


def rounded_means(g: Graph, samples, layers: list, threads: int = 1, workers: int = 1,
                  ray: str | None = None, progress=None) -> dict[str, np.ndarray]:
    """layer -> per-channel mean of its input rounded to its grid; layers: (name, tensor, grid)."""
    if not layers:
        return {}
    with shards.pool(workers, ray) as on:
        stats = shards.merge_on(on, _collect_rounded, samples, (g, layers, threads), Statistics(), progress) \
            if on is not None else _collect_rounded(samples, g, layers, threads, progress)
    return stats.means()


def _grids(cals: list) -> list:
    """Each calibrator's grid (one shard of them, in a worker process or a Ray task)."""
    return [c.grid() for c in cals]


def quantize_int8(g: Graph, samples, method: str = "kl", per_channel: bool = True,
                  skip: set[str] = frozenset(), bias_correction: bool = True, progress=None,
                  asymmetric: bool = True, threads: int = 1, workers: int = 1, ray: str | None = None,
                  stats: Statistics | None = None, equalize: bool = True) -> Graph:
    if len(samples) == 0:
        raise MnnToolError("no calibration samples")
    q = copy.deepcopy(g)
    nodes = targets(q, set(skip))
    if not nodes:
        if skip:
            return q      # everything asked to stay float
        raise MnnToolError("the model has no float convolutions to quantize")
    nodes = _unspread(q, nodes)
    # per-tensor weights would round rescaled rows differently; statistics collected before (stats) would
    # be of the tensors unscaled
    if equalize and per_channel and stats is None:
        equalize_channels(q, samples, nodes, threads, workers, ray, progress)     # every pass counts
    grids, means = calibrate(q, samples, method, nodes, progress, asymmetric, threads, workers, ray, stats)
    nodes = _unspread(q, [n for n in nodes if n.inputs[0] in grids and n.outputs[0] in grids])
    rounded = rounded_means(q, samples, [(n.name, n.inputs[0], grids[n.inputs[0]]) for n in nodes
                                         if n.name in means], threads, workers, ray, progress) \
        if bias_correction and ROUNDED_MEANS else {}
    for n in nodes:
        if n.inputs[0] not in grids or n.outputs[0] not in grids:
            continue            # on a max pooling's signed values: stays float (calibrate)
        c = n.param["common"]
        cout = c["outputCount"]
        w = np.asarray(n.param["weight"], np.float32).reshape(cout, -1)
        qp = quantize_weight(w, 8, False, cout, per_tensor=not per_channel)
        if bias_correction and n.name in means:
            err = w - dequantize(qp, cout)                       # (O, C/g * kh * kw)
            group = c.get("group", 1) or 1
            cin_g = c.get("inputCount", 0) // group or err.shape[1]
            k = c.get("kernelX", 1) * c.get("kernelY", 1)
            mu = np.asarray(means[n.name], np.float64)
            if err.shape[1] == cin_g * k and mu.size == cin_g * group:
                e = err.reshape(cout, cin_g, k).sum(-1)         # (O, C/g)
                og = cout // group
                shift = np.concatenate([e[g_ * og:(g_ + 1) * og] @ mu[g_ * cin_g:(g_ + 1) * cin_g]
                                        for g_ in range(group)])
                if n.name in rounded:       # the input grid's own rounding, on average, per channel
                    wq = dequantize(qp, cout).astype(np.float64).reshape(cout, cin_g, k).sum(-1)
                    d = mu - rounded[n.name]
                    shift += np.concatenate([wq[g_ * og:(g_ + 1) * og] @ d[g_ * cin_g:(g_ + 1) * cin_g]
                                             for g_ in range(group)])
                n.param["bias"] = (np.asarray(n.param["bias"], np.float64) + shift).astype(np.float32)
        set_int8(q, n, qp, grids[n.inputs[0]], grids[n.outputs[0]])
    float_outputs(q)
    pooled_on_input_grid(q)
    return q


def pooled_on_input_grid(g: Graph) -> int:
    """Local average poolings (not global: _averages_many) of an int8 convolution's int8 output get their
    input's grid for their output where the file gives it none. MNN pools int8 bytes in int8 and rounds
    each mean to the input's grid whatever the output's type; with the grid in the file, mnntool's
    runtime does the same (ops.pool.int8_average) instead of pooling in float (DenseNet-121's
    transitions: agreement of the two runtimes 0.99996 without, on the same file). Returns how many."""
    producers = g.producers()
    done = 0
    for n in g.nodes:
        if not _averages(n) or _averages_many(n) or n.op != "Pooling" or not n.inputs or len(n.outputs) != 1:
            continue
        src, dst = g.info(n.inputs[0]).quant, g.info(n.outputs[0]).quant
        if src and not dst and _written_int8(n.inputs[0], producers, g):
            g.info(n.outputs[0]).quant = dict(src)
            done += 1
    return done


def _read_on_grid(tensor: str, readers, int8_inputs: set, g: Graph) -> bool:
    """Whether some operator reads `tensor` (or a data-moved copy of it) as int8: an int8 convolution's
    input, or an operator whose own output has a grid (MNN runs it in int8: pooling, concat)."""
    todo, seen = [tensor], set()
    while todo:
        t = todo.pop()
        if t in seen:
            continue
        seen.add(t)
        if t in int8_inputs:
            return True
        for r in readers.get(t, []):
            if any((g.info(o).quant if g.info(o) else None) for o in r.outputs):
                return True
            if is_view(r.op):
                todo.extend(r.outputs)
    return False


def _written_int8(tensor: str, producers, g: Graph) -> bool:
    """Whether MNN holds `tensor` as int8 bytes: a graph input, the output of an int8 convolution or of a
    pooling of int8 bytes, or a data move onto a grid. A float operator's output (a SiLU's product) stays
    float in MNN even where the file gives it a grid: its int8 readers round it as they read it, and a
    float reader does not."""
    info = lambda t: g.info(t).quant if g.info(t) else None   # noqa: E731
    node = producers.get(tensor)
    while node is not None and is_view(node.op):
        if info(node.outputs[0]):
            return True
        node = producers.get(node.inputs[0])
    if node is None:
        return True
    if int8_weights(node.op):
        sq = node.param.get("symmetricQuan")
        return sq is not None and sq.get("outputDataType", "DT_INT8") == "DT_INT8"
    return node.op == "Pooling" and bool(info(node.inputs[0]))


def float_outputs(g: Graph) -> int:
    """int8 convolutions whose result only float operators read write it in float (symmetricQuan's
    outputDataType DT_FLOAT): int8 input and weights, no output grid. MNN would otherwise round the
    result to int8 and cast it straight back to float for its readers, a rounding that costs accuracy
    and makes the file's output jump on ulp-sized differences (ViT-tiny, 100 held-out images: cosine vs
    fp32 in MNN 0.99912 -> 0.99939, agreement of the two runtimes 0.99940 -> 0.99960). Only group-1
    GEMM convolutions whose input MNN holds as int8 bytes: MNN runs a layer with a float output as a
    float layer on its input as it is, so one reading a float operator's output
    (an SE block's SiLU) would compute on unrounded values, and a depthwise one does so always (both
    measured).

    Not where the result reaches another grid through operators both runtimes compute bit for bit
    (exactly_rounded_later): MNN runs a layer with a float output as a float convolution (the input
    cast back to float, the weights dequantized) and sums in its own order, so its result differs from
    the integer arithmetic's in the last bit; rounded again at the next grid with nothing else between,
    those bits flip a step wherever a value sits near a rounding boundary, and the flips multiply layer
    by layer. An int8 output is the same bytes in both runtimes (PP-OCRv4's detector on 4 held-out text
    pages: agreement 0.99926-0.99998 with float outputs, >= 0.999995 without). Returns how many."""
    readers, producers = g.consumers(), g.producers()
    int8_inputs = {n.inputs[0] for n in g.nodes if "symmetricQuan" in n.param}
    done = 0
    for n in g.nodes:
        sq = n.param.get("symmetricQuan")
        if sq is None or n.op != "Convolution" or (n.param["common"].get("group", 1) or 1) != 1 \
                or _read_on_grid(n.outputs[0], readers, int8_inputs, g) \
                or not _written_int8(n.inputs[0], producers, g) \
                or exactly_rounded_later(n.outputs[0], readers, g):
            continue
        n.param["symmetricQuan"] = dict(sq, outputZeroPoint=0, outputDataType="DT_FLOAT")
        g.info(n.outputs[0]).quant = None
        done += 1
    return done


# float operators MNN and mnntool's runtime compute bit for bit (measured on PP-OCRv4's detector: every
# BinaryOp of these kinds, Clip/ReLU6 and data movement gave identical bits from identical inputs)
EXACT_BINARY = {"ADD", "SUB", "MUL", "REALDIV", "DIV", "MAXIMUM", "MINIMUM"}


def _exact(n) -> bool:
    """Only what was measured bit-identical with the path ending on a grid: an upsampling or a concat of
    int8 tensors on the way (DBNet's FPN: smooth convolutions -> nearest upsampling -> concat -> head)
    did not give MNN's values with int8 outputs (agreement 1.0 -> 0.9999), so they end the path."""
    if n.op == "BinaryOp":
        return (n.param or {}).get("opType") in EXACT_BINARY
    return n.op in ("ReLU", "ReLU6") or is_view(n.op)      # a view copies bits


def exactly_rounded_later(tensor: str, readers, g: Graph) -> bool:
    """Whether `tensor` reaches a tensor the file gives a grid through operators that both runtimes
    compute bit for bit (EXACT_BINARY, ReLU/ReLU6, views: _exact).
    A BinaryOp counts only where its other operands are float in MNN: one adding two tensors MNN holds
    as int8 (DBNet's lateral convolution plus the upsampled level above, whose grid MNN spreads through
    the upsampling) gave other values in MNN (agreement 1.0 -> 0.99990 with int8 lateral outputs)."""
    producers = g.producers()

    def held_int8(t, depth=0) -> bool:
        """MNN holds t as int8: the file gives it a grid, or a grid-spreading op computes it from one."""
        if g.info(t) is not None and g.info(t).quant:
            return True
        node = producers.get(t)
        if node is None or depth > 32 or not _spreads(node.op):
            return False
        ins = [i for i in node.inputs if i and i not in g.constants]
        return len(ins) == 1 and held_int8(ins[0], depth + 1)

    todo, seen = [tensor], set()
    while todo:
        t = todo.pop()
        if t in seen:
            continue
        seen.add(t)
        for r in readers.get(t, []):
            if not _exact(r) or (r.op == "BinaryOp" and any(
                    i != t and i not in g.constants and held_int8(i) for i in r.inputs)):
                continue
            for o in r.outputs:
                if g.info(o) is not None and g.info(o).quant:
                    return True
                todo.append(o)
    return False


def set_int8(g: Graph, n, qp: dict, grid_in: Grid, grid_out: Grid) -> None:
    """Make convolution `n` an int8 one: its weight table, its symmetricQuan, and both tensors' grids."""
    (qp["scaleIn"], z_in), (qp["scaleOut"], z_out) = grid_in, grid_out
    n.param["quanParameter"] = qp
    n.param["symmetricQuan"] = dict(SYMMETRIC, zeroPoint=z_in, outputZeroPoint=z_out)
    n.param.pop("weight", None)
    for t, (s, z) in ((n.inputs[0], grid_in), (n.outputs[0], grid_out)):
        g.info(t).quant = {"scale": float(s), "zero": float(z), "min": -127.0, "max": 127.0, "type": "DT_INT8"}


def apply_int8_plan(g: Graph) -> int:
    """The int8 convolutions a quantized source model declared (Graph.int8_plan), after the passes: its
    own int8 weights when the float weights still equal them (a pass that folded something into the
    layer changed them: requantized then), its own grids. Returns how many layers became int8."""
    done = 0
    for n in g.nodes:
        plan = g.int8_plan.get(n.name)
        if plan is None or not int8_weights(n.op) or n.param.get("weight") is None:
            continue
        cout = n.param["common"]["outputCount"]
        w = np.asarray(n.param["weight"], np.float32).reshape(cout, -1)
        q, alpha = plan["weight"], plan["alpha"]
        if q.shape == w.shape and np.allclose(q * alpha[:, None], w, rtol=1e-5, atol=1e-7):
            qp = idst_table(q, alpha, cout)
        else:
            qp = quantize_weight(w, 8, False, cout)
        set_int8(g, n, qp, plan["input"], plan["output"])
        done += 1
    g.int8_plan = {}
    return done
