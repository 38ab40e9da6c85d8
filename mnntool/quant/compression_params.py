"""MNN's per-layer compression-parameter JSON (MNNConvert --compressionParamsFile), read and written, so
a weight-only plan carries between mnntool and MNN's converter in both directions.

The file is MNN.Compression.Pipeline (tools/converter/source/compression/MNN_compression.proto) as
protobuf's JSON. Given a path that does not exist, MNNConvert writes one with `"forGuide": true` and one
layer per convolution: `opName` (the .mnn op name), `weight[0]` {bits, asymmetric, blockSize} and `conv`
{inputChannel, outputChannel, kernelSize}. Reading a forGuide file, it takes each listed layer's bits
(0: the weights stay float), asymmetric flag and block size instead of --weightQuantBits /
--weightQuantAsymmetric / --weightQuantBlock; a block size under 16 or not a multiple of 16 (MNN writes
-1) means one scale per output channel. A file without forGuide carries full-int8 quantization
(activation scales per tensor, as MNN's Python compressor writes): not read here.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import MnnToolError
from ..ir.graph import Graph
from ..ir.ops import is_convolution

BITS = (0, 4, 8)        # what mnntool writes per layer; 0 keeps the layer's weights float, as in MNN


@dataclass(frozen=True)
class LayerPlan:
    """How one convolution's weights are stored."""
    bits: int                   # 8, 4, or 0: float
    block: int | None = None    # input channels per scale; None: one scale per output channel
    asymmetric: bool = False


def _get(d: dict, camel: str, snake: str, default=None):
    """protobuf's JSON parser takes a field by its lowerCamelCase or its proto name."""
    return d.get(camel, d.get(snake, default))


def _block(size) -> int | None:
    """MNN's rule (WeightQuantAndCoding.cpp): blocks only of 16, 32, ... input channels."""
    size = int(size or 0)
    return size if size >= 16 and size % 16 == 0 else None


def read(path) -> dict[str, LayerPlan]:
    """The per-layer weight plan of an MNN compression JSON: {op name: LayerPlan}."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise MnnToolError(f"{path}: no such compression-parameter file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise MnnToolError(f"{path}: not a JSON compression-parameter file ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("algo", []), list):
        raise MnnToolError(f"{path}: not an MNN compression pipeline (no 'algo' list)")
    guide = bool(_get(doc, "forGuide", "for_guide", False))
    plan: dict[str, LayerPlan] = {}
    for algo in doc.get("algo", []):
        kind = algo.get("type", "QUANTIZE")
        if kind not in ("QUANTIZE", 0):
            raise MnnToolError(f"{path}: carries a {kind} algorithm; mnntool reads weight quantization plans only")
        for layer in _get(_get(algo, "quantParams", "quant_params", {}), "layer", "layer", []):
            name = _get(layer, "opName", "op_name")
            if not name:
                continue                    # MNN skips layers without an op name too
            if _get(layer, "subgraphName", "subgraph_name"):
                raise MnnToolError(f"{path}: layer {name} is in subgraph {_get(layer, 'subgraphName', 'subgraph_name')}"
                                   "; mnntool plans main-graph layers only")
            if not guide and (layer.get("input") or layer.get("output")):
                raise MnnToolError(f"{path}: layer {name} carries int8 activation scales (full quantization, "
                                   "no forGuide); mnntool reads MNN's weight-only plans")
            weights = layer.get("weight") or []
            if not weights:
                continue
            w = weights[0]
            bits = min(int(w.get("bits", 8)), 8)
            if bits not in BITS:
                raise MnnToolError(f"{path}: layer {name}: {bits}-bit weights; mnntool stores 8, 4 or 0 (float)")
            block = _block(_get(w, "blockSize", "block_size", 0))
            plan[name] = LayerPlan(bits, block, bool(w.get("asymmetric", False)))
    return plan


def conv_layers(g: Graph) -> list:
    """The convolutions with float weights of their own: the layers a plan covers."""
    return [n for n in g.nodes if is_convolution(n.op) and n.param.get("weight") is not None
            and len(n.param["weight"]) > 0]


def plan_for(g: Graph, bits: int, asymmetric: bool, block: int | None, skip=frozenset(), heads=frozenset(),
             head_bits: int | None = None, given: dict[str, LayerPlan] | None = None, src="") -> dict[str, LayerPlan]:
    """Every weighted convolution's plan: the run's settings (skipped layers float, head layers at
    head_bits), with the layers a compression file lists taken from it instead."""
    layers = conv_layers(g)
    names = {n.name for n in layers}
    unknown = sorted(set(given or {}) - names)
    if unknown:
        raise MnnToolError(f"--compression-params names no weighted convolution of {src}: {', '.join(unknown[:5])}"
                           f"{' ...' if len(unknown) > 5 else ''} (op names come from the converter that made it)")
    plan = {}
    for n in layers:
        if n.name in skip or n.outputs[0] in skip:       # --skip wins over the file
            plan[n.name] = LayerPlan(0)
        elif given and n.name in given:
            plan[n.name] = given[n.name]
        else:
            plan[n.name] = LayerPlan(head_bits if head_bits and n.name in heads else bits, block, asymmetric)
    return plan


def write(path, g: Graph, plan: dict[str, LayerPlan]) -> None:
    """The plan as MNN's converter writes it (forGuide), for MNNConvert --compressionParamsFile."""
    layers = []
    for n in conv_layers(g):
        lp = plan.get(n.name)
        if lp is None:
            continue
        c = n.param["common"]
        rows = c["outputCount"]
        taps = c.get("kernelX", 1) * c.get("kernelY", 1)
        cin = len(n.param["weight"]) // rows // taps
        layers.append({"weight": [{"name": n.name, "bits": lp.bits, "asymmetric": lp.asymmetric,
                                   "blockSize": lp.block or -1}],
                       "opName": n.name,
                       "conv": {"inputChannel": cin, "outputChannel": rows,
                                "kernelSize": [c.get("kernelX", 1), c.get("kernelY", 1)]}})
    doc = {"version": "0.0.0", "algo": [{"type": "QUANTIZE", "quantParams": {"layer": layers}}], "forGuide": True}
    path = Path(path)
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)          # never left half-written
