"""The decoder's structure, recognised from the ops of `llm.mnn` (not from tensor names).

Two writers make these graphs, mnntool (llm/decoder.py) and MNN's llmexport (via ONNX and MNN's converter),
with different names and different glue (llmexport computes reshape shapes with Shape/Gather chains and
gathers RoPE tables; mnntool writes them as constants). What both share, and what is matched here:

    per layer    LayerNorm -> q/k/v 1x1 Convolutions -> [LayerNorm per head] -> [RoPE: x*cos + rot(x)*sin]
                 -> Attention(q, k, v, mask){layer_index} -> o Convolution -> [LayerNorm] -> ADD (residual)
                 -> LayerNorm -> gate/up Convolutions -> MUL_SILU | MUL(act(gate), up) | act(fc)
                 -> down Convolution -> [LayerNorm] -> ADD (residual)
    prologue     input_ids (the embeddings) [* scale] [+ Gather(position table, position_ids)]
    tail         StridedSlice(logits_index) -> LayerNorm -> head Convolution [-> MUL, TANH, MUL: soft-cap] -> logits

The graph's four inputs and two outputs are named by MNN-LLM's contract (input_ids, attention_mask,
position_ids, logits_index; logits, hidden_states): those names are used, no other.
A RoPE's inv_freq is the float constant multiplied with position_ids on the table side; its attention
factor a scalar multiplier after COS/SIN; a query scale (Gemma's query_pre_attn_scalar) a scalar
multiplier on the data side.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...errors import MnnToolError
from ...format.flatbuf import decode
from ...ir.ops import is_view, kind_of, ops_where

# ops that move data without changing it (layouts, views), and ops whose outputs are shapes, never data
TRANSPARENT = ops_where(is_view)
SHAPE_ONLY = ops_where(lambda op: kind_of(op) == "shape")
# which inputs of an op carry data (the rest are shapes, indices, slice bounds)
DATA_INPUTS = {"Reshape": (0,), "StridedSlice": (0,), "GatherV2": (0,), "Squeeze": (0,), "Unsqueeze": (0,),
               "ExpandDims": (0,), "UnaryOp": (0,), "Cast": (0,), "ConvertTensor": (0,)}

UNARY_ACT = {"GELU": "gelu_tanh", "GELU_STANDARD": "gelu", "SILU": "silu", "SIGMOID": None}


@dataclass
class LinearOp:
    """A 1x1 Convolution reading llm.mnn.weight: `external` [offset, weight bytes, alpha bytes, bias bytes]."""
    name: str
    oc: int
    ic: int
    external: tuple
    quan: dict


@dataclass
class NormOp:
    name: str
    eps: float
    rms: bool
    external: tuple | None
    gamma: np.ndarray | None = None     # inline (no external)
    beta: np.ndarray | None = None


@dataclass
class RopeOp:
    inv_freq: np.ndarray        # (rotary_dim / 2,) float32
    scaling: float              # multiplies cos and sin
    rotary_dim: int


@dataclass
class LayerPlan:
    index: int
    in_norm: NormOp
    q: LinearOp
    k: LinearOp
    v: LinearOp
    o: LinearOp
    heads: int
    kv_heads: int
    head_dim: int
    q_norm: NormOp | None = None
    k_norm: NormOp | None = None
    rope: RopeOp | None = None
    q_scale: float = 1.0        # extra factor on q (folded query scale)
    attn_scale: float = 0.0     # Attention's own attnScale (0: 1/sqrt(head_dim))
    sliding: bool = False       # reads the sliding-window mask
    post_attn_norm: NormOp | None = None
    ff_norm: NormOp | None = None
    gate: LinearOp | None = None
    up: LinearOp | None = None
    down: LinearOp | None = None
    act: str = "silu"           # silu | gelu_tanh | gelu
    post_ff_norm: NormOp | None = None


@dataclass
class ModelPlan:
    hidden: int
    vocab: int
    layers: list
    final_norm: NormOp
    head: LinearOp
    embed_scale: float = 1.0
    positions: np.ndarray | None = None     # learned position table (GPT-2)
    softcap: float | None = None
    writer: str = ""
    notes: list = field(default_factory=list)


class Graph:
    """Ops of a Net with producer/consumer maps over tensor indices."""

    def __init__(self, net: dict):
        self.ops = net.get("oplists") or []
        self.names = list(net.get("tensorName") or [])
        self.outputs = list(net.get("outputName") or [])
        self.writer = str(net.get("bizCode") or "")
        self.producer: dict[int, int] = {}
        self.consumers: dict[int, list] = {}
        for i, op in enumerate(self.ops):
            for t in _ints(op.get("outputIndexes")):
                self.producer[t] = i
            for t in _ints(op.get("inputIndexes")):
                self.consumers.setdefault(t, []).append(i)
        self.by_name = {n: i for i, n in enumerate(self.names)}

    def ins(self, i: int) -> list:
        return _ints(self.ops[i].get("inputIndexes"))

    def outs(self, i: int) -> list:
        return _ints(self.ops[i].get("outputIndexes"))

    def type(self, i: int) -> str:
        return self.ops[i].get("type", "")

    def main(self, i: int) -> dict:
        return self.ops[i].get("main") or {}

    def desc(self, i: int) -> str:
        return f"op {i} {self.type(i)} '{self.ops[i].get('name', '')}'"

    def back(self, t: int) -> int:
        """The first op producing `t` that is not a view (Reshape, ConvertTensor, ...)."""
        seen = 0
        while True:
            i = self.producer.get(t)
            if i is None:
                raise MnnToolError(f"llm.mnn: tensor {self._tname(t)} has no producer")
            if self.type(i) not in TRANSPARENT:
                return i
            t = self.ins(i)[0]
            seen += 1
            if seen > 64:
                raise MnnToolError("llm.mnn: a cycle of reshapes")

    def fwd(self, t: int) -> list:
        """The ops reading `t` (through views), shape-only readers left out."""
        out, stack = [], [t]
        while stack:
            u = stack.pop()
            for i in self.consumers.get(u, []):
                ty = self.type(i)
                if ty in SHAPE_ONLY:
                    continue
                if ty in TRANSPARENT:
                    if self.ins(i)[0] == u:
                        stack.extend(self.outs(i))
                    continue
                if ty in DATA_INPUTS and self.ins(i)[0] != u:
                    continue            # u is a shape or an index here
                out.append(i)
        return sorted(set(out))

    def _tname(self, t: int) -> str:
        return repr(self.names[t]) if 0 <= t < len(self.names) else str(t)

    # constants
    def const(self, t: int):
        """A Const's values as a numpy array, or None."""
        i = self.producer.get(t)
        if i is None or self.type(i) != "Const":
            return None
        m = self.main(i)
        for key, dt in (("float32s", np.float32), ("int32s", np.int32), ("int64s", np.int64)):
            v = m.get(key)
            if v is not None and len(np.atleast_1d(v)):
                arr = np.asarray(v, dt)
                dims = m.get("dims")
                if dims is not None and len(np.atleast_1d(dims)) and int(np.prod(dims)) == arr.size:
                    arr = arr.reshape([int(d) for d in np.atleast_1d(dims)])
                return arr
        return None

    def scalar(self, t: int) -> float | None:
        v = self.const(t)
        if v is None or v.size != 1 or v.dtype.kind != "f":
            return None
        return float(v.reshape(-1)[0])

    def int_list(self, t: int) -> list | None:
        """An int vector folded as far as constants go: unknown entries None (Concat of Unsqueezed
        scalars and constants, as ONNX exporters build reshape shapes)."""
        v = self.const(t)
        if v is not None:
            return [int(x) for x in np.atleast_1d(v).reshape(-1)]
        i = self.producer.get(t)
        if i is None:
            return None
        ty = self.type(i)
        if ty == "Concat":
            out = []
            for u in self.ins(i):
                part = self.int_list(u)
                if part is None:
                    part = [None]       # an Unsqueezed scalar computed at run time
                out.extend(part)
            return out
        if ty in ("Unsqueeze", "ExpandDims"):
            inner = self.const(self.ins(i)[0])
            return [int(x) for x in np.atleast_1d(inner).reshape(-1)] if inner is not None else [None]
        return None


def _ints(v) -> list:
    if v is None:
        return []
    return [int(x) for x in np.atleast_1d(v).reshape(-1)]


# ---------------------------------------------------------------------------------------------- pieces

def _linear(g: Graph, i: int) -> LinearOp:
    if g.type(i) != "Convolution":
        raise MnnToolError(f"llm.mnn: expected a 1x1 Convolution, found {g.desc(i)}")
    m = g.main(i)
    c = m.get("common") or {}
    if int(c.get("kernelX", 1)) != 1 or int(c.get("kernelY", 1)) != 1 or int(c.get("group", 1)) != 1:
        raise MnnToolError(f"llm.mnn: {g.desc(i)} is not a 1x1 convolution")
    ext = m.get("external")
    if ext is None or len(np.atleast_1d(ext)) < 4:
        raise MnnToolError(f"llm.mnn: {g.desc(i)} has no external weights (inline weights are not read)")
    return LinearOp(g.ops[i].get("name", ""), int(c["outputCount"]), int(c["inputCount"]),
                    tuple(int(x) for x in np.atleast_1d(ext)), dict(m.get("quanParameter") or {}))


def _norm(g: Graph, i: int) -> NormOp:
    if g.type(i) != "LayerNorm":
        raise MnnToolError(f"llm.mnn: expected a LayerNorm, found {g.desc(i)}")
    m = g.main(i)
    ext = m.get("external")
    gamma, beta = m.get("gamma"), m.get("beta")
    return NormOp(g.ops[i].get("name", ""), float(m.get("epsilon", 1e-6)), bool(m.get("useRMSNorm", False)),
                  tuple(int(x) for x in np.atleast_1d(ext)) if ext is not None and len(np.atleast_1d(ext)) else None,
                  None if gamma is None or not len(np.atleast_1d(gamma)) else np.asarray(gamma, np.float32),
                  None if beta is None or not len(np.atleast_1d(beta)) else np.asarray(beta, np.float32))


def _binary_type(g: Graph, i: int) -> str | None:
    return g.main(i).get("opType") if g.type(i) == "BinaryOp" else None


def _unary_type(g: Graph, i: int) -> str | None:
    return g.main(i).get("opType") if g.type(i) == "UnaryOp" else None


def _scalar_side(g: Graph, i: int):
    """(scalar, other input) of a BinaryOp MUL with one scalar float constant, else None."""
    if _binary_type(g, i) != "MUL":
        return None
    a, b = g.ins(i)[:2]
    for s, other in ((a, b), (b, a)):
        v = g.scalar(s)
        if v is not None:
            return v, other
    return None


def _closure(g: Graph, t: int, stop_types=("Convolution", "Attention")) -> set:
    """Ops that `t` depends on along data inputs, stopping at (and including) convolutions, inputs and
    constants."""
    seen, stack = set(), [t]
    visited_t = set()
    while stack:
        u = stack.pop()
        if u in visited_t:
            continue
        visited_t.add(u)
        i = g.producer.get(u)
        if i is None or i in seen:
            continue
        seen.add(i)
        ty = g.type(i)
        if ty in stop_types or ty in ("Input", "Const") or ty in SHAPE_ONLY:
            continue
        ins = g.ins(i)
        idx = DATA_INPUTS.get(ty)
        stack.extend(ins if idx is None else [ins[k] for k in idx if k < len(ins)])
    return seen


def _depends_on(g: Graph, t: int, target_op: int) -> bool:
    return target_op in _closure(g, t)


class _Recogniser:
    def __init__(self, g: Graph, llm_config: dict):
        self.g, self.cfg = g, llm_config
        self.inputs = {}
        for i, op in enumerate(g.ops):
            if op.get("type") == "Input":
                self.inputs[op.get("name")] = i
        for need in ("input_ids", "position_ids"):
            if need not in self.inputs:
                raise MnnToolError(f"llm.mnn: no graph input {need!r} (not an MNN-LLM decoder graph)")

    def head_shape(self, conv_out: int, path: set, oc: int) -> tuple[int, int]:
        """(heads, head_dim) from the 4-D reshape that follows a projection."""
        g = self.g
        conv = g.producer[conv_out]
        for i in sorted(path):
            if g.type(i) != "Reshape" or conv not in _closure(g, g.ins(i)[0]):
                continue
            dims = g.main(i).get("dims")
            dims = [int(x) for x in np.atleast_1d(dims)] if dims is not None and len(np.atleast_1d(dims)) else None
            if dims is None and len(g.ins(i)) > 1:
                dims = g.int_list(g.ins(i)[1])
            if dims is None or len(dims) != 4:
                continue
            h, d = dims[2], dims[3]
            if d is not None and d > 0:
                return (oc // d if h in (None, -1, 0) else h), d
            if h is not None and h > 0:
                return h, oc // h
        raise MnnToolError(f"llm.mnn: cannot tell the head size of the projection with {oc} outputs")

    def qk_path(self, t: int, what: str, layer: int):
        """(conv op, norm op or None, RopeOp or None, scale on the data side, closure) of q or k."""
        g = self.g
        cl = _closure(g, t)
        convs = [i for i in cl if g.type(i) == "Convolution"]
        if len(convs) != 1:
            raise MnnToolError(f"llm.mnn: layer {layer}: the Attention's {what} input comes from "
                               f"{len(convs)} convolutions (expected one)")
        norms = [i for i in cl if g.type(i) == "LayerNorm"]
        if len(norms) > 1:
            raise MnnToolError(f"llm.mnn: layer {layer}: {len(norms)} norms on the {what} path")
        rope = None
        if any(_unary_type(g, i) in ("COS", "SIN") for i in cl):
            freqs = [i for i in cl if g.type(i) == "Const" and g.const(g.outs(i)[0]) is not None
                     and g.const(g.outs(i)[0]).dtype.kind == "f" and g.const(g.outs(i)[0]).size > 1]
            if len(freqs) != 1:
                raise MnnToolError(f"llm.mnn: layer {layer}: RoPE on {what} without one frequency table")
            inv = g.const(g.outs(freqs[0])[0]).reshape(-1).astype(np.float32)
            if not any(_unary_type(g, i) == "NEG" for i in cl):
                raise MnnToolError(f"llm.mnn: layer {layer}: RoPE on {what} is not rotate-half (no NEG)")
            rope = RopeOp(inv, 1.0, 2 * inv.size)
        scale = 1.0
        for i in cl:
            got = _scalar_side(g, i)
            if got is None:
                continue
            v, other = got
            if convs[0] in _closure(g, other):
                scale *= v                      # on the data side: a query (or key) scale
            elif rope is not None and _unary_type(g, g.back(other)) == "COS":
                rope.scaling *= v               # the table's attention factor (the same on cos and sin)
        return convs[0], (norms[0] if norms else None), rope, scale, cl

    def layer(self, att: int) -> LayerPlan:
        g = self.g
        m = g.main(att)
        li = int(m.get("layer_index", 0))
        ins = g.ins(att)
        if len(ins) < 3:
            raise MnnToolError(f"llm.mnn: {g.desc(att)} has {len(ins)} inputs")
        qc, qn, rope, qs, qcl = self.qk_path(ins[0], "query", li)
        kc, kn, krope, ks, kcl = self.qk_path(ins[1], "key", li)
        vc = g.back(ins[2])
        if g.type(vc) != "Convolution":
            raise MnnToolError(f"llm.mnn: layer {li}: the Attention's value input is {g.desc(vc)}")
        if (rope is None) != (krope is None):
            raise MnnToolError(f"llm.mnn: layer {li}: RoPE on only one of query and key")
        if abs(ks - 1.0) > 1e-7:
            qs *= ks        # a scale on k scales the scores just as one on q does
        src = {g.back(g.ins(c)[0]) for c in (qc, kc, vc)}
        if len(src) != 1:
            raise MnnToolError(f"llm.mnn: layer {li}: q, k and v read different inputs")
        in_norm_op = src.pop()
        q, k, v = _linear(g, qc), _linear(g, kc), _linear(g, vc)
        heads, hd = self.head_shape(g.outs(qc)[0], qcl, q.oc)
        kvh, khd = self.head_shape(g.outs(kc)[0], kcl, k.oc)
        if hd != khd or v.oc != kvh * hd or heads % kvh:
            raise MnnToolError(f"llm.mnn: layer {li}: head shapes disagree (q {heads}x{hd}, k {kvh}x{khd}, v {v.oc})")
        sliding = False
        if len(ins) > 3:
            mi = g.back(ins[3])
            if g.type(mi) == "GatherV2":
                idx = g.const(g.ins(mi)[1])
                sliding = idx is not None and int(np.atleast_1d(idx).reshape(-1)[0]) == 1
        lp = LayerPlan(li, _norm(g, in_norm_op), q, k, v, None, heads, kvh, hd,
                       q_norm=_norm(g, qn) if qn is not None else None,
                       k_norm=_norm(g, kn) if kn is not None else None, rope=rope, q_scale=qs,
                       attn_scale=float(m.get("attnScale", 0.0) or 0.0), sliding=sliding)
        if rope is not None and krope is not None and (rope.rotary_dim != krope.rotary_dim
                                                       or not np.allclose(rope.inv_freq, krope.inv_freq)):
            raise MnnToolError(f"llm.mnn: layer {li}: query and key use different RoPE tables")
        if rope is not None and rope.rotary_dim > hd:
            raise MnnToolError(f"llm.mnn: layer {li}: RoPE over {rope.rotary_dim} channels of {hd}")
        # attention output -> o -> [norm] -> residual add
        o = self._one(g.fwd(g.outs(att)[0]), "Convolution", li, "after the Attention")
        lp.o = _linear(g, o)
        prev, nxt = o, self._only(g.fwd(g.outs(o)[0]), li, "after o_proj")
        if g.type(nxt) == "LayerNorm":
            lp.post_attn_norm = _norm(g, nxt)
            prev, nxt = nxt, self._only(g.fwd(g.outs(nxt)[0]), li, "after the post-attention norm")
        if _binary_type(g, nxt) != "ADD":
            raise MnnToolError(f"llm.mnn: layer {li}: {g.desc(nxt)} where the residual add should be")
        r1 = nxt
        # the residual stream input must be what the input norm reads
        a_in = [t for t in g.ins(r1)]
        h_in = [t for t in a_in if g.back(t) != prev]
        if len(h_in) != 1 or g.back(g.ins(in_norm_op)[0]) != g.back(h_in[0]):
            raise MnnToolError(f"llm.mnn: layer {li}: the residual add does not add the layer's input")
        self.layer_in = getattr(self, "layer_in", {})
        self.layer_in[li] = h_in[0]
        r1_readers = g.fwd(g.outs(r1)[0])
        norms = [i for i in r1_readers if g.type(i) == "LayerNorm"]
        if len(norms) != 1:
            raise MnnToolError(f"llm.mnn: layer {li}: {len(norms)} norms read the attention residual")
        lp.ff_norm = _norm(g, norms[0])
        convs = [i for i in g.fwd(g.outs(norms[0])[0]) if g.type(i) == "Convolution"]
        if len(convs) == 2:
            a, b = convs
            ca = self._only(g.fwd(g.outs(a)[0]), li, "after an MLP projection")
            cb = self._only(g.fwd(g.outs(b)[0]), li, "after an MLP projection")
            if ca == cb and _binary_type(g, ca) == "MUL_SILU":
                x0, x1 = g.ins(ca)[:2]
                gate = a if g.back(x1) == a else b
                lp.act, act_op = "silu", ca
            else:
                un = ca if _unary_type(g, ca) else cb
                gate = a if un == ca else b
                act = UNARY_ACT.get(_unary_type(g, un))
                mul = self._only(g.fwd(g.outs(un)[0]), li, "after the MLP activation")
                if act is None or _binary_type(g, mul) != "MUL" or mul != (cb if un == ca else ca):
                    raise MnnToolError(f"llm.mnn: layer {li}: the gated MLP is not MUL_SILU or MUL(act(gate), up) "
                                       f"({g.desc(un)})")
                lp.act, act_op = act, mul
            lp.gate, lp.up = _linear(g, gate), _linear(g, b if gate == a else a)
        elif len(convs) == 1:
            un = self._only(g.fwd(g.outs(convs[0])[0]), li, "after the MLP projection")
            act = UNARY_ACT.get(_unary_type(g, un))
            if act is None:
                raise MnnToolError(f"llm.mnn: layer {li}: MLP activation {g.desc(un)} is not supported")
            lp.up, lp.act, act_op = _linear(g, convs[0]), act, un
        else:
            raise MnnToolError(f"llm.mnn: layer {li}: {len(convs)} convolutions read the MLP norm")
        down = self._one(g.fwd(g.outs(act_op)[0]), "Convolution", li, "after the MLP activation")
        lp.down = _linear(g, down)
        nxt = self._only(g.fwd(g.outs(down)[0]), li, "after down_proj")
        if g.type(nxt) == "LayerNorm":
            lp.post_ff_norm = _norm(g, nxt)
            nxt = self._only(g.fwd(g.outs(nxt)[0]), li, "after the post-MLP norm")
        if _binary_type(g, nxt) != "ADD" or g.back(g.outs(r1)[0]) not in [g.back(t) for t in g.ins(nxt)]:
            raise MnnToolError(f"llm.mnn: layer {li}: the MLP's residual add is not found ({g.desc(nxt)})")
        self.layer_out = getattr(self, "layer_out", {})
        self.layer_out[li] = g.outs(nxt)[0]
        return lp

    def _only(self, ops: list, li: int, where: str) -> int:
        if len(ops) != 1:
            what = ", ".join(self.g.desc(i) for i in ops[:4]) or "nothing"
            raise MnnToolError(f"llm.mnn: layer {li}: {where}: expected one op, found {what}")
        return ops[0]

    def _one(self, ops: list, ty: str, li: int, where: str) -> int:
        i = self._only(ops, li, where)
        if self.g.type(i) != ty:
            raise MnnToolError(f"llm.mnn: layer {li}: {where}: expected {ty}, found {self.g.desc(i)}")
        return i

    def prologue(self, t: int):
        """(embedding scale, position table or None) from layer 0's input back to input_ids."""
        g = self.g
        scale, positions = 1.0, None
        for _ in range(16):
            i = g.back(t)
            if i == self.inputs["input_ids"]:
                return scale, positions
            s = _scalar_side(g, i)
            if s is not None:
                scale *= s[0]
                t = s[1]
                continue
            if _binary_type(g, i) == "ADD":
                a, b = g.ins(i)[:2]
                for gather, other in ((a, b), (b, a)):
                    gi = g.back(gather)
                    if g.type(gi) == "GatherV2":
                        table = g.const(g.ins(gi)[0])
                        if table is not None and table.ndim == 2:
                            positions = table.astype(np.float32)
                            t = other
                            break
                else:
                    raise MnnToolError(f"llm.mnn: {g.desc(i)} between input_ids and the first layer")
                continue
            raise MnnToolError(f"llm.mnn: {g.desc(i)} between input_ids and the first layer")
        raise MnnToolError("llm.mnn: input_ids does not reach the first layer")

    def tail(self, last_out: int):
        """(final norm, head, softcap) from the logits output back."""
        g = self.g
        if "logits" not in g.by_name:
            raise MnnToolError("llm.mnn: no 'logits' tensor")
        i = g.back(g.by_name["logits"])
        softcap = None
        s = _scalar_side(g, i)
        if s is not None:
            t = g.back(s[1])
            if _unary_type(g, t) == "TANH":
                inner = _scalar_side(g, g.back(g.ins(t)[0]))
                if inner is None or abs(inner[0] * s[0] - 1) > 1e-5:
                    raise MnnToolError("llm.mnn: logits soft-cap of an unexpected form")
                softcap = s[0]
                i = g.back(inner[1])
        if g.type(i) != "Convolution":
            raise MnnToolError(f"llm.mnn: logits come from {g.desc(i)}, not the head's convolution")
        head = _linear(g, i)
        n = g.back(g.ins(i)[0])
        if g.type(n) != "LayerNorm":
            raise MnnToolError(f"llm.mnn: the head reads {g.desc(n)}, not the final norm")
        final = _norm(g, n)
        # the final norm reads the last layer's output, sliced at logits_index
        src = g.back(g.ins(n)[0])
        if g.type(src) == "StridedSlice":
            src = g.back(g.ins(src)[0])
        if src != g.back(last_out):
            raise MnnToolError("llm.mnn: the final norm does not read the last layer's output")
        return final, head, softcap


def recognise(net: dict, llm_config: dict) -> ModelPlan:
    g = Graph(net)
    r = _Recogniser(g, llm_config)
    atts = [i for i in range(len(g.ops)) if g.type(i) == "Attention"]
    if not atts:
        raise MnnToolError("llm.mnn: no Attention op (not an MNN-LLM decoder graph)")
    layers = sorted((r.layer(i) for i in atts), key=lambda lp: lp.index)
    if [lp.index for lp in layers] != list(range(len(layers))):
        raise MnnToolError(f"llm.mnn: layer indices {[lp.index for lp in layers]} are not 0..n-1")
    for a, b in zip(layers, layers[1:]):
        if g.back(r.layer_in[b.index]) != g.back(r.layer_out[a.index]):
            raise MnnToolError(f"llm.mnn: layer {b.index} does not read layer {a.index}'s output")
    embed_scale, positions = r.prologue(r.layer_in[0])
    final, head, softcap = r.tail(r.layer_out[layers[-1].index])
    hidden = layers[0].q.ic
    n_cfg = llm_config.get("layer_nums")
    if n_cfg is not None and int(n_cfg) != len(layers):
        raise MnnToolError(f"llm_config.json: layer_nums {n_cfg}, the graph has {len(layers)} layers")
    if llm_config.get("hidden_size") not in (None, hidden):
        raise MnnToolError(f"llm_config.json: hidden_size {llm_config['hidden_size']}, the graph's is {hidden}")
    return ModelPlan(hidden=hidden, vocab=head.oc, layers=layers, final_norm=final, head=head,
                     embed_scale=embed_scale, positions=positions, softcap=softcap, writer=g.writer)


def read_plan(path, llm_config: dict) -> ModelPlan:
    with open(path, "rb") as f:
        buf = f.read()
    try:
        net = decode(buf, "Net")
    except Exception as e:     # FormatError and friends: one line
        raise MnnToolError(f"{path}: not a readable MNN graph ({e})") from None
    return recognise(net, llm_config)
