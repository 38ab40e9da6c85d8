"""PoolFormer's and EfficientFormer's token mixer as one PoolMixer step (kernels/ops/pool_mixer.py):
a float32 stride-1 k x k average Pooling padded to the same size (k odd), the Sub that takes its input
back off (pool(y) - y, or y - pool(y)), and where they follow, the layer scale's Mul by a per-channel
(or scalar) constant and the residual Add: r + s * (pool(y) - y). Four passes over the map were one
slow pool (its window loop) and three elementwise ops: EfficientFormer-L1 spent 3.9 of 34 ms in them
(1 thread, AMD EPYC Zen 4), PoolFormer-S12 more. The ConvertTensors MNN's layout puts around the pool
are views here and are walked through. Not where a tensor on the way is stored on an int8 grid, is a
graph output or has another reader."""
from __future__ import annotations

import numpy as np

from ...ir.graph import Node
from ...ir.ops.nn import pads_of
from .match import fixed_shape, rewriting, rewritten, sole_reader, users_of
from .state import Planning

OPTIONAL = True
STARTS = frozenset({"Pooling"})      # ops a match starts from: without one the stage has nothing to do
MAX_KERNEL = 7


def _same_size_pool(n: Node, shape) -> int | None:
    """k when n is a float stride-1 k x k average pool that keeps the size (k odd, padding k // 2)."""
    prm = n.param
    if n.op != "Pooling" or prm.get("type") != "AVEPOOL" or prm.get("isGlobal") or len(n.inputs) != 1:
        return None
    k = prm.get("kernelX")
    if k != prm.get("kernelY") or not k or k % 2 == 0 or k > MAX_KERNEL or \
            prm.get("strideX") != 1 or prm.get("strideY") != 1 or prm.get("padType", "CAFFE") != "CAFFE":
        return None
    return int(k) if all(v == k // 2 for v in pads_of(prm)) and len(shape) == 4 else None


def _include_padding(n: Node) -> bool:
    count = n.param.get("countType", "DEFAULT")
    return count == "INCLUDE_PADDING" or count == "DEFAULT"     # DEFAULT under CAFFE padding counts it


def _root(t: str, producers: dict) -> str:
    """t before the ConvertTensors (views here) that made it."""
    while (n := producers.get(t)) is not None and n.op == "ConvertTensor" and len(n.inputs) == 1:
        t = n.inputs[0]
    return t


def _binary(n: Node | None, op: str) -> bool:
    return n is not None and n.op == "BinaryOp" and n.param.get("opType") == op and len(n.inputs) == 2 and \
        len(n.outputs) == 1 and not int(n.param.get("activationType", 0) or 0)


def fuse(p: Planning) -> list[Node]:
    nodes, vals, stored = p.nodes, p.vals, p.stored
    # no pool that _same_size_pool takes by its parameters (a rank-4 input: what it asks of the shape): nothing to
    # fuse (a global pool, EfficientNet-B0's: planned at every new input shape, the walk below cost ~0.1 ms)
    if not any(n.op == "Pooling" and _same_size_pool(n, (1, 1, 1, 1)) is not None for n in nodes):
        return nodes
    users = users_of(p)
    producers = {o: n for n in nodes for o in n.outputs}
    outputs = set(p.graph.outputs)
    consts = p.graph.constants

    def float_map(t: str, shape) -> bool:
        return fixed_shape(vals, t) == shape and vals[t].dtype == "float32" and t not in stored

    fused, drop = {}, set()
    for pool in nodes:
        shape = fixed_shape(vals, pool.inputs[0]) if pool.op == "Pooling" and pool.inputs else None
        k = _same_size_pool(pool, shape) if shape else None
        if k is None or not float_map(pool.inputs[0], shape) or not float_map(pool.outputs[0], shape):
            continue
        y = _root(pool.inputs[0], producers)
        chain, t = [pool], pool.outputs[0]
        while (n := sole_reader(users, t, outputs, stored)) is not None and n.op == "ConvertTensor":
            chain.append(n)
            t = n.outputs[0]
        sub = sole_reader(users, t, outputs, stored)
        if not _binary(sub, "SUB") or not float_map(sub.outputs[0], shape):
            continue
        other = sub.inputs[1] if sub.inputs[0] == t else sub.inputs[0]
        if t not in sub.inputs or sub.inputs[0] == sub.inputs[1] or _root(other, producers) != y:
            continue
        sign = 1.0 if sub.inputs[0] == t else -1.0
        chain.append(sub)
        t = sub.outputs[0]
        scale = np.full(shape[1], sign, np.float32)
        mul = sole_reader(users, t, outputs, stored)
        if _binary(mul, "MUL") and float_map(mul.outputs[0], shape):
            c = consts.get(mul.inputs[1] if mul.inputs[0] == t else mul.inputs[0])
            per = _per_channel(c, shape)
            if per is not None and mul.inputs[0] != mul.inputs[1]:
                scale = scale * per
                chain.append(mul)
                t = mul.outputs[0]
        ins, res = [pool.inputs[0]], False
        add = sole_reader(users, t, outputs, stored)
        if _binary(add, "ADD") and float_map(add.outputs[0], shape) and add.inputs[0] != add.inputs[1]:
            r = add.inputs[1] if add.inputs[0] == t else add.inputs[0]
            if float_map(r, shape):
                ins.append(r)
                res = True
                chain.append(add)
                t = add.outputs[0]
        param = {"k": k, "include": _include_padding(pool), "scale": scale, "sub": 1.0, "res": res}
        name = f"{pool.name} (+{', '.join(n.name for n in chain[1:] if n.op != 'ConvertTensor')})"
        fused[id(pool)] = Node("PoolMixer", ins, [t], name, param)
        drop.update(id(n) for n in chain[1:])
    return rewritten(nodes, fused, drop)


def _per_channel(c, shape) -> np.ndarray | None:
    """A float constant broadcast over (N, C, H, W) one value a channel (or one in all): its C values."""
    if c is None:
        return None
    a = np.asarray(c)
    if a.dtype != np.float32 or a.ndim > 4:
        return None
    if a.size == 1:
        return np.full(shape[1], a.reshape(-1)[0], np.float32)
    full = (1,) * (4 - a.ndim) + a.shape
    if full != (1, shape[1], 1, 1):
        return None
    return a.reshape(-1).astype(np.float32)


run = rewriting(fuse)
